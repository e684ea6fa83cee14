"""The seam between the engine and the wire.

The engine decides *when*: it schedules each request, holds one prepared early until its
instant, times out, drains and cancels. A ``Transport`` only carries bytes: it opens what
a run needs (``open``) and sends one request and streams its answer (``exchange``). The
default is aiohttp's (``loadgen.client.aiohttp_transport.AiohttpTransport``); tests drive the engine
through a scripted one on a virtual clock, with no sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import NamedTuple, Protocol

from loadgen.clock import Clock

__all__ = [
    "SEQ_HEADER",
    "NEVER",
    "OnRead",
    "FastPath",
    "WireError",
    "compressed",
    "Exchange",
    "Held",
    "Holds",
    "Transport",
]

SEQ_HEADER = "X-Loadgen-Seq"  # the request's sequence number: joins server logs to records
NEVER = 1 << 62  # an instant that never comes (no held request)

OnRead = Callable[[bytes, int], None]  # (a read's bytes, its arrival time); see ``Transport.exchange``


class FastPath(NamedTuple):
    """Whether a transport stamps each read as the loop delivers it and can hold a prepared
    request's bytes until its instant; when not, why. A run works either way; without it, reads
    are stamped when the request's task gets to them and requests are prepared at their instant
    (their preparation then counts as schedule lag)."""

    ok: bool
    why: str = ""


class WireError(Exception):
    """An exchange failed on the wire; ``status`` is the record status it gives:
    ``disconnected``, ``timeout``, ``client_error``, or ``bad_stream`` (an answer that cannot be
    the stream asked for, such as a compressed one)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def compressed(encoding: str) -> str:
    """The error of an answer compressed although the request asked for ``identity``
    (``encoding`` is the endpoint's header value: untrusted, the engine cleans it)."""
    return f"compressed answer (Content-Encoding: {encoding[:60]}) although identity was asked"


class Exchange:
    """One request through a transport, and what the wire saw of it.

    The engine fills in what to send; the transport fills in the rest as it happens, so a
    request cut off mid-answer (a timeout, a stop) keeps what was seen before. ``at`` is the
    intended instant: bytes must not reach the socket before it.
    """

    __slots__ = (
        "seq",
        "body",
        "headers",
        "at",
        "t_sent",
        "t_headers",
        "status",
        "content_type",
        "retry_after",
        "error",
    )

    def __init__(self, seq: int, body: bytes, headers: dict[str, str], at: int) -> None:
        self.seq = seq
        self.body = body
        self.headers = headers
        self.at = at
        self.t_sent: int | None = None  # just before the request's bytes were handed to the socket
        self.t_headers: int | None = None  # the answer's headers arrived
        self.status: int | None = None  # its HTTP status
        self.content_type = ""
        self.retry_after: str | None = None
        self.error = b""  # the start of a body that was not 200, as sent


class Held(Protocol):
    """A request's bytes, written but kept back: sent once, or dropped."""

    @property
    def sent(self) -> bool:
        """Sent or dropped: never written after that."""
        ...

    def send(self) -> None: ...

    def drop(self) -> None: ...


class Holds(Protocol):
    """The engine's requests held for their instants, as a transport sees them."""

    next_due: int  # the earliest instant among them (``NEVER``: none); checked on every read

    def send_due(self, t: int) -> None:
        """Send every held request due by ``t`` (a transport calls this from a read at or after ``next_due``)."""
        ...

    async def hold(self, ex: Exchange, held: Held) -> None:
        """Keep ``held`` until ``ex.at``, send it then (stamping ``ex.t_sent`` just before), or drop it if cancelled."""
        ...


class Transport(Protocol):
    """What the engine sends through."""

    def open(self, clock: Clock, holds: Holds, connections: int) -> AbstractAsyncContextManager[FastPath]:
        """Set up one run (pools, sessions) with at most ``connections`` open at once; says
        whether the fast path is on, and closes everything when the run ends."""
        ...

    async def exchange(self, ex: Exchange, on_read: OnRead) -> None:
        """Send ``ex`` and, for a 200 answer, pass every read of its body to ``on_read``
        (``(bytes, arrival time)``; it runs inside the loop's I/O callback where it can, so it must
        be quick and must not await) until the body ends. A request prepared before ``ex.at`` is
        written into a ``Held`` and given to ``holds.hold``; otherwise ``ex.t_sent`` is stamped just
        before the bytes go out (never after: a server must not see them before it). An answer
        that is not 200 leaves its first bytes in ``ex.error``. Raises ``WireError`` for a
        failure on the wire; what ``on_read`` raises ends the body and is raised here."""
        ...
