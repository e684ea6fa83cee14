"""The wire side of the hostile endpoint (tests/hostile.py): a request as read, a response
written byte by byte under a cap, and the pieces a well-formed answer is made of.

Everything here writes raw HTTP/1.x bytes, so a behaviour can send what no well-behaved
server library would let it (a status line of escapes, a 1 MiB header, a broken chunk).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import struct
import time
from typing import Any, NamedTuple, TypedDict
from urllib.parse import quote

import orjson

__all__ = [
    "CAP_BYTES",
    "CAP_S",
    "GAP_S",
    "HOSTILE_HEADER",
    "HOSTILE_TEXT",
    "Capped",
    "Request",
    "Response",
    "Served",
    "echo_forms",
    "echo_text",
    "error_json",
    "make_chunk",
    "make_usage",
    "normal_stream",
    "usage_chunk",
]

# Control characters, ANSI escapes (colour, clear screen, window title), bidi overrides, a
# NUL, a backspace and markup: what a string an endpoint sends may hold. No CR or LF, so the
# same text can go into a header value and a status line.
HOSTILE_TEXT = (
    "\x1b[31m\x1b[2J\x1b]0;pwned\x07<script>alert('x')</script>"
    "<img src=x onerror=alert(1)>\u202egnp.exe\u2066\u200f\x00\x08\x7f&amp;\"'`${x}"
)
HOSTILE_HEADER = HOSTILE_TEXT.replace("\x00", "").encode("utf-8")
CAP_BYTES = 64 * 1024 * 1024
CAP_S = 20.0
GAP_S = 0.005  # between the chunks of a normal stream
_MAX_TOKENS = 32  # chunks of a normal stream, at most


class Served(TypedDict):
    """One request as the server saw it (a connection, for connection-level behaviours)."""

    id: int
    conn: int
    port: int
    t_wall_ns: int  # time.time_ns() when the request head arrived
    t_ns: int  # perf_counter_ns() at the same moment
    behaviour: str
    route: str  # chat | completions | models | metrics | connect | other
    method: str
    path: str  # without the query
    target: str  # the request target as received: path and query (secrets intact)
    headers: list[tuple[str, str]]  # as received, in order, secrets intact
    body_bytes: int
    model: str | None
    bytes_sent: int
    end: str | None  # None while in progress
    t_end_wall_ns: int | None


class Capped(Exception):
    """The response reached ``cap_bytes``."""


class Request(NamedTuple):
    method: str
    path: str  # without the query
    route: str
    headers: list[tuple[str, str]]
    body: dict[str, Any] | None
    target: str = ""  # path and query, as received

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    @property
    def model(self) -> str:
        m = self.body.get("model") if self.body else None
        return m if isinstance(m, str) else "hostile"

    @property
    def tokens(self) -> int:
        body = self.body or {}
        n = body.get("max_tokens", body.get("max_completion_tokens", 8))
        return max(1, min(int(n), _MAX_TOKENS)) if isinstance(n, int) else 8


class Response:
    """The response side of one connection: counts bytes, stops at the cap."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cap: int, entry: Served) -> None:
        self.reader = reader
        self.writer = writer
        self.cap = cap
        self.entry = entry
        self.keep_alive = True  # the connection may serve another request after this one

    async def raw(self, data: bytes) -> None:
        room = self.cap - self.entry["bytes_sent"]
        if len(data) >= room:
            data = data[: max(room, 0)]
        self.writer.write(data)
        self.entry["bytes_sent"] += len(data)
        await self.writer.drain()
        if self.entry["bytes_sent"] >= self.cap:
            raise Capped

    async def head(
        self,
        status: int = 200,
        headers: tuple[tuple[str, bytes | str], ...] = (),
        *,
        content_type: str = "text/event-stream",
        chunked: bool = True,
        reason: bytes = b"",
        version: bytes = b"HTTP/1.1",
    ) -> None:
        lines = [version + b" %d " % status + (reason or _REASONS.get(status, b"Hostile"))]
        lines.append(b"Content-Type: " + content_type.encode())
        if chunked:
            lines.append(b"Transfer-Encoding: chunked")
        for k, v in headers:
            lines.append(k.encode() + b": " + (v.encode("utf-8") if isinstance(v, str) else v))
        await self.raw(b"\r\n".join(lines) + b"\r\n\r\n")

    async def chunk(self, data: bytes) -> None:
        if data:
            await self.raw(b"%x\r\n%s\r\n" % (len(data), data))

    async def end(self) -> None:
        await self.raw(b"0\r\n\r\n")

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        extra = (("Content-Length", str(len(body))), *headers)
        await self.head(status, extra, content_type=content_type, chunked=False)
        await self.raw(body)

    async def events(self, payloads: list[bytes], gap_s: float = GAP_S) -> None:
        """Each payload as one SSE ``data:`` event in its own HTTP chunk."""
        for p in payloads:
            await self.chunk(b"data: " + p + b"\n\n")
            if gap_s:
                await asyncio.sleep(gap_s)

    def close(self, end: str = "closed") -> None:
        self.keep_alive = False
        self.entry["end"] = end
        self.writer.close()

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), not a FIN."""
        self.keep_alive = False
        self.entry["end"] = "reset"
        _reset(self.writer)

    async def wait_close(self, seconds: float) -> bool:
        """Read and drop whatever comes until the client closes (True) or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        with contextlib.suppress(ConnectionError, OSError):
            while (left := deadline - time.monotonic()) > 0:
                try:
                    if not await asyncio.wait_for(self.reader.read(65536), left):
                        return True
                except asyncio.TimeoutError:
                    return False
            return False
        return True


_REASONS = {200: b"OK", 307: b"Temporary Redirect", 401: b"Unauthorized", 404: b"Not Found", 429: b"Too Many Requests"}
_REASONS |= {400: b"Bad Request", 500: b"Internal Server Error"}


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- what a well-formed answer is made of --------------------------------------------------
def make_chunk(req: Request, text: str | None = None, finish: str | None = None, **extra: Any) -> bytes:
    model = extra.pop("model", req.model)
    if req.route == "completions":
        choice: dict[str, Any] = {"index": 0, "text": text or "", "finish_reason": finish}
        obj = {"id": "cmpl-hostile", "object": "text_completion", "created": 0, "model": model, "choices": [choice]}
    else:
        delta = extra.pop("delta", {"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        obj = {"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "created": 0, "model": model}
        obj["choices"] = [choice]
    return orjson.dumps({**obj, **extra})


def make_usage(prompt: Any = 16, completion: Any = 8, cached: Any = None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if isinstance(prompt, int) and isinstance(completion, int):
        usage["total_tokens"] = prompt + completion
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def usage_chunk(usage: dict[str, Any]) -> bytes:
    return orjson.dumps({"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "choices": [], "usage": usage})


def normal_stream(
    req: Request, usage: dict[str, Any] | None = None, finish: str = "length", done: bool = True, **extra: Any
) -> list[bytes]:
    """A normal answer: role chunk, one chunk per token, finish chunk, usage, [DONE]."""
    n = req.tokens
    out = [make_chunk(req, delta={"role": "assistant", "content": ""}, **extra)] if req.route == "chat" else []
    out += [make_chunk(req, f" tok{i}", **extra) for i in range(n)]
    out.append(make_chunk(req, finish=finish, **extra))
    out.append(usage_chunk(usage if usage is not None else make_usage(completion=n)))
    if done:
        out.append(b"[DONE]")
    return out


def echo_forms(value: str) -> dict[str, str]:
    """An Authorization header value as the echo behaviours send it back: raw, URL-encoded, base64."""
    key = value.removeprefix("Bearer ")
    return {
        "raw": value,
        "url": quote(value, safe=""),
        "b64": base64.b64encode(value.encode()).decode(),
        "key-b64": base64.b64encode(key.encode()).decode(),
        "key-b64url": base64.urlsafe_b64encode(key.encode()).decode().rstrip("="),
    }


def echo_text(req: Request) -> str:
    """The request's Authorization header in each form, and its target (a query may carry a key)."""
    auth = req.header("Authorization") or ""
    forms = [f"{k}={v}" for k, v in echo_forms(auth).items()]
    return " ".join([*forms, f"target={req.target}", f"target-url={quote(req.target, safe='')}"])


def error_json(message: str, code: int) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "hostile_error", "code": code}})
