"""The keep-alive connections to one endpoint, at most ``limit`` open at once.

``take`` gives the most recently returned idle connection that is still open (the likeliest
to be alive: a server closes the longest idle first), else opens one when under the limit,
else waits, first come first served, for one to be returned or closed. ``give`` takes a
connection back after an exchange: kept when its answer ended cleanly, else closed (and its
place handed on). Opening is plain TCP or TLS through the loop (``create_connection`` with the
run's ``ssl`` context and the URL's host as the server name), bounded by the connect timeout.
The host's name is resolved once per run (``resolve``), as aiohttp's cache does with no TTL: a
lookup per connection goes through a small thread pool, and hundreds of streams opening at once
would queue on it (schedule lag). When the lookup fails, each connection tries the name itself,
and fails as a record.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque

from loadgen.client.transport import Holds, WireError
from loadgen.client.wire.connection import Connection
from loadgen.clock import Clock

__all__ = ["Pool"]


class Pool:
    """Connections to ``host:port`` (TLS when ``tls`` is a context), ``limit`` at most."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        limit: int,
        connect_s: float,
        clock: Clock,
        holds: Holds,
    ) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.limit = limit
        self.connect_s = connect_s
        self.clock, self.holds = clock, holds
        self.address = host  # where to connect: the host's address once resolved
        self.opened = 0  # open connections, idle or busy (and those being opened)
        self._idle: list[Connection] = []
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._all: set[Connection] = set()

    async def resolve(self) -> None:
        """Look the host's name up once, for every connection of the run (module doc)."""
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM), self.connect_s
            )
        except (OSError, asyncio.TimeoutError):
            return
        if infos:
            self.address = str(infos[0][4][0])

    def idle_one(self) -> Connection | None:
        """``take``'s usual answer without a coroutine: the most recently returned idle connection
        still open, or None (then ``take``)."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._gone(conn)
        return None

    async def take(self, fresh: bool = False) -> Connection:
        """A connection to carry one exchange; ``fresh``: a new one, never a pooled one."""
        idle = self._idle
        if not fresh and idle:
            conn = self.idle_one()
            if conn is not None:
                return conn
        while self.opened >= self.limit:
            if idle:
                if not fresh:
                    return await self.take()
                oldest = idle.pop(0)  # a fresh one is asked for: the longest idle makes room
                oldest.close()
                self._gone(oldest)
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if not waiter.cancelled() and waiter.done():  # woken, then cancelled: pass it on
                    self._wake()
                raise
            if not fresh and idle:
                return await self.take()
        return await self._open()

    def give(self, conn: Connection) -> None:
        """An exchange ended on ``conn``: kept for the next when it may carry one, else let go."""
        conn.finish()
        if conn.closed:
            self._gone(conn)
        else:
            self._idle.append(conn)
            self._wake()

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        self.opened += 1
        limit = _ConnectLimit(loop, self.connect_s)
        try:
            try:
                _, conn = await loop.create_connection(
                    lambda: Connection(loop, self.clock, self.holds),
                    self.address,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls is not None else None,
                )
            finally:
                limit.cancel()
        except asyncio.CancelledError as e:
            if not limit.passed():
                self._release()
                raise
            self._release()
            raise WireError("timeout", f"ServerTimeoutError: connection timeout to {self.host}:{self.port}") from e
        except ssl.SSLError as e:
            self._release()
            raise WireError("disconnected", f"ClientConnectorSSLError: {e}") from e  # (aiohttp's status for it)
        except OSError as e:
            self._release()
            why = e.strerror or type(e).__name__
            raise WireError(
                "disconnected", f"ClientConnectorError: cannot connect to {self.host}:{self.port}: {why}"
            ) from e
        except BaseException:
            self._release()
            raise
        self._all.add(conn)
        return conn

    def _gone(self, conn: Connection) -> None:
        if conn in self._all:
            self._all.discard(conn)
            self._release()

    def _release(self) -> None:
        self.opened -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        """Every connection closed (the run ended)."""
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
        self.opened = 0
        for waiter in self._waiters:
            if not waiter.done():
                waiter.cancel()
        self._waiters.clear()


class _ConnectLimit:
    """The connect timeout of one ``_open``: a timer that cancels the opening task when it fires.

    Cheaper than ``asyncio.wait_for`` (a task of its own per connection, a turn of the loop
    before the connect starts, ~55 us a connection measured on the 2-core VM), which counts in a
    ramp, where every request of an open loop opens a connection. ``passed`` says whether a
    cancellation was this timer's (and takes it back, so the task is not left cancelling) rather
    than the caller's (a request timeout, the drain's end): that one goes on as a cancellation.
    """

    __slots__ = ("_task", "_timer", "_fired")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self._task = asyncio.current_task()
        self._fired = False
        self._timer = loop.call_later(seconds, self._fire)

    def _fire(self) -> None:
        self._fired = True
        if self._task is not None:
            self._task.cancel()

    def cancel(self) -> None:
        self._timer.cancel()

    def passed(self) -> bool:
        """The cancellation came from this timer alone (taken back: the task may go on)."""
        if not self._fired:
            return False
        uncancel = getattr(self._task, "uncancel", None)  # 3.11 on: how many cancels are left
        return uncancel is None or uncancel() == 0
