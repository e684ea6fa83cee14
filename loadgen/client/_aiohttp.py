"""Reading a streamed response body at the moment aiohttp's protocol receives it, and
writing each request at its instant.

Why: the usual ``await content.readany()`` loop costs a future, a task wake-up
and a coroutine resume per socket read, and stamps each read only when the
task gets to run again (behind whatever else the loop had queued). At a
thousand streams that is most of the client's CPU and the main source of
timestamp delay. Here the body's reads are handed to a callback from inside
the protocol's ``data_received`` (via aiohttp's payload ``StreamReader``), so
each read is stamped as the loop delivers it and the task wakes only once, at
the end of the body.

The hook is a ``StreamReader`` subclass of the same layout, swapped in for the
life of one body; where aiohttp hands out some other payload type (a
decompressing wrapper, a future aiohttp), reading falls back to ``readany``.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.client_proto import ResponseHandler
from aiohttp.streams import StreamReader

__all__ = ["HeldWrite", "StampingHandler", "arrived", "read_body", "release", "stamping_request_class", "SEQ_HEADER"]

OnRead = Callable[[bytes, int], None]  # (the read's bytes, its arrival time)
# Held requests to send from inside a burst of reads: the earliest instant among them
# (a one-item list the engine keeps current) and what sends those due by a given time.
Due = tuple[list[int], Callable[[int], None]]
_NEVER: Due = ([1 << 62], lambda t: None)
_SINKS: dict[StreamReader, tuple[OnRead, Callable[[], int], list[int], Callable[[int], None]]] = {}


class _Hooked(StreamReader):
    """A StreamReader whose body data goes to its sink instead of its buffer."""

    __slots__ = ()

    def feed_data(self, data: bytes, *args: int) -> bool:  # type: ignore[override]
        sink = _SINKS.get(self)
        if sink is None:
            return StreamReader.feed_data(self, data, *args)
        if data:
            on_read, clock, due, send_due = sink
            t = clock()
            try:
                on_read(data, t)
            except Exception as e:  # the reader's verdict on the stream (bad SSE, an error event)
                del _SINKS[self]
                self.set_exception(e)
            if t >= due[0]:  # a held request fell due during this burst of reads: send it now
                send_due(t)
        return False

    # Called per HTTP chunk: the plain reader notes chunk bounds and wakes its waiter on
    # each, which would wake the task per chunk. The sink sees every chunk as a read.
    def begin_http_chunk_receiving(self) -> None:
        pass

    def end_http_chunk_receiving(self) -> None:
        pass


_HOOKABLE = all(
    hasattr(StreamReader, a)
    for a in (
        "__slots__",
        "begin_http_chunk_receiving",
        "end_http_chunk_receiving",
        "_buffer",
        "_buffer_offset",
        "_size",
        "_cursor",
        "_http_chunk_splits",
        "_protocol",
    )
)


def _take_buffered(content: StreamReader) -> bytes:
    """Everything the reader holds, in one piece (``read_nowait`` goes chunk by chunk, with a
    flow-control call for each: most of the cost of a short answer that arrived all at once)."""
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


class _Early:
    """What a body received before its request's task came to read it, with when."""

    __slots__ = ("t_headers", "reads")

    def __init__(self, t_headers: int) -> None:
        self.t_headers = t_headers
        self.reads: list[tuple[bytes, int]] = []

    def add(self, data: bytes, t_ns: int) -> None:
        self.reads.append((data, t_ns))


_EARLY: dict[StreamReader, _Early] = {}


def _hook(content: StreamReader, sink: tuple[OnRead, Callable[[], int], list[int], Callable[[int], None]]) -> None:
    content.__class__ = _Hooked
    _SINKS[content] = sink


class StampingHandler(ResponseHandler):
    """aiohttp's protocol, stamping a response when its headers arrive and hooking its
    body right then: what comes with the headers, or before the request's task runs
    again (a burst of reads can hold it off), keeps the time it arrived.

    Only 200 responses are hooked (the engine reads every other body itself); the
    engine hands each hooked body to ``read_body`` or ``release``.
    """

    def __init__(self, loop: Any, clock: Callable[[], int], due: Due = _NEVER) -> None:
        super().__init__(loop)
        self._lg_clock = clock
        self._lg_due = due
        self._lg_body: StreamReader | None = None  # the last body hooked here

    def feed_data(self, data: Any, size: int = 0) -> None:
        message, payload = data
        if _HOOKABLE and type(payload) is StreamReader and message.code == 200:
            if self._lg_body is not None:
                release(self._lg_body)  # an earlier answer on this connection that was never read
            self._lg_body = payload
            t = self._lg_clock()
            early = _EARLY[payload] = _Early(t)
            buffered = _take_buffered(payload)  # what came in the same read as the headers
            if buffered:
                early.reads.append((buffered, t))
            if not payload.is_eof() and payload.exception() is None:
                _hook(payload, (early.add, self._lg_clock, *self._lg_due))
        super().feed_data(data, size)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._lg_body is not None and self._lg_body in _EARLY:
            release(self._lg_body)  # its request ended before reading it: nothing is kept for it
        super().connection_lost(exc)


def arrived(content: StreamReader) -> int | None:
    """When the headers of this response arrived, if its protocol stamped them."""
    early = _EARLY.get(content)
    return early.t_headers if early is not None else None


def release(content: StreamReader) -> None:
    """Unhook a body: read to its end, or one ``read_body`` will not read (its request ended first)."""
    _EARLY.pop(content, None)
    _SINKS.pop(content, None)
    if type(content) is _Hooked:
        content.__class__ = StreamReader


async def read_body(content: StreamReader, on_read: OnRead, clock: Callable[[], int], due: Due = _NEVER) -> None:
    """Pass every read of ``content`` to ``on_read``, with the time it arrived, until the body ends.

    ``on_read`` runs inside the event loop's I/O callback: it must be quick and
    must not await. ``due``: held requests to send from there when their instant
    comes (a burst of reads runs before any timer: without this, a request due
    in the middle of one would wait for its end). Reads that came before this
    call keep their own times when the protocol was a ``StampingHandler``; else
    they are stamped now. An exception ``on_read`` raises ends the body and is
    raised here; a connection lost mid-body raises aiohttp's payload error here.
    """
    early = _EARLY.pop(content, None)
    if early is None and not (_HOOKABLE and type(content) is StreamReader):
        while data := await content.readany():
            on_read(data, clock())
        return
    try:
        if content in _SINKS:  # hooked when its headers came: from now on, straight to on_read
            _SINKS[content] = (on_read, clock, *due)
        if early is not None:
            for data, t in early.reads:
                on_read(data, t)
        data = _take_buffered(content)  # what arrived before a hook
        if data:
            on_read(data, clock())
        exc = content.exception()
        if exc is not None:
            raise exc
        if not content.is_eof():
            if content not in _SINKS:
                _hook(content, (on_read, clock, *due))
            await content.wait_eof()
            exc = content.exception()
            if exc is not None:
                raise exc
    finally:
        release(content)
    data = _take_buffered(content)
    if data:
        on_read(data, clock())


SEQ_HEADER = "X-Loadgen-Seq"


class HeldWrite:
    """Stands in for a connection's transport while aiohttp writes a request, and keeps
    the bytes until ``send()``: the request is prepared early, its bytes go out at its
    instant, from whichever comes first, the engine's timer or a read.

    aiohttp writes through ``protocol.transport``; everything but writing is the
    real transport's.
    """

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


def stamping_request_class(
    on_send: Callable[[int, bool], None],
    early: Callable[[int], bool],
    hold: Callable[[int, HeldWrite], Awaitable[None]],
    on_written: Callable[[int], None],
) -> type:
    """An aiohttp ``ClientRequest`` class that reports when each request goes out, and can hold it.

    The engine prepares a request (body, aiohttp's own work, a connection) a little
    before its intended instant. When ``early(seq)``, aiohttp writes the request into
    a ``HeldWrite`` and ``hold(seq, held)`` sends it at the instant (and reports it
    written), so it goes out then rather than after the preparation.

    Why not aiohttp's tracing signals: they cost ~60 us a request here (an
    attrs object and an awaited signal per event, for every event), and their
    "headers sent" fires before the headers are even serialised; aiohttp
    writes headers and body together later, from the body-writing task.

    ``on_send(seq, reused)`` runs when the request is given its connection
    (``reused``: a pooled keep-alive connection that served an earlier request,
    which the server may have closed meanwhile); ``on_written(seq)`` when the
    bytes of a request not held have been handed to the socket. ``seq`` is read from the
    ``X-Loadgen-Seq`` header the engine sends; requests without it are not
    reported.
    """
    from weakref import WeakSet

    from aiohttp import ClientOSError, ClientRequest

    served: WeakSet[object] = WeakSet()

    class StampingRequest(ClientRequest):
        async def send(self, conn):  # type: ignore[no-untyped-def]
            seq = self.headers.get(SEQ_HEADER)
            if seq is not None:
                proto = conn.protocol
                on_send(int(seq), proto in served)
                served.add(proto)
            return await super().send(conn)

        async def write_bytes(self, writer, conn, *args, **kwargs):  # type: ignore[no-untyped-def]
            seq = self.headers.get(SEQ_HEADER)
            if seq is None:
                return await super().write_bytes(writer, conn, *args, **kwargs)
            seq = int(seq)
            proto = conn.protocol
            if proto is None or proto.transport is None or not early(seq):
                await super().write_bytes(writer, conn, *args, **kwargs)
                on_written(seq)
                return
            held = HeldWrite(proto.transport)
            proto.transport = held
            try:
                await super().write_bytes(writer, conn, *args, **kwargs)
            finally:
                if proto.transport is held:
                    proto.transport = held.real
            await hold(seq, held)
            if held.lost:  # as aiohttp reports a failed write: the stale keep-alive retry sees it
                proto.set_exception(ClientOSError(errno.ECONNRESET, "connection closed while the request was held"))

    return StampingRequest
