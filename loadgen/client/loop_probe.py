"""The client's self-check: how late its event loop runs what is due, and how late it stamps a read.

A client whose loop is busy stamps every read late, and nothing in the records shows it. So
for the whole run a probe measures two things, every ``PERIOD_NS`` (10 ms):

- **Loop lag**: a timer due every period; its lateness is how long the loop kept anything due
  waiting. A stall covering several ticks counts each tick it swallowed (a 60 ms stall: one tick
  60 ms late, the next 50, ... 10), as a read arriving at a random instant during it would have
  waited (HdrHistogram's correction for coordinated omission): one sample per stall would hide
  it. The figure includes the timers' own rounding (epoll waits whole milliseconds: up to ~1 ms
  on an idle loop).
- **Read lateness** (``read_p99_ms``), the estimate of how late a read is stamped: every
  ``READ_EVERY``-th tick the probe writes one byte into a local socket pair whose other end the
  loop watches as it watches every stream's socket, and stamps the byte when the loop delivers
  it, as the transport stamps a read. The time from the write to that stamp is what a read that became ready at that
  instant waited: the rest of the loop's turn, its poll, and the reads ready ahead of it. It has
  none of the timers' rounding; a stall longer than a turn shows in the loop lag.

Both are kept in a ``LagHistogram`` (constant memory, ~1.6% relative error, exact maximum). Cost,
on the 2-core VM: ~1% of a core on an otherwise idle loop (~115 us per tick, most of it the loop
waking from its poll for the timer, which a busy loop, awake anyway, does not pay).
"""

from __future__ import annotations

import asyncio
import socket

from loadgen.clock import Clock

__all__ = ["PERIOD_NS", "READ_EVERY", "LagHistogram", "LoopProbe"]

PERIOD_NS = 10_000_000
READ_EVERY = 4  # a read-lateness sample every 40 ms: 90,000 an hour, plenty for a p99
_LINEAR_US = 128  # below this many microseconds, one bucket per microsecond
_SUB = 64  # buckets per power of two above that: ~1.6% relative error


class LagHistogram:
    """Durations in nanoseconds, bucketed log-linearly on microseconds; the maximum exact."""

    __slots__ = ("counts", "n", "max_ns")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.max_ns = 0

    def record(self, ns: int) -> None:
        ns = max(ns, 0)
        us = ns // 1000
        if us < _LINEAR_US:
            i = us
        else:
            e = us.bit_length() - 7  # us >> e is in [64, 128)
            i = _SUB * e + (us >> e)
        self.counts[i] = self.counts.get(i, 0) + 1
        self.n += 1
        if ns > self.max_ns:
            self.max_ns = ns

    def quantile_ms(self, q: float) -> float:
        """The ``q`` quantile (the top of its bucket, never above the maximum); 0.0 with no sample."""
        if not self.n:
            return 0.0
        rank, seen = q * self.n, 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return min(_top_us(i) * 1000, self.max_ns) / 1e6
        return self.max_ns / 1e6


def _top_us(i: int) -> int:
    """The (exclusive) top of bucket ``i``, in microseconds."""
    if i < _LINEAR_US:
        return i + 1
    e = i // _SUB - 1
    return (i - _SUB * e + 1) << e


class LoopProbe:
    """Started on the running loop (``start``) for the length of a run, stopped by ``stop``."""

    __slots__ = ("lag", "reads", "_clock", "_loop", "_due", "_timer", "_pair", "_written", "_ticks")

    def __init__(self, clock: Clock) -> None:
        self.lag = LagHistogram()
        self.reads = LagHistogram()
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0
        self._timer: asyncio.TimerHandle | None = None
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._written = 0  # when the byte in flight was written (0: none)
        self._ticks = 0

    @property
    def lag_p99_ms(self) -> float:
        return self.lag.quantile_ms(0.99)

    @property
    def lag_max_ms(self) -> float:
        return self.lag.max_ns / 1e6

    @property
    def read_p99_ms(self) -> float:
        return self.reads.quantile_ms(0.99)

    def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        try:
            pair = socket.socketpair()
            for s in pair:
                s.setblocking(False)
            loop.add_reader(pair[1].fileno(), self._read)
            self._pair = pair
        except (OSError, NotImplementedError, ValueError):  # no socket pair here: the loop lag alone
            self._pair = None
        self._due = self._clock() + PERIOD_NS
        self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pair is not None and self._loop is not None:
            self._loop.remove_reader(self._pair[1].fileno())
            for s in self._pair:
                s.close()
            self._pair = None

    def _arm(self) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(max(self._due - self._clock(), 0) / 1e9, self._tick)

    def _tick(self) -> None:
        now = self._clock()
        late = now - self._due
        record = self.lag.record
        record(late)
        for missed in range(late - PERIOD_NS, 0, -PERIOD_NS):  # the ticks a stall swallowed
            record(missed)
        self._due += PERIOD_NS * (1 + max(late, 0) // PERIOD_NS)
        self._ticks += 1
        if self._pair is not None and not self._written and self._ticks % READ_EVERY == 0:
            try:
                self._written = self._clock()
                self._pair[0].send(b"x")
            except OSError:
                self._written = 0
        self._arm()

    def _read(self) -> None:
        t = self._clock()
        assert self._pair is not None
        try:
            self._pair[1].recv(64)
        except OSError:
            return
        if self._written:
            self.reads.record(t - self._written)
            self._written = 0
