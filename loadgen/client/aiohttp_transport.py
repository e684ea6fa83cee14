"""The engine's transport over aiohttp: a ``Transport`` (see transport.py).

Every aiohttp setting is chosen for load rather than left at aiohttp's defaults (which cap
connections at 100, time out at 300 s and decompress). Requests ask for an uncompressed answer
(the engine sends ``Accept-Encoding: identity``, which replaces aiohttp's own ``gzip, deflate``);
an answer compressed anyway is not decoded but reported as exactly that (``bad_stream``), so the
stream's bytes are read as they come, on the fast path, or not at all. A body that is not 200
is read up to ``ERROR_BODY_BYTES``. The aiohttp internals that make
timing precise and cheap (stamping reads in the protocol, holding a prepared request to its
instant) live in ``_aiohttp.py``; this module uses aiohttp's public API, and falls back to it
entirely when ``_aiohttp.fast_path`` says those internals do not fit the installed aiohttp.
How it reaches the endpoint (TLS, the environment's proxy) is the run's ``EndpointOptions``;
the proxy is resolved once, at construction, not per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import aiohttp
from yarl import URL

from loadgen.client._aiohttp import Call, answer_arrived, install, read_body, release, request_class
from loadgen.client._aiohttp_fit import fast_path
from loadgen.client.endpoint_options import EndpointOptions
from loadgen.client.transport import Exchange, FastPath, Holds, OnRead, WireError, compressed
from loadgen.clock import Clock

__all__ = ["AiohttpTransport"]

_STALE_RETRIES = 64  # each failed try drops one dead pooled connection; a fresh one ends it
ERROR_BODY_BYTES = 64 * 1024  # of an answer that is not 200, this much is read (it is an error message)
_IDENTITY = ("", "identity")


class AiohttpTransport:
    """Sends each exchange to ``url`` over a keep-alive pool; one run at a time."""

    def __init__(
        self, url: str, *, connect_timeout_s: float, read_bufsize: int, http: EndpointOptions | None = None
    ) -> None:
        self._url = URL(url)  # parsed once, not per request (its query, ?api-version=..., kept)
        self._options = http if http is not None else EndpointOptions()
        self._proxy = self._options.request_kwargs(url)  # {} or the proxy (and its credentials)
        self._connect_s = connect_timeout_s
        self._bufsize = read_bufsize
        self._calls: dict[int, Call] = {}  # requests in flight, by sequence number (their X-Loadgen-Seq)
        self._fast = False
        self._clock: Clock = lambda: 0
        self._http: aiohttp.ClientSession | None = None

    @asynccontextmanager
    async def open(self, clock: Clock, holds: Holds, connections: int) -> AsyncIterator[FastPath]:
        connector = aiohttp.TCPConnector(
            limit=connections,
            limit_per_host=0,
            force_close=False,
            enable_cleanup_closed=False,
            ttl_dns_cache=None,
            ssl=self._options.ssl_context(),
        )
        fit = fast_path(connector)
        self._fast, self._clock = fit.ok, clock
        if fit.ok:
            install(connector, clock, holds)
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_connect=self._connect_s, sock_read=None),
            cookie_jar=aiohttp.DummyCookieJar(),  # independent users: no cookie carried from one to another
            read_bufsize=self._bufsize,
            request_class=request_class(self._calls, clock, holds) if fit.ok else aiohttp.ClientRequest,
            trace_configs=None if fit.ok else [_reuse_tracing()],
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        ) as http:
            self._http = http
            try:
                yield fit
            finally:
                self._http = None

    async def exchange(self, ex: Exchange, on_read: OnRead) -> None:
        call = self._calls[ex.seq] = Call(ex)
        try:
            async with await self._post(call) as resp:
                ex.t_headers = answer_arrived(resp.content) or self._clock()
                ex.status, ex.content_type = resp.status, resp.content_type
                encoding = resp.headers.get("Content-Encoding", "identity")
                if encoding.strip().lower() not in _IDENTITY:  # asked for none: its bytes are not the stream
                    release(resp.content)
                    resp.close()  # the rest of it never reaches a pooled connection
                    if resp.status == 200:
                        raise WireError("bad_stream", compressed(encoding))
                    ex.error = f"(a body compressed with Content-Encoding: {encoding})".encode()
                    return
                if resp.status != 200:
                    ex.retry_after = resp.headers.get("Retry-After")
                    ex.error = await _capped(resp.content, ERROR_BODY_BYTES)
                    return
                await read_body(resp.content, on_read, self._clock)
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
            raise WireError("disconnected", f"{type(e).__name__}: {e}") from e
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as e:
            raise WireError("timeout", f"{type(e).__name__}: {e}") from e
        except aiohttp.ClientConnectionError as e:
            raise WireError("disconnected", f"{type(e).__name__}: {e}") from e
        except aiohttp.ClientError as e:
            raise WireError("client_error", f"{type(e).__name__}: {e}") from e
        finally:
            del self._calls[ex.seq]

    async def _post(self, call: Call) -> aiohttp.ClientResponse:
        """POST; again whenever it failed on a reused keep-alive connection before any answer.

        A server may close an idle connection just as it is taken from the pool (llama.cpp
        closes after every streamed answer while advertising keep-alive): the request then
        never reached it, so sending it again is not a duplicate. Each such try drops one
        dead pooled connection; a failure on a fresh connection, or after the answer began,
        is never retried (it is the endpoint's and is recorded).
        """
        assert self._http is not None, "exchange() outside open()"
        ex = call.ex
        for _ in range(_STALE_RETRIES):
            call.reused = False
            if not self._fast:
                ex.t_sent = self._clock()  # the plain way: as it is handed to aiohttp
            try:
                return await self._http.post(
                    self._url, data=ex.body, headers=ex.headers, trace_request_ctx=call, **self._proxy
                )
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
                if not call.reused:
                    raise
        raise aiohttp.ClientOSError(f"{_STALE_RETRIES} pooled connections in a row were closed under the request")


async def _capped(content: aiohttp.StreamReader, cap: int) -> bytes:
    """The body's first ``cap`` bytes (all of it, if shorter): never an unbounded read."""
    parts: list[bytes] = []
    size = 0
    while size < cap:
        data = await content.read(cap - size)
        if not data:
            break
        parts.append(data)
        size += len(data)
    return b"".join(parts)


def _reuse_tracing() -> aiohttp.TraceConfig:
    """The plain way to learn that a request was given a reused connection: aiohttp's public
    tracing (slower than the fast path's ``ClientRequest.send`` override, but always there)."""

    async def reused(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
        call = ctx.trace_request_ctx
        if isinstance(call, Call):
            call.reused = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(reused)
    return trace
