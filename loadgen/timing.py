"""Waiting for an absolute instant on the perf_counter clock, to well under 1 ms.

asyncio's timers wake up to a millisecond late (epoll's timeout is whole
milliseconds, rounded up). The engine's schedule and the simulator's token
emissions both need better, so the last stretch before an instant is spent
yielding to other tasks (``sleep(0)``) rather than arming a timer. Only one
task per process should wait this way at a time (the dispatcher, the
simulator's ticker): a thousand spinning tasks would burn a core.
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
    waiting, subtracted before judging whether the client's CPU was saturated."""

    spun_ns = 0


async def sleep_until(due_ns: int, clock: Callable[[], int] = time.perf_counter_ns,
                      wake: asyncio.Event | None = None) -> bool:
    """Return at ``due_ns`` (or just after); early with False if ``wake`` is set first."""
    spin_from = 0
    while True:
        delay = due_ns - clock()
        if delay <= 0:
            if spin_from:
                SpinMeter.spun_ns += clock() - spin_from
            return True
        if wake is not None and wake.is_set():
            return False
        if delay > SPIN_NS + 200_000:
            seconds = (delay - SPIN_NS) / 1e9
            if wake is None:
                await asyncio.sleep(seconds)
            else:
                try:
                    await asyncio.wait_for(wake.wait(), seconds)
                    return False
                except asyncio.TimeoutError:
                    pass
        else:
            spin_from = spin_from or clock()
            await asyncio.sleep(0)
