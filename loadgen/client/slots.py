"""The ``--max-inflight`` slots: at most that many requests prepared, waiting or on the wire.

What ``asyncio.Semaphore`` does here, for less: a request that finds a slot free takes it
without a coroutine call or a suspension (``take``: a counter), which is every request of a
run below its cap; one that finds none waits, first come first served (``wait``), and a slot
given back goes straight to the longest waiter (``give``). The semaphore's ``async with``,
its ``locked`` test (twice: ours and its own) and its acquire cost ~3 us a request on the
2-core VM (``benchmarks/client_capacity.py``'s fixed cost per request).
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["Slots"]


class Slots:
    """``limit`` slots; ``take`` (or ``wait``) before a request, ``give`` after it."""

    __slots__ = ("free", "_waiters")

    def __init__(self, limit: int) -> None:
        self.free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        """A slot now, if one is free and nobody waits for one (True); else False: ``wait``."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def wait(self) -> None:
        """A slot, after every earlier waiter got one. Cancelled while waiting, it takes none
        (one handed to it just then goes on to the next waiter)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # handed a slot, then cancelled: pass it on
                self.give()
            elif waiter in self._waiters:  # (a give may have dropped it, cancelled, already)
                self._waiters.remove(waiter)
            raise

    def give(self) -> None:
        """A slot back: to the longest waiter still waiting, else free."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1
