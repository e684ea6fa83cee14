"""The lean wire: the engine's ``Transport`` (client/transport.py) on loadgen's own HTTP/1.1.

Each exchange takes a keep-alive connection from the endpoint's pool (pool.py), renders its
request once (request.py) and writes it in one call: at once, with ``t_sent`` stamped just
before, or, prepared before its instant, into a ``HeldBytes`` that the hold queue sends then
(holds.py). The answer is parsed in the connection's ``data_received`` (connection.py,
parser.py): each read of a 200 body goes to ``on_read`` with the time it arrived, and the
task wakes once, at the end. So the fast path is always on (``FastPath(True)``), with no
third-party internals.

Timeouts: connecting is bounded by the connect timeout; every other limit is the engine's
request timer, which cancels the exchange's task. A cancelled (or failed) exchange closes its
connection, whose answer would otherwise arrive for the next request, and frees its place
in the pool. What an exchange may raise: ``WireError`` (``disconnected``, ``timeout``,
``client_error``, ``bad_stream``), what ``on_read`` raised, or the cancellation.

The stale keep-alive resend: a request on a *reused* connection that fails before any byte
of its answer arrived (the write found the connection closed, or it closed with nothing
received) is sent once more, on a fresh connection. Why that is safe: a server closes an
idle keep-alive connection whenever it likes (its keep-alive timeout; llama.cpp after every
stream while advertising keep-alive), and a request that crosses that close on the wire is
discarded unread: it was never served, so sending it again is its first delivery, not a
duplicate. (A server that read it and then died without a byte of answer would see it twice;
an LLM completion has no effect but its compute, and the resend happens once, on a fresh
connection, so an endpoint that drops every request is recorded failing, not retried.) A
failure on a fresh connection, or after the answer began, is the endpoint's and is recorded.

Redirects are not followed: a 3xx is an ``http_error`` that says so (a measured request
silently doubled is worse than an endpoint URL to correct).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from loadgen.client.endpoint_options import EndpointOptions
from loadgen.client.transport import Exchange, FastPath, Holds, OnRead, WireError
from loadgen.client.wire.connection import Connection, Failure
from loadgen.client.wire.pool import Pool
from loadgen.client.wire.request import RequestHead
from loadgen.clock import Clock

__all__ = ["LeanTransport", "HeldBytes"]

_REDIRECT = b"redirect not followed (give the final URL as --endpoint)"


class HeldBytes:
    """A request's bytes kept back until the hold queue sends them (a ``Held``)."""

    __slots__ = ("conn", "data", "sent", "lost")

    def __init__(self, conn: Connection, data: bytes) -> None:
        self.conn, self.data = conn, data
        self.sent = False  # sent, or dropped: never written after that
        self.lost = False  # the connection was gone when the instant came

    def send(self) -> None:
        if self.sent:
            return
        self.sent = True
        try:
            self.lost = not self.conn.write(self.data)
        except Exception:  # the transport failed under us: lost, as a failed write
            self.lost = True
        self.data = b""

    def drop(self) -> None:
        self.sent = True
        self.data = b""


class LeanTransport:
    """Sends each exchange to ``url`` over a keep-alive pool of its own; one run at a time."""

    def __init__(self, url: str, *, connect_timeout_s: float, http: EndpointOptions | None = None) -> None:
        self._head = RequestHead(url)
        self._options = http if http is not None else EndpointOptions()
        self._connect_s = connect_timeout_s
        self._clock: Clock = lambda: 0
        self._holds: Holds | None = None
        self._pool: Pool | None = None

    @asynccontextmanager
    async def open(self, clock: Clock, holds: Holds, connections: int) -> AsyncIterator[FastPath]:
        head = self._head
        tls: ssl.SSLContext | None = None
        if head.tls:
            ctx = self._options.ssl_context()
            tls = ctx if isinstance(ctx, ssl.SSLContext) else ssl.create_default_context()
        self._clock, self._holds = clock, holds
        self._pool = Pool(head.host, head.port, tls, connections, self._connect_s, clock, holds)
        await self._pool.resolve()
        try:
            yield FastPath(True)
        finally:
            self._pool.close()
            self._pool = None

    async def exchange(self, ex: Exchange, on_read: OnRead) -> None:
        pool = self._pool
        assert pool is not None, "exchange() outside open()"
        conn = pool.idle_one() or await pool.take()
        try:
            await self._once(conn, ex, on_read)
        except Failure as f:
            if not (f.fresh and conn.served):
                raise f.error from None
            pool.give(conn)  # (closed: it failed)
            conn = await pool.take(fresh=True)  # the stale keep-alive resend (module doc), once
            try:
                await self._once(conn, ex, on_read)
            except Failure as g:
                raise g.error from None
        finally:
            pool.give(conn)
        if ex.status is not None and 300 <= ex.status < 400:
            ex.error = _REDIRECT + (b"; " + ex.error if ex.error else b"")

    async def _once(self, conn: Connection, ex: Exchange, on_read: OnRead) -> None:
        """Write ``ex``'s bytes on ``conn`` (now, or held to ``ex.at``) and wait for its answer.
        (Rendered here, and let go once written: an answer can take minutes, and a resend,
        rare, renders them again.)"""
        done = conn.begin(ex, on_read)
        clock = self._clock
        if ex.at <= clock():
            data = self._head.render(ex.headers, ex.body)
            ex.t_sent = clock()  # before the write: a server never sees the bytes before this instant
            written = conn.write(data)
            del data
            if not written:
                raise Failure(_closed("the connection closed before the request was written"), fresh=True)
        else:
            held = HeldBytes(conn, self._head.render(ex.headers, ex.body))
            assert self._holds is not None
            await self._holds.hold(ex, held)  # stamps t_sent and sends, at the instant
            if held.lost:
                raise Failure(_closed("the connection closed while the request was held"), fresh=True)
        await done


def _closed(why: str) -> WireError:
    return WireError("disconnected", f"ClientOSError: {why}")
