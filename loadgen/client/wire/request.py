"""A request's bytes: the head's fixed part built once per run, each request serialised once.

``RequestHead(url)`` parses the endpoint URL once: where to connect (host, port, TLS), the
request target (path and query, the query's key kept), the ``Host`` header, and the
``Authorization: Basic`` of credentials in the URL's user info (as aiohttp sends them; a header
the run gives wins). ``render(headers, body)`` is the whole request in one ``bytes``, written
with one call. The run's own headers (content type, accept, the key's header, every ``-H``)
are the same on every request: their block is encoded once and kept (``_blocks``, keyed by
the headers themselves); only the per-request ids (``X-Loadgen-Seq``, ``X-Request-Id``) are
encoded per request. No ``User-Agent`` and no ``Connection`` header (HTTP/1.1 keeps alive).
"""

from __future__ import annotations

import base64
from urllib.parse import quote, unquote, urlsplit

from loadgen.client.transport import SEQ_HEADER

__all__ = ["RequestHead"]

_REQUEST_ID = "X-Request-Id"
_PER_REQUEST = frozenset({SEQ_HEADER, _REQUEST_ID})  # the ids: different on every request
_BLOCKS = 64  # distinct fixed blocks kept (one per run, normally)
_SAFE = "/%:@!$&'()*+,;=-._~"  # what a path or query keeps as it is (the rest is percent-encoded)


class RequestHead:
    """Where one endpoint URL's requests go, and how their heads start."""

    __slots__ = ("tls", "host", "port", "target", "_start", "_auth", "_blocks")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or ""
        default = 443 if self.tls else 80
        self.port = parts.port or default
        path = quote(parts.path or "/", safe=_SAFE)
        self.target = f"{path}?{quote(parts.query, safe=_SAFE + '?')}" if parts.query else path
        name = f"[{self.host}]" if ":" in self.host else self.host
        host = name if self.port == default else f"{name}:{self.port}"
        self._start = f"POST {self.target} HTTP/1.1\r\nHost: {host}\r\n".encode()
        self._auth: bytes | None = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            try:
                raw = pair.encode("latin-1")
            except UnicodeEncodeError:
                raw = pair.encode()
            self._auth = b"Authorization: Basic " + base64.b64encode(raw) + b"\r\n"
        self._blocks: dict[tuple[tuple[str, str], ...], bytes] = {}

    def render(self, headers: dict[str, str], body: bytes) -> bytes:
        """The request: its head (``headers`` and the length of ``body``) and ``body``, in one piece."""
        items = tuple(headers.items())
        if len(items) > 1 and items[-2][0] == SEQ_HEADER and items[-1][0] == _REQUEST_ID:
            # the engine's order: the ids last (keys are unique: none of them is among the rest)
            fixed = items[:-2]
            ids = f"{SEQ_HEADER}: {items[-2][1]}\r\n{_REQUEST_ID}: {items[-1][1]}\r\n"
        else:
            fixed = tuple(item for item in items if item[0] not in _PER_REQUEST)
            ids = "".join([f"{k}: {v}\r\n" for k, v in items if k in _PER_REQUEST])
        block = self._blocks.get(fixed)
        if block is None:
            block = self._block(fixed)
        return b"".join((block, ids.encode(), b"Content-Length: %d\r\n\r\n" % len(body), body))

    def _block(self, fixed: tuple[tuple[str, str], ...]) -> bytes:
        lines = "".join(f"{k}: {v}\r\n" for k, v in fixed).encode()
        auth = self._auth if self._auth and not any(k.lower() == "authorization" for k, _ in fixed) else b""
        block = self._start + auth + lines
        if len(self._blocks) < _BLOCKS:
            self._blocks[fixed] = block
        return block
