"""Incremental Server-Sent-Events framing: bytes in, event ``data`` payloads out.

This is the first step of the hot path (read chunk -> timestamp -> count tokens), so
it works on ``bytes`` with C-level searches and never loops over bytes in Python or
decodes text: a read may end anywhere, including inside a UTF-8 character, and only
whole events are ever handed on.

Framing follows the WHATWG SSE spec, because vendors differ on every detail of it:
LF, CRLF or lone CR line ends (a CRLF may be split across two reads), ``:`` comment
lines (``: keep-alive``), ``data:`` with or without its single leading space,
multi-line ``data`` joined with LF, other fields (``event``, ``id``, ``retry``)
ignored, a leading UTF-8 BOM dropped, and an event with no ``data`` line dispatching
nothing. At end of stream an unterminated final event is still delivered, because
servers do end like that.

How it works: CRs are rewritten to LF as bytes arrive (in SSE a CR is only ever a
line end), so the buffer only holds LF-separated lines. The buffer always starts at
the start of an event, so every event boundary is a ``b"\\n\\n"``. A read that is a
whole number of one-line ``data:`` events (the usual read) is cut into payloads by
one ``split`` on ``b"\\n\\ndata: "``; a check that no payload holds a line end proves
the cut matches the general line-by-line reading, which handles everything else.
"""

from __future__ import annotations

__all__ = ["BadStream", "SSEError", "SSEParser"]

_BOM = b"\xef\xbb\xbf"
_SEP_SPACE = b"\n\ndata: "
_SEP_BARE = b"\n\ndata:"


class BadStream(Exception):
    """The response body is not a stream we can interpret (framing or content)."""


class SSEError(BadStream):
    """SSE framing problem, e.g. an event (or an unterminated line) over the size cap."""


class SSEParser:
    """Incremental SSE parser; ``feed`` bytes as they arrive, ``close`` at end of body.

    Memory is bounded: an event (or a line still waiting for its end) longer than
    ``max_event_bytes`` raises ``SSEError`` instead of growing the buffer, because an
    endpoint that never sends a line end must not exhaust the client. An event's size
    is the bytes of its lines after CR/CRLF became LF, without the closing blank line;
    measured so, whether a stream raises does not depend on how it was split.

    ``idle`` is True while no partial event is held, so the next read starts at an
    event boundary; a caller may then recognise a read that is exactly one known
    event without feeding it here (``StreamTally`` does).
    """

    __slots__ = ("_buf", "_cr", "_max", "_start", "idle")

    def __init__(self, max_event_bytes: int = 1 << 20) -> None:
        if max_event_bytes < 1:
            raise ValueError("max_event_bytes must be >= 1")
        self._max = max_event_bytes
        self._buf = b""  # LF-normalised bytes of the event in progress, no leading LF
        self._cr = False  # last byte fed was a CR: a LF right after it is its pair
        self._start = True  # nothing but (part of) a BOM seen yet
        # True when no partial event is held (the next read starts at an event): the
        # fast paths here and in StreamTally may then read a whole event directly.
        self.idle = False

    def feed(self, data: bytes) -> list[bytes]:
        """Return the data payloads of the events that ``data`` completes."""
        if self.idle and data[-2:] == b"\n\n":
            if data[:6] == b"data: ":
                payload = data[6:-2]  # one single-line event, the usual read
                if 10 not in payload and 13 not in payload and len(payload) + 6 <= self._max:
                    return [payload]
            if 13 not in data:
                return self._events(data, len(data) - 2)
        return self._feed(data)

    def _feed(self, data: bytes) -> list[bytes]:
        """The general case: pending bytes, CRs, the stream start, partial events."""
        if not data:
            return []
        if self._cr:
            self._cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if 13 in data:
            self._cr = data[-1] == 13
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        old = len(self._buf)
        buf = self._buf + data if old else data
        if self._start:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._buf = buf
                return []
            self._start = False
            if buf[:3] == _BOM:
                buf = buf[3:]
                old = max(old - 3, 0)
        if not old and buf[:1] == b"\n":
            buf = buf.lstrip(b"\n")  # blank lines before an event dispatch nothing
        # Only bytes new in this read can complete an event: search from there, so
        # an event arriving in many small reads is not rescanned from its start.
        end = buf.rfind(b"\n\n", old - 1 if old else 0)
        if end < 0:
            if len(buf) > self._max and len(buf) - (buf[-1:] == b"\n") > self._max:
                raise self._too_big()
            self._buf = buf
            self.idle = not buf and not self._cr
            return []
        rest = buf[end + 2 :]
        if rest[:1] == b"\n":
            rest = rest.lstrip(b"\n")
        if len(rest) > self._max and len(rest) - (rest[-1:] == b"\n") > self._max:
            raise self._too_big()
        self._buf = rest
        self.idle = not rest and not self._cr
        return self._events(buf, end)

    def _events(self, buf: bytes, end: int) -> list[bytes]:
        """Payloads of the whole events in ``buf[:end]`` (``end`` is at their last
        blank line; ``buf`` starts at an event, possibly after blank lines)."""
        if buf[:5] == b"data:":
            if buf[5:6] == b" ":
                parts = buf[6:end].split(_SEP_SPACE)
                bare = False
            else:
                parts = buf[5:end].split(_SEP_BARE)
                bare = True
            for part in parts:
                if 10 in part or (bare and part[:1] == b" "):
                    break  # not all one-line events in one style: read line by line
            else:
                if end > self._max:
                    extra = 5 if bare else 6
                    for part in parts:
                        if len(part) + extra > self._max:
                            raise self._too_big()
                return parts
        out: list[bytes] = []
        for block in buf[:end].split(b"\n\n"):
            if len(block) > self._max and len(block.strip(b"\n")) > self._max:
                raise self._too_big()
            payload = _parse_block(block)
            if payload is not None:
                out.append(payload)
        return out

    def close(self) -> list[bytes]:
        """End of stream: deliver a final event that lacked its closing blank line.

        A partial last line counts as a complete line. The parser is reset, so it
        could be reused for a new stream.
        """
        block = self._buf
        self._buf = b""
        self._cr = False
        self._start = True
        self.idle = False
        if block.endswith(b"\n"):
            block = block[:-1]
        if not block:
            return []
        if len(block) > self._max:
            raise self._too_big()
        payload = _parse_block(block)
        return [] if payload is None else [payload]

    def _too_big(self) -> SSEError:
        return SSEError(f"SSE event or line longer than {self._max} bytes")


def _parse_block(block: bytes) -> bytes | None:
    """The data payload of one event's lines (LF-separated, no blank line inside).

    The general case: comments, other fields, ``data:`` without a space, several data
    lines. Returns None when the event has no data line (it dispatches nothing).
    """
    data: list[bytes] | None = None
    for line in block.split(b"\n"):
        if not line or line[:1] == b":":
            continue
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            if data is None:
                data = [value]
            else:
                data.append(value)
    if data is None:
        return None
    return data[0] if len(data) == 1 else b"\n".join(data)
