"""One keep-alive connection: an asyncio ``Protocol`` that carries one exchange at a time.

Where the time is taken: ``data_received`` stamps each read once, as the loop delivers it,
and everything the read holds is handled in that call: the answer's head sets
``t_headers``, status and content type; each piece of a 200 body goes straight to the
exchange's ``on_read`` with that stamp (no buffer, no task woken per read); an error body is
kept up to ``ERROR_BODY_BYTES``. The exchange's task wakes once, when the answer ended or
failed (``done``). A read at or after the hold queue's ``next_due`` sends the held requests
that fell due during it (holds.py).

A connection is reusable only when its answer ended as HTTP says (``reusable``); anything
else (a failure, a cancelled exchange, a capped error body, a compressed answer) closes it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loadgen.client.transport import Exchange, Holds, OnRead, WireError, compressed
from loadgen.client.wire.parser import ParseError, ResponseParser
from loadgen.clock import Clock

__all__ = ["Connection", "ERROR_BODY_BYTES", "Failure"]

ERROR_BODY_BYTES = 64 * 1024  # of an answer that is not 200, this much is kept (it is an error message)
_IDENTITY = ("", "identity")
_NOT_COMPLETE = "Response payload is not completed"  # aiohttp's words for a body cut short, kept


class Failure(Exception):
    """The connection failed under an exchange; ``fresh``: before any byte of its answer (so a
    request on a reused connection may be sent again, transport.py)."""

    def __init__(self, error: BaseException, fresh: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.fresh = fresh


class Connection(asyncio.Protocol):
    """A connection to the endpoint and the exchange it carries (one at a time, HTTP/1.1)."""

    __slots__ = (
        "transport",
        "parser",
        "clock",
        "holds",
        "loop",
        "served",
        "closed",
        "ex",
        "on_read",
        "done",
        "reusable",
        "_t",
        "_error",
        "_lost",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Clock, holds: Holds) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser(self)
        self.clock = clock
        self.holds = holds
        self.loop = loop
        self.served = 0  # exchanges this connection carried before (0: a fresh one)
        self.closed = False  # lost, or closed by us
        self.ex: Exchange | None = None  # the exchange under way
        self.on_read: OnRead | None = None
        self.done: asyncio.Future[None] | None = None  # the exchange's end (or failure)
        self.reusable = False  # its last answer ended cleanly and HTTP lets it carry another
        self._t = 0  # the stamp of the read being parsed
        self._error: list[bytes] = []  # an error body, up to ERROR_BODY_BYTES
        self._lost: BaseException | None = None

    # -- the exchange's side --------------------------------------------------------------------
    def begin(self, ex: Exchange, on_read: OnRead) -> asyncio.Future[None]:
        """Carry ``ex`` next: the answer that comes is its (the caller writes the request)."""
        self.ex, self.on_read, self._error, self.reusable = ex, on_read, [], False
        self.parser.expect()
        done = self.done = self.loop.create_future()
        return done

    def write(self, data: bytes) -> bool:
        """Hand ``data`` to the socket; False when the connection is already gone."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            return False
        transport.write(data)
        return True

    def finish(self) -> None:
        """The exchange is over (ended, failed or cancelled): unless its answer ended cleanly,
        the connection goes (a cancelled one's answer would arrive for the next request)."""
        done = self.done
        if done is not None:
            if not done.done():
                done.cancel()
            elif not done.cancelled():
                done.exception()  # seen here when the exchange raised before awaiting it
        self.ex = self.on_read = self.done = None
        if not self.reusable:
            self.close()
        else:
            self.served += 1

    def close(self) -> None:
        """Closed at once, its unread answer (if any) dropped; TLS too, without a close_notify
        exchange (which would outlive a run whose loop is closing)."""
        self.closed, self.reusable = True, False
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio's side -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport: create_connection's

    def data_received(self, data: bytes) -> None:
        t = self._t = self.clock()
        done = self.done
        if done is None or done.done():  # bytes with no exchange waiting (after an answer, or unasked)
            self.close()
        else:
            try:
                extra = self.parser.feed(data, t)
                if extra and not done.done():
                    self.close()
            except ParseError as e:
                self._fail(_parse_error(e), fresh=False)
            except Exception as e:  # the reader's verdict on the stream (bad SSE, an error event)
                self._fail(e, fresh=False, wrap=False)
        holds = self.holds
        if t >= holds.next_due:  # a held request fell due during this burst of reads: send it now
            holds.send_due(t)

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed, self.reusable, self._lost = True, False, exc
        done = self.done
        if done is None or done.done():
            return
        parser = self.parser
        try:
            parser.eof()  # a body that runs until the close ends here
        except ParseError as e:
            fresh = parser.received == 0
            if fresh:
                why = f"the connection closed before any answer ({exc or 'by the server'})"
                self._fail(WireError("disconnected", f"ServerDisconnectedError: {why}"), fresh=True)
            else:
                self._fail(_parse_error(e, exc), fresh=False)

    # -- the sink of the parser (parser.Sink; a 200 body goes to ``on_read``, another to ``_error_body``) --
    def head(self, status: int, headers: dict[str, str]) -> None:
        ex = self.ex
        assert ex is not None
        ex.t_headers, ex.status = self._t, status
        ctype = headers.get("content-type", "")
        ex.content_type = ctype.partition(";")[0].strip().lower() or "application/octet-stream"
        encoding = headers.get("content-encoding", "identity")
        if encoding.strip().lower() not in _IDENTITY:  # asked for none: its bytes are not the stream
            if status == 200:
                raise _Refused(WireError("bad_stream", compressed(encoding)))
            ex.error = f"(a body compressed with Content-Encoding: {encoding})".encode()
            raise _Refused(None)
        if status == 200:
            assert self.on_read is not None
            self.parser.on_body = self.on_read  # the stream's reads, straight to its reader
        else:
            ex.retry_after = headers.get("retry-after")
            self.parser.on_body = self._error_body

    def _error_body(self, data: bytes, t: int) -> None:
        kept = self._error
        size = sum(map(len, kept))
        if size + len(data) >= ERROR_BODY_BYTES:  # enough of an error message: the rest is not read
            kept.append(data[: ERROR_BODY_BYTES - size])
            raise _Refused(None)
        kept.append(data)

    def end(self) -> None:
        self._settle()
        self.reusable = self.parser.keep_alive

    # -- endings ------------------------------------------------------------------------------------
    def _settle(self) -> None:
        ex, done = self.ex, self.done
        if ex is not None and self._error:
            ex.error = b"".join(self._error)
        if done is not None and not done.done():
            done.set_result(None)

    def _fail(self, e: BaseException, *, fresh: bool, wrap: bool = True) -> None:
        if isinstance(e, _Refused):
            if e.error is None:  # an error answer cut at its cap, or compressed: what was seen stands
                self._settle()
                self.close()
                return
            e = e.error
        done = self.done
        if done is not None and not done.done():
            done.set_exception(Failure(e, fresh) if wrap else e)
        self.close()


class _Refused(Exception):
    """Raised from the sink to stop reading an answer: with the exchange's error, or None (what
    was seen is the answer: an error body at its cap, a compressed error answer)."""

    def __init__(self, error: WireError | None) -> None:
        super().__init__(str(error))
        self.error = error


def _parse_error(e: ParseError, exc: Any = None) -> WireError:
    if e.in_body:
        why = f"{e}" if exc is None else f"{e} ({exc})"
        return WireError("disconnected", f"ClientPayloadError: {_NOT_COMPLETE}: {why}")
    return WireError("client_error", f"ClientResponseError: {e}")
