"""Waiting for an absolute instant on the perf_counter clock, to well under 1 ms.

asyncio's timers wake up to a millisecond late (epoll's timeout is whole
milliseconds, rounded up). The engine's schedule and the simulator's token
emissions both need better, so the last stretch before an instant is spent
yielding to other tasks (``sleep(0)``), or napping in short kernel sleeps
between yields (``nap_ns``), rather than arming a timer. Only one task per
process should wait this way at a time (the dispatcher, the simulator's
engine loop): a thousand spinning tasks would burn a core.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["SPIN_NS", "SpinMeter", "sleep_until"]

# Below this much time left, yield instead of arming a timer. A timer armed for
# (delay - SPIN_NS) wakes within [due - SPIN_NS, due + 1 ms - SPIN_NS), so this
# trades at most ~0.5 ms of lateness against at most ~0.5 ms of yielding per wait.
SPIN_NS = 500_000


class SpinMeter:
    """Wall time spent yielding in ``sleep_until``: busy-looking CPU that was really
    waiting, subtracted before judging whether the client's CPU was saturated.

    Time when several waiters yield at once counts once (it is wall time, compared
    with CPU time), so overlapping waits never hide a busy client."""

    spun_ns = 0
    _active = 0
    _since = 0

    @classmethod
    def enter(cls, now: int) -> None:
        if not cls._active:
            cls._since = now
        cls._active += 1

    @classmethod
    def leave(cls, now: int) -> None:
        cls._active -= 1
        if not cls._active:
            cls.spun_ns += now - cls._since


async def sleep_until(due_ns: int, clock: Callable[[], int] = time.perf_counter_ns,
                      wake: asyncio.Event | None = None, *, spin_ns: int = SPIN_NS, nap_ns: int = 0) -> bool:
    """Return at ``due_ns`` (or just after); early with False if ``wake`` is set first.

    ``spin_ns``: how long before the instant to stop arming timers. asyncio's timers can wake up
    to ~1.2 ms late (epoll's whole-millisecond timeout, rounded up, plus wake-up latency), so a
    waiter that must not be late by even that much passes more than the default.

    ``nap_ns``: 0 (the default) yields (``sleep(0)``) through that last stretch: other tasks and
    I/O run, but the process stays runnable, burns the core, and uses up its scheduler slice, so
    on a shared core it is the one preempted. With ``nap_ns`` > 0 it alternates kernel sleeps of
    at most that long (``time.sleep``: accurate to ~0.1 ms, no CPU) with one ``sleep(0)`` for
    the event loop's I/O, and sleeps the final stretch outright; nothing waits longer than
    ``nap_ns`` for the loop, and the wait ends within ~0.1 ms of the instant.
    """
    spinning = False
    try:
        while True:
            delay = due_ns - clock()
            if delay <= 0:
                return True
            if wake is not None and wake.is_set():
                return False
            if delay > spin_ns + 200_000:
                seconds = (delay - spin_ns) / 1e9
                if wake is None:
                    await asyncio.sleep(seconds)
                else:
                    try:
                        await asyncio.wait_for(wake.wait(), seconds)
                        return False
                    except asyncio.TimeoutError:
                        pass
            elif nap_ns:
                time.sleep(min(delay, nap_ns) / 1e9)
                if delay > nap_ns:
                    await asyncio.sleep(0)
            else:
                if not spinning:
                    spinning = True
                    SpinMeter.enter(clock())
                await asyncio.sleep(0)
    finally:
        if spinning:
            SpinMeter.leave(clock())
