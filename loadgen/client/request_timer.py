"""One request's timeouts, watched by one timer of its own.

The timer is armed at the earliest limit that could pass and, when it fires with none passed,
re-armed at the next: one timer per request, fired rarely (a read never touches it), so a
deadline is met to within the loop's timer resolution (~1 ms) at any rate, for ~5 us a request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loadgen.client.config import Timeouts
from loadgen.client.protocol.tallies import Tally
from loadgen.clock import Clock

__all__ = ["Limits", "RequestTimer"]


class Limits:
    """A run's timeouts in nanoseconds, with its loop and clock: worked out once per run (each
    request's timer would otherwise convert them and look the loop up again, ~1 us of its ~3)."""

    __slots__ = ("first_ns", "total_ns", "idle_ns", "arm_ns", "loop", "clock")

    def __init__(self, t: Timeouts, clock: Clock) -> None:
        self.first_ns = int(t.first_byte * 1e9)
        self.total_ns = int(t.total * 1e9)
        self.idle_ns = int(t.idle * 1e9)
        # no read can come before the start: the idle limit cannot pass before start + idle
        self.arm_ns = min(self.first_ns, self.total_ns, self.idle_ns)  # the first arming, from the start
        self.loop = asyncio.get_running_loop()
        self.clock = clock


class RequestTimer:
    """A request being sent or answered, and the timer that watches its limits from ``start``.

    The timer is armed at the earliest limit that could pass; when it fires, it cuts the request
    off (``why``, then its task cancelled) or is re-armed at the next. First-byte: until the
    first output-carrying event (``tally.t_output``); idle: from the body's last read of any
    bytes (``tally.t_read``); total. A read never touches the timer: it costs nothing per read.
    """

    __slots__ = ("task", "tally", "deadline_first", "deadline_total", "idle_ns", "why", "_clock", "_loop", "_timer")

    def __init__(self, task: asyncio.Task[Any] | None, tally: Tally, start: int, limits: Limits) -> None:
        self.task = task
        self.tally = tally
        self.deadline_first = start + limits.first_ns
        self.deadline_total = start + limits.total_ns
        self.idle_ns = limits.idle_ns
        self.why: str | None = None  # why the engine cut it off (a timeout), if it did
        self._clock = clock = limits.clock
        self._loop = loop = limits.loop
        self._timer: asyncio.TimerHandle | None = loop.call_later(
            max(start + limits.arm_ns - clock(), 0) / 1e9, self._check
        )

    def _arm(self, at: int) -> None:
        self._timer = self._loop.call_later(max(at - self._clock(), 0) / 1e9, self._check)

    def _check(self) -> None:
        now, tally = self._clock(), self.tally
        first, read = tally.t_output is None, tally.t_read
        if now >= self.deadline_total:
            self.why = "total timeout"
        elif first and now >= self.deadline_first:
            self.why = "no output before the first-byte timeout"
        elif read and now >= read + self.idle_ns:
            self.why = "idle timeout between reads"
        if self.why is None:  # nothing passed (or the timer fired a hair early): the next limit
            nxt = min(self.deadline_total, (read or now) + self.idle_ns)
            self._arm(min(nxt, self.deadline_first) if first else nxt)
        elif self.task is not None:
            self.task.cancel()

    def end(self) -> None:
        """The request ended: its timer goes."""
        if self._timer is not None:
            self._timer.cancel()
