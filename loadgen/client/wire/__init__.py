"""The lean wire: loadgen's own HTTP/1.1 client for the measured stream, behind the engine's
transport seam (client/transport.py), on the event loop (uvloop where installed), with no
third-party internals.

- ``choice``: which transport a run sends through (``--transport lean|aiohttp``; aiohttp where
  an HTTP(S) proxy applies), and what run.json says of it;
- ``transport``: ``LeanTransport``, an exchange from the pool's connection to its answer (holds,
  the stale keep-alive resend, cancellation);
- ``pool``: the keep-alive connections to one endpoint, at most a run's limit, plain or TLS;
- ``connection``: one connection's ``Protocol``, where each read is stamped and handed on;
- ``request``: a request's bytes, the run's headers encoded once;
- ``parser``: the response parser (head, chunked and length-framed bodies), bounded, I/O-free.

aiohttp stays for everything that is not the measured stream (preflight, ``/metrics`` scraping,
``check``'s exchanges, the simulator's server) and as the fallback transport.
"""
