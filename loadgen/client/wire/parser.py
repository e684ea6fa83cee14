"""An HTTP/1.1 response parser: the head, then the body by its framing, every buffer bounded.

I/O-free and clock-free: ``feed(data, t)`` takes each read as it came off the socket (and its
arrival time, passed through) and calls the sink's ``head`` once the head is whole,
``on_body(piece, t)`` with the body the read holds (a chunked body's payload, framing removed:
the whole chunks of one read as one piece, so the stream's reader frames a burst of events at
once; a chunk cut by the read's end in its parts), and the sink's ``end`` when the body is
complete. The sink sets ``on_body`` from ``head``, so a 200 body goes straight to the stream's
reader, never into a buffer here. The usual read, one whole chunk holding one SSE event, costs a
size-line lookup and one slice (``_chunks``).

Framing (RFC 9112 section 6.3): a 1xx head is skipped, and 204 / 304 have no body; else
``Transfer-Encoding: chunked`` (chunk extensions ignored, trailers read and dropped), else
``Content-Length``, else the body runs until the server closes (``until_close``; ``eof()``
then ends it). What is bounded, and what it raises past the bound (``ParseError``): the head
(``MAX_HEAD_BYTES``) and each of its lines (``MAX_LINE_BYTES``, aiohttp's 8190), a chunk-size
line (``MAX_CHUNK_LINE_BYTES``) and the trailers (``MAX_HEAD_BYTES``). A 200 body is not
capped here: it is handed on as it comes, never kept (the SSE parser caps an event); the
transport caps an error body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["ParseError", "ResponseParser", "Sink", "MAX_HEAD_BYTES", "MAX_LINE_BYTES", "MAX_CHUNK_LINE_BYTES"]

MAX_HEAD_BYTES = 64 * 1024  # a status line and its headers (and, apart, a chunked body's trailers)
MAX_LINE_BYTES = 8190  # one header line, as aiohttp bounds it
MAX_CHUNK_LINE_BYTES = 1024  # a chunk's size in hex and its extensions

# states
_HEAD, _LENGTH, _SIZE, _DATA, _CRLF, _TRAILERS, _CLOSE, _DONE = range(8)
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_HEX = frozenset(_HEX_DIGITS)


_SIZES: dict[bytes, int] = {}  # chunk-size lines seen, as numbers: an SSE stream repeats a few sizes


def _size_of(line: bytes) -> int | None:
    """A chunk-size line of hex digits only as its number (kept in ``_SIZES``, bounded), else None."""
    if not line or line.lstrip(_HEX_DIGITS):
        return None
    size = int(line, 16)
    if size and len(_SIZES) < 4096:  # (never 0: the fast check in ``_chunks`` relies on it)
        _SIZES[line] = size
    return size


# heads parsed (status, version, headers, keep-alive): a server repeats its own. Their headers
# dicts are shared by every answer with that head: read, never written.
_HEADS: dict[bytes, tuple[int, bytes, dict[str, str], bool]] = {}
_KEPT_HEADS = 256  # distinct heads kept (emptied when full: a Date header makes a new one each second)


class ParseError(ValueError):
    """The answer is not HTTP/1.1 as it must be; ``in_body``: it went wrong after a whole head."""

    def __init__(self, message: str, in_body: bool) -> None:
        super().__init__(message)
        self.in_body = in_body


class Sink(Protocol):
    """Where a parsed answer goes."""

    def head(self, status: int, headers: dict[str, str]) -> None:
        """The answer's head is whole (the sink sets the parser's ``on_body`` here)."""
        ...

    def end(self) -> None: ...


def _nowhere(data: bytes, t: int) -> None:
    pass


class ResponseParser:
    """Parses the answers on one connection, one at a time (``expect`` before each)."""

    __slots__ = (
        "sink",
        "on_body",
        "state",
        "status",
        "version",
        "headers",
        "keep_alive",
        "received",
        "_buf",
        "_left",
        "_scan",
    )

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.on_body: Callable[[bytes, int], None] = _nowhere  # each piece of body, with the read's time
        self.state = _DONE
        self.status = 0
        self.version = b""
        self.headers: dict[str, str] = {}
        self.keep_alive = False  # after the answer ends, the connection may carry another request
        self.received = 0  # bytes of this answer so far (0: none came: the request may be resent)
        self._buf = b""  # a head, size line or CRLF not yet whole
        self._left = 0  # body bytes owed (Content-Length) or bytes of the current chunk
        self._scan = 0  # where the head's blank line may start (each read is searched once)

    def expect(self) -> None:
        """Get ready for the next answer on the connection."""
        self.on_body = _nowhere
        self.state, self.status, self.version, self.headers = _HEAD, 0, b"", {}
        self.keep_alive, self.received, self._buf, self._left, self._scan = False, 0, b"", 0, 0

    @property
    def done(self) -> bool:
        return self.state == _DONE

    @property
    def in_head(self) -> bool:
        return self.state == _HEAD

    @property
    def until_close(self) -> bool:
        """The body ends when the connection does (no length, not chunked)."""
        return self.state == _CLOSE

    def feed(self, data: bytes, t: int = 0) -> bytes:
        """Parse one read (``t``: its time, passed to ``on_body``); the bytes after the end of
        the answer (normally none) are returned."""
        self.received += len(data)
        while data:
            state = self.state
            if state == _SIZE:
                data = self._size(data) if self._buf else self._chunks(data, t)
            elif state == _DATA:
                left = self._left
                if len(data) <= left:
                    self._left = left - len(data)
                    self.on_body(data, t)
                    if self._left == 0:
                        self.state = _CRLF
                    return b""
                self.on_body(data[:left], t)
                self._left, self.state, data = 0, _CRLF, data[left:]
            elif state == _CRLF:
                data = self._crlf(data)
            elif state == _HEAD:
                data = self._head(data)
            elif state == _LENGTH:
                left = self._left
                piece, data = (data, b"") if len(data) <= left else (data[:left], data[left:])
                self._left = left - len(piece)
                self.on_body(piece, t)
                if self._left == 0:
                    self._end()
            elif state == _CLOSE:
                self.on_body(data, t)
                return b""
            elif state == _TRAILERS:
                data = self._trailers(data)
            else:  # _DONE: what follows the answer
                return data
        return b""

    def eof(self) -> None:
        """The connection closed: the end of a body that runs until then; else ParseError when
        an answer was under way (how far it got, in the message)."""
        if self.state == _CLOSE:
            self._end()
        elif self.state == _HEAD:
            raise ParseError("the connection closed before the answer's head was whole", in_body=False)
        elif self.state == _LENGTH:
            raise ParseError(f"the connection closed with {self._left} bytes of the body still owed", in_body=True)
        elif self.state != _DONE:
            raise ParseError("the connection closed before the chunked body's last chunk", in_body=True)

    # -- the head ---------------------------------------------------------------------------
    def _head(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        at = buf.find(b"\r\n\r\n", self._scan)
        if at < 0:
            self._check_lines(buf, len(buf))
            if len(buf) > MAX_HEAD_BYTES:
                raise ParseError(f"the answer's head is longer than {MAX_HEAD_BYTES} bytes", in_body=False)
            self._buf, self._scan = buf, max(len(buf) - 3, 0)
            return b""
        if at > MAX_LINE_BYTES:  # (shorter, no line of it can be too long)
            self._check_lines(buf, at)
        if at > MAX_HEAD_BYTES:
            raise ParseError(f"the answer's head is longer than {MAX_HEAD_BYTES} bytes", in_body=False)
        self._buf, self._scan = b"", 0
        rest = buf[at + 4 :]
        self._parse_head(buf[:at])
        return rest

    @staticmethod
    def _check_lines(buf: bytes, end: int) -> None:
        """Each line seen so far (the last one perhaps still growing) within MAX_LINE_BYTES."""
        start = 0
        while start < end:
            nl = buf.find(b"\r\n", start, end)
            stop = end if nl < 0 else nl
            if stop - start > MAX_LINE_BYTES:
                raise ParseError(f"a header line is longer than {MAX_LINE_BYTES} bytes", in_body=False)
            if nl < 0:
                return
            start = nl + 2

    def _parse_head(self, head: bytes) -> None:
        known = _HEADS.get(head)
        if known is None:
            known = self._read_head(head)
            if known[0] < 100 or known[0] >= 200:  # (an interim head is never the answer's)
                if len(_HEADS) >= _KEPT_HEADS:
                    _HEADS.clear()
                _HEADS[head] = known
        status, version, headers, self.keep_alive = known
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return
        self.status, self.version, self.headers = status, version, headers
        self.sink.head(status, headers)
        self._frame(status, headers)

    @staticmethod
    def _read_head(head: bytes) -> tuple[int, bytes, dict[str, str], bool]:
        """The status, version and headers of a whole head, and whether it lets the connection
        carry another request (``ParseError`` if it is not a head). Each
        distinct head is read once (``_HEADS``): an endpoint's answers repeat a few heads, and
        reading one costs ~3 us a request, a lookup ~0.1."""
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        version = parts[0]
        if len(parts) < 2 or version not in (b"HTTP/1.1", b"HTTP/1.0") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise ParseError(f"not an HTTP/1.x status line: {lines[0][:60]!r}", in_body=False)
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise ParseError(f"not a header line: {line[:60]!r}", in_body=False)
            key = name.decode("latin-1").lower()
            text = value.strip().decode("latin-1")
            if key in headers:
                if key == "content-length" and headers[key] != text:
                    raise ParseError("two different Content-Length headers", in_body=False)
                headers[key] = f"{headers[key]}, {text}"
            else:
                headers[key] = text
        conn = headers.get("connection", "").lower()
        keep_alive = ("close" not in conn) if version == b"HTTP/1.1" else ("keep-alive" in conn)
        return status, version, headers, keep_alive

    def _frame(self, status: int, headers: dict[str, str]) -> None:
        coding = headers.get("transfer-encoding")
        if status in (204, 304):
            self._end()
        elif coding is not None:
            if coding.rsplit(",", 1)[-1].strip().lower() != "chunked":
                self.state, self.keep_alive = _CLOSE, False  # RFC 9112 6.3: read until the close
            else:
                self.state = _SIZE
        elif "content-length" in headers:
            text = headers["content-length"]
            if not text.isdigit() or len(text) > 18:
                raise ParseError(f"Content-Length {text[:40]!r} is not a length", in_body=False)
            self._left = int(text)
            if self._left == 0:
                self._end()
            else:
                self.state = _LENGTH
        else:
            self.state, self.keep_alive = _CLOSE, False

    # -- a chunked body -------------------------------------------------------------------
    def _chunks(self, data: bytes, t: int) -> bytes:
        """The usual reads: whole chunks, one after another (one SSE event each, or a burst of
        them), found by index (the rest of the read is not copied per chunk) and handed on as
        one piece; what is left (a chunk cut by the read's end, the last chunk) goes the careful
        way (``_size``)."""
        nl = data.find(b"\r\n", 0, 18)
        size = _SIZES.get(data[:nl]) if nl > 0 else None
        if size is not None and len(data) == nl + 4 + size and data.endswith(b"\r\n"):  # one whole chunk
            self.on_body(data[nl + 2 : nl + 2 + size], t)
            return b""
        if data.endswith(b"\r\n"):  # whole chunks only, most likely: checked all at once, in C
            # (an answer's last read ends with the last chunk and no trailers: checked apart)
            last = len(data) > 7 and data.endswith(b"\r\n0\r\n\r\n")
            parts = (data[:-5] if last else data).split(b"\r\n")  # size, payload, ..., b""
            if len(parts) & 1:
                payloads = parts[1::2]
                # each size line one seen before (the last chunk's "0" never is) and each
                # payload of that length (one holding a CRLF is not: the careful way); so
                # what was cut off as the last chunk did follow the last whole chunk
                if list(map(_SIZES.get, parts[0:-1:2])) == list(map(len, payloads)):
                    self.on_body(payloads[0] if len(payloads) == 1 else b"".join(payloads), t)
                    if last:
                        self._end()
                    return b""
        pos, n, pieces = 0, len(data), []
        while True:
            nl = data.find(b"\r\n", pos, pos + 18)
            if nl <= pos:
                break
            size = _SIZES.get(data[pos:nl])
            if size is None:
                size = _size_of(data[pos:nl])
                if size is None:  # not hex digits only (an extension, a sign, a space...)
                    break
            start = nl + 2
            end = start + size
            if end == start or end + 2 > n or not data.startswith(b"\r\n", end):
                break
            pieces.append(data[start:end])
            pos = end + 2
            if pos == n:
                break
        if pieces:  # one piece per read, however many chunks it held: the reader frames them at once
            self.on_body(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)
            if pos == n:
                return b""
        return self._size(data[pos:] if pos else data)

    def _size(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        nl = buf.find(b"\r\n", 0, MAX_CHUNK_LINE_BYTES + 2)
        if nl < 0:
            if len(buf) > MAX_CHUNK_LINE_BYTES:
                raise ParseError(f"a chunk-size line longer than {MAX_CHUNK_LINE_BYTES} bytes", in_body=True)
            if b"\n" in buf:  # a bare LF, or a CR inside the line
                raise ParseError(f"bad chunk-size line {buf[:40]!r}", in_body=True)
            self._buf = buf
            return b""
        self._buf = b""
        line = buf[:nl]
        size = line.partition(b";")[0].strip(b" \t")
        if not size or len(size) > 15 or not _HEX.issuperset(size):
            raise ParseError(f"bad chunk size {line[:40]!r}", in_body=True)
        n = int(size, 16)
        if n == 0:
            self.state = _TRAILERS
        else:
            self._left, self.state = n, _DATA
        return buf[nl + 2 :]

    def _crlf(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        if len(buf) < 2:
            if buf != b"\r":
                raise ParseError("a chunk not followed by CRLF", in_body=True)
            self._buf = buf
            return b""
        if not buf.startswith(b"\r\n"):
            raise ParseError("a chunk not followed by CRLF", in_body=True)
        self._buf, self.state = b"", _SIZE
        return buf[2:]

    def _trailers(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        if buf.startswith(b"\r\n"):  # no trailers: the usual end
            self._buf = b""
            self._end()
            return buf[2:]
        at = buf.find(b"\r\n\r\n")
        if at < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise ParseError(f"trailers longer than {MAX_HEAD_BYTES} bytes", in_body=True)
            if buf != b"\r":
                self._check_trailer_lines(buf)
            self._buf = buf
            return b""
        self._buf = b""
        self._end()
        return buf[at + 4 :]

    @staticmethod
    def _check_trailer_lines(buf: bytes) -> None:
        try:
            ResponseParser._check_lines(buf, len(buf))
        except ParseError as e:
            raise ParseError(str(e).replace("header", "trailer"), in_body=True) from None

    def _end(self) -> None:
        self.state = _DONE
        self.sink.end()
