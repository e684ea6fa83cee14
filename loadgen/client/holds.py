"""Requests prepared early and held to their instants.

The engine starts each request a little before its intended instant (building the body,
the HTTP client's own work, taking a connection: ~0.3-1 ms on a small machine) and the
transport writes it into a ``Held`` instead of the socket. ``HoldQueue.hold`` sends it at
the instant: from a precise sleep when the loop is free, or, when the loop is busy with a
burst of reads (which run before any timer), from the first read at or after the instant
(the transport calls ``send_due`` there). Either way the client's own work before the
write is not schedule lag, and a request is never written before its instant.

The sleep arms its timer for the instant itself (``spin_ns=0``): a timer that wakes a hair
early yields through the last 0.2 ms only. Yielding through the last 0.5 ms of every held
request (``sleep_until``'s default) busy-waited 0.26-0.31 s of an 800-stream ramp of 2 s,
against 0.07 s so (``SpinMeter``; benchmarks/client_capacity.py part (b)): CPU that a shared
core then takes back by preempting the client, for no gain in lag, whose p50 was 0.03-0.09 ms
either way (measured on the 2-core VM).
"""

from __future__ import annotations

import asyncio
import heapq
from typing import NamedTuple

from loadgen.client.transport import NEVER, Exchange, Held
from loadgen.clock import Clock, sleep_until

__all__ = ["HoldQueue"]


class _Due(NamedTuple):
    """One held request in the queue; ordered by instant, then sequence number (unique)."""

    at: int
    seq: int
    ex: Exchange
    held: Held


class HoldQueue:
    """The requests held for their instants, earliest first (a ``Holds`` for the transport)."""

    __slots__ = ("next_due", "closed", "_clock", "_heap")

    def __init__(self, clock: Clock) -> None:
        self.next_due = NEVER  # the earliest instant held; a read compares its own time with it
        self.closed = False  # the run was stopped: nothing held is sent any more
        self._clock = clock
        self._heap: list[_Due] = []

    def __len__(self) -> int:
        return len(self._heap)

    async def hold(self, ex: Exchange, held: Held) -> None:
        """Send ``held`` at ``ex.at`` (or from a read just after it); drop it if cancelled first."""
        if self.closed:  # prepared as the run stopped: its session is being cancelled; wait for that
            held.drop()
            await asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, _Due(ex.at, ex.seq, ex, held))
        self.next_due = self._heap[0].at
        try:
            try:
                await sleep_until(ex.at, self._clock, spin_ns=0)  # (module doc: no spinning)
            except BaseException:
                if not held.sent:
                    held.drop()  # cancelled: its bytes must never reach the connection
                raise
            self._send(ex, held)
        finally:
            self.send_due(self._clock())

    def send_due(self, t: int) -> None:
        """Send every held request due by ``t``, and let go of those already sent or dropped."""
        heap = self._heap
        while heap and (heap[0].at <= t or heap[0].held.sent):
            due = heapq.heappop(heap)
            self._send(due.ex, due.held)
        self.next_due = heap[0].at if heap else NEVER

    def close(self) -> None:
        """A stop: drop every request still held, now. Their sessions are being cancelled, but
        a read that runs before a cancellation lands would otherwise still send one (a request
        written after the stop, recorded as cancelled rather than not sent)."""
        self.closed = True
        for due in self._heap:
            due.held.drop()
        self._heap.clear()
        self.next_due = NEVER

    def _send(self, ex: Exchange, held: Held) -> None:
        if not held.sent:
            ex.t_sent = self._clock()  # before the write: a server never sees the bytes before this instant
            held.send()
