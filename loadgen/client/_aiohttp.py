"""Every aiohttp internal loadgen relies on, for the engine's transport (aiohttp_transport.py).

Why internals: the usual ``await content.readany()`` loop costs a future, a task wake-up
and a coroutine resume per socket read, and stamps each read only when the task gets to
run again (behind whatever else the loop had queued). At a thousand streams that is most
of the client's CPU and the main source of timestamp delay. So a body's reads are handed
to a callback from inside the protocol's ``data_received``, each stamped as the loop
delivers it, and the task wakes once, at the end of the body. And a request prepared
early is written into a stand-in transport and its bytes held until its instant.

The internals, each used only here (and probed by ``_aiohttp_fit.fast_path`` at the start of
every run); every one is in aiohttp 3.11.0 to 3.14.5 (the pinned range, pyproject.toml: the
tests pass on 3.11.0, 3.11.18, 3.12.15, 3.13.5 and 3.14.5):

- ``TCPConnector._factory`` (3.9 on): the protocol factory the connector opens connections
  with; replaced by one making ``StampingHandler`` (aiohttp's ``ResponseHandler``, subclassed),
  the only way to be in the protocol when an answer's bytes arrive.
- ``ResponseHandler.feed_data((message, payload), size)`` (3.9 on): where the protocol hands
  itself each parsed answer head with its body reader; overridden to stamp the head and hook
  the body before the request's task hears of it.
- ``StreamReader``, the body reader, with ``__slots__`` (3.11 on; 3.9 and 3.10 keep its state
  per instance, so there the check fails and the fast path is off): its ``__class__`` is
  swapped for ``_Hooked`` (the same layout, no new slots) for the life of one body, so its
  ``feed_data`` and the per-HTTP-chunk ``begin/end_http_chunk_receiving`` calls come to us
  (the plain ones buffer each read and wake the task per chunk); ``_protocol`` leads a hooked
  reader to its connection's state (a reader takes no new attributes); ``_buffer``,
  ``_buffer_offset``, ``_size``, ``_cursor``, ``_http_chunk_splits`` are emptied in one go by
  ``_take_buffered`` (``read_nowait`` goes chunk by chunk, with flow control per chunk).
- ``ClientRequest.send(conn)`` and ``write_bytes(writer, conn, ...)`` (3.9 on; 3.12 added a
  third argument, passed through): overridden, through ``ClientSession(request_class=...)``,
  to learn whether a connection is a reused keep-alive one and when a request's bytes go out,
  and to write a request prepared early into a ``HeldWrite``; ``conn.protocol.transport``,
  what aiohttp writes through, is swapped for the ``HeldWrite`` while it writes.

Where any of them is missing or behaves otherwise, ``fast_path`` says why and the run goes
the plain way (``readany``, ``ClientRequest``, tracing for connection reuse) with
``fast_read: false`` in run.json.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.streams import StreamReader

from loadgen.client.transport import SEQ_HEADER, Exchange, Holds, OnRead
from loadgen.clock import Clock

__all__ = [
    "Call",
    "HeldWrite",
    "StampingHandler",
    "answer_arrived",
    "install",
    "read_body",
    "release",
    "request_class",
]


class _Body:
    """A 200 answer's body, hooked when its head arrived. Until ``read_body`` takes it (a burst of
    reads can hold the task off), reads are kept with their times (two lists: no object per read)."""

    __slots__ = ("content", "t_headers", "clock", "holds", "on_read", "early", "early_t", "reading")

    def __init__(self, content: StreamReader, t_headers: int, clock: Clock, holds: Holds) -> None:
        self.content = content
        self.t_headers = t_headers
        self.clock = clock
        self.holds = holds
        self.early: list[bytes] = []
        self.early_t: list[int] = []
        self.on_read: OnRead = self._keep
        self.reading = False

    def _keep(self, data: bytes, t: int) -> None:
        self.early.append(data)
        self.early_t.append(t)


class _Hooked(StreamReader):
    """A StreamReader whose body data goes to its connection's ``_Body`` instead of its buffer."""

    __slots__ = ()

    def feed_data(self, data: bytes, *args: int) -> bool:
        proto: StampingHandler = self._protocol  # type: ignore[assignment]  # only StampingHandler hooks a body
        body = proto.lg_body
        if body is None:  # the reader gave up (its on_read raised): the plain way, to no one
            return bool(StreamReader.feed_data(self, data, *args))
        if data:
            t = body.clock()
            try:
                body.on_read(data, t)
            except Exception as e:  # the reader's verdict on the stream (bad SSE, an error event)
                proto.lg_body = None
                self.set_exception(e)
            holds = body.holds
            if t >= holds.next_due:  # a held request fell due during this burst of reads: send it now
                holds.send_due(t)
        return False

    # Called per HTTP chunk: the plain reader notes chunk bounds and wakes its waiter on
    # each, which would wake the task per chunk. The body sees every chunk as a read.
    def begin_http_chunk_receiving(self) -> None:
        pass

    def end_http_chunk_receiving(self) -> None:
        pass


def _take_buffered(content: StreamReader) -> bytes:
    """Everything the reader holds, in one piece (the cost of a short answer that came all at once)."""
    buf = content._buffer
    if not buf:
        return b""
    data = b"".join(buf)
    if content._buffer_offset:
        data = data[content._buffer_offset :]
    buf.clear()
    content._buffer_offset = 0
    content._cursor += len(data)
    content._size = 0
    if content._http_chunk_splits:
        content._http_chunk_splits.clear()
    content._protocol.resume_reading()
    return data


class StampingHandler(ResponseHandler):
    """aiohttp's protocol, stamping a 200 answer's head as it arrives and hooking its body then,
    one body at a time (HTTP/1.1), each handed to ``read_body`` or ``release``; ``lg_`` marks its own."""

    __slots__ = ("lg_clock", "lg_holds", "lg_body", "lg_served")  # read per read: slots, not the instance dict

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Clock, holds: Holds) -> None:
        super().__init__(loop)
        self.lg_clock = clock
        self.lg_holds = holds
        self.lg_body: _Body | None = None  # the body hooked here, until released
        self.lg_served = False  # this connection carried a request before (a reused keep-alive one)

    def feed_data(self, data: Any, size: int = 0) -> None:
        message, payload = data
        if type(payload) is StreamReader and message.code == 200:
            if self.lg_body is not None:
                release(self.lg_body.content)  # an earlier answer on this connection that was never read
            t = self.lg_clock()
            body = self.lg_body = _Body(payload, t, self.lg_clock, self.lg_holds)
            buffered = _take_buffered(payload)  # what came in the same read as the head
            if buffered:
                body._keep(buffered, t)
            if not payload.is_eof() and payload.exception() is None:
                _become(payload, _Hooked)
        super().feed_data(data, size)

    def connection_lost(self, exc: BaseException | None) -> None:
        # A body not read yet keeps its reads: its task may just be late (a loaded loop), and
        # ``read_body`` then hands them over before raising the cut. (One that is never read
        # goes with this protocol.)
        body = self.lg_body
        super().connection_lost(exc)
        # A body the parser gave up on (a chunk size that is not hex, say) is left by aiohttp
        # neither ended nor failed, and its reader would wait for a timeout: it fails now.
        content = body.content if body is not None else None
        if content is not None and not content.is_eof() and content.exception() is None:
            why = self.exception() or exc
            content.set_exception(aiohttp.ClientPayloadError(f"Response payload is not completed: {why!r}"))


def _body_of(content: StreamReader) -> _Body | None:
    if type(content) is not StreamReader and type(content) is not _Hooked:  # a 204's has no protocol
        return None
    proto = content._protocol
    body = proto.lg_body if isinstance(proto, StampingHandler) else None
    return body if body is not None and body.content is content else None


def _become(content: StreamReader, cls: type[StreamReader]) -> None:
    content.__class__ = cls  # the same layout (``_Hooked`` adds no slots), so Python allows it


def release(content: StreamReader) -> None:
    """Unhook a body: read to its end, or one ``read_body`` will not read (its request ended first)."""
    if type(content) is _Hooked:
        _become(content, StreamReader)
    proto = content._protocol
    if isinstance(proto, StampingHandler) and _body_of(content) is not None:
        proto.lg_body = None


async def read_body(content: StreamReader, on_read: OnRead, clock: Clock) -> None:
    """Pass every read of ``content`` to ``on_read``, with the time it arrived, until the body ends.

    ``on_read`` runs inside the loop's I/O callback: quick, never awaiting. Reads before this call
    keep their times when the protocol is a ``StampingHandler``; else each is stamped when this
    task gets it. What ``on_read`` raises, or a connection lost mid-body, is raised here.
    """
    body = _body_of(content)
    if body is None:
        while data := await content.readany():
            on_read(data, clock())
        return
    try:
        body.reading = True
        body.on_read = on_read  # from now on, hooked reads go straight to it
        early, times = body.early, body.early_t
        body.early, body.early_t = [], []
        for data, t in zip(early, times, strict=True):
            on_read(data, t)
        data = _take_buffered(content)  # nothing, unless aiohttp buffered some after all
        if data:
            on_read(data, clock())
        exc = content.exception()
        if exc is not None:
            raise exc
        if not content.is_eof():
            await content.wait_eof()
            exc = content.exception()
            if exc is not None:
                raise exc
    finally:
        release(content)
    data = _take_buffered(content)
    if data:
        on_read(data, clock())


class HeldWrite:
    """Stands in for a connection's transport while aiohttp writes a request, and keeps the
    bytes until ``send()`` (a ``Held``). aiohttp writes through ``protocol.transport``;
    everything but writing is the real transport's."""

    __slots__ = ("real", "chunks", "sent", "lost")

    def __init__(self, real: Any) -> None:
        self.real = real
        self.chunks: list[Any] = []
        self.sent = False  # sent, or dropped: never written after that
        self.lost = False  # the connection closed while the bytes were held

    def write(self, data: Any) -> None:
        self.chunks.append(data)

    def writelines(self, chunks: Any) -> None:
        self.chunks.extend(chunks)

    def is_closing(self) -> bool:
        return bool(self.real.is_closing())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def send(self) -> None:
        """Hand the bytes to the socket, once."""
        if self.sent:
            return
        self.sent = True
        try:
            if self.real.is_closing():
                self.lost = True
            else:
                self.real.write(b"".join(self.chunks))
        except Exception:  # the transport failed under us: the request is lost, as a write error
            self.lost = True
        self.chunks = []

    def drop(self) -> None:
        """Never send them (the request was cancelled while held)."""
        self.sent = True
        self.chunks = []


class Call:
    """A request in flight through the transport: its exchange, and whether its connection was reused."""

    __slots__ = ("ex", "reused")

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self.reused = False


def request_class(calls: dict[int, Call], clock: Clock, holds: Holds) -> type[aiohttp.ClientRequest]:
    """An aiohttp ``ClientRequest`` that learns whether its connection is reused, stamps when its
    bytes go out, and holds a request prepared before its instant (``Exchange.at``) until then.

    Why not aiohttp's tracing signals: they cost ~60 us a request here (an attrs object and an
    awaited signal per event), and their "headers sent" fires before the headers are even
    serialised; aiohttp writes headers and body together later, from the body-writing task.
    The request is found by its ``X-Loadgen-Seq`` header; one without it is left alone.
    """

    def call_of(request: aiohttp.ClientRequest) -> Call | None:
        seq = request.headers.get(SEQ_HEADER)
        return calls.get(int(seq)) if seq is not None else None

    class StampingRequest(aiohttp.ClientRequest):
        async def send(self, conn: Any) -> aiohttp.ClientResponse:
            call, proto = call_of(self), conn.protocol
            if call is not None and isinstance(proto, StampingHandler):
                call.reused, proto.lg_served = proto.lg_served, True
            return await super().send(conn)

        async def write_bytes(self, writer: Any, conn: Any, *args: Any, **kwargs: Any) -> None:
            call, proto = call_of(self), conn.protocol
            if call is None or proto is None or proto.transport is None or call.ex.at <= clock():
                if call is not None:  # before the write (aiohttp writes head and body from in here)
                    call.ex.t_sent = clock()
                await super().write_bytes(writer, conn, *args, **kwargs)
                return
            held = HeldWrite(proto.transport)
            proto.transport = held
            try:
                await super().write_bytes(writer, conn, *args, **kwargs)
            finally:
                if proto.transport is held:
                    proto.transport = held.real
            await holds.hold(call.ex, held)
            if held.lost:  # as aiohttp reports a failed write: the stale keep-alive retry sees it
                proto.set_exception(
                    aiohttp.ClientOSError(errno.ECONNRESET, "connection closed while the request was held")
                )

    return StampingRequest


def install(connector: aiohttp.TCPConnector, clock: Clock, holds: Holds) -> None:
    """Open every connection of ``connector`` with a ``StampingHandler`` (when ``fast_path`` said yes)."""
    loop = asyncio.get_running_loop()
    connector._factory = lambda: StampingHandler(loop, clock, holds)  # type: ignore[assignment]  # a partial in aiohttp


def answer_arrived(content: StreamReader) -> int | None:
    """When the head of this answer arrived, if its protocol stamped it."""
    body = _body_of(content)
    return body.t_headers if body is not None else None
