"""The clock and the loop every timed part of loadgen runs on.

Which event loop: uvloop where it is installed, else asyncio's own. Both the
client and the simulator spend most of their time in the loop's socket handling
(one read per streamed chunk; one write per emitted token). uvloop does that part
in C on libuv; on the 2-core development VM a bare per-read callback costs 14 us
under uvloop against 21 us under asyncio's selector loop
(benchmarks/client_capacity.py has the figures in context). ``LOADGEN_LOOP=asyncio``
(or ``uvloop``) forces the choice, for comparing the two or when a platform's uvloop
misbehaves; run.json records which loop a run used. (The garbage collector's settings
for a run are client.gc_pauses'.)

Waiting for an absolute instant on the perf_counter clock, to well under 1 ms:
asyncio's timers (and uvloop's, which have the same millisecond resolution) wake up
to a millisecond late (epoll's timeout is whole milliseconds, rounded up). The
engine's schedule and the simulator's token emissions both need better, so the last
stretch before an instant is spent yielding to other tasks (``sleep(0)``), or
napping in short kernel sleeps between yields (``nap_ns``), rather than arming a
timer. Only one task per process should wait this way at a time (the dispatcher,
the simulator's engine loop): a thousand spinning tasks would burn a core.
"""

from __future__ import annotations

import asyncio
import math
import os
import selectors
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from loadgen.errors import ConfigError

__all__ = [
    "LOOP_ENV",
    "LoopError",
    "loop_name",
    "new_loop",
    "run",
    "SPIN_NS",
    "SpinMeter",
    "sleep_until",
    "Clock",
    "VirtualClock",
    "VirtualLoop",
    "run_virtual",
]


LOOP_ENV = "LOADGEN_LOOP"
T = TypeVar("T")


class LoopError(ConfigError):
    """LOADGEN_LOOP names a loop that is unknown or not installed."""


def _uvloop() -> Any | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def loop_name() -> str:
    """'uvloop' or 'asyncio': the loop ``new_loop`` makes, from LOADGEN_LOOP or what is installed."""
    want = os.environ.get(LOOP_ENV, "").strip().lower()
    if want not in ("", "auto", "uvloop", "asyncio"):
        raise LoopError(f"{LOOP_ENV}={want!r}: use 'uvloop', 'asyncio' or leave it unset")
    if want == "asyncio":
        return "asyncio"
    if _uvloop() is not None:
        return "uvloop"
    if want == "uvloop":
        raise LoopError(f"{LOOP_ENV}=uvloop but uvloop is not installed (pip install uvloop)")
    return "asyncio"


def new_loop() -> asyncio.AbstractEventLoop:
    uvloop = _uvloop() if loop_name() == "uvloop" else None
    if uvloop is not None:
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    try:
        loop_name()  # a bad LOADGEN_LOOP raises here, before the coroutine is lost unawaited
    except LoopError:
        coro.close()
        raise
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=new_loop) as runner:
            return runner.run(coro)
    loop = new_loop()  # pragma: no cover - Python 3.10
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


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


async def sleep_until(
    due_ns: int,
    clock: Callable[[], int] = time.perf_counter_ns,
    wake: asyncio.Event | None = None,
    *,
    spin_ns: int = SPIN_NS,
    nap_ns: int = 0,
) -> bool:
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


Clock = Callable[[], int]  # nanoseconds on a monotonic clock: time.perf_counter_ns, or a VirtualClock


class VirtualClock:
    """Virtual nanoseconds, read like ``time.perf_counter_ns`` (call it).

    Time moves only when a ``VirtualLoop`` has nothing to do until its next timer (it jumps
    there), by ``tick_ns`` for every turn of the loop that had work (so a task yielding in a
    loop, as ``sleep_until`` does in its last stretch, still gets to its instant), and by
    ``advance``: the code under test taking that long without yielding (a stall, a burst of
    work). Nothing really sleeps, and the same program gives the same times on any machine.
    """

    __slots__ = ("ns", "tick_ns")

    def __init__(self, start_ns: int = 1_000_000_000, tick_ns: int = 1_000) -> None:
        self.ns = start_ns
        self.tick_ns = tick_ns

    def __call__(self) -> int:
        return self.ns

    def advance(self, ns: int) -> None:
        """The running code takes ``ns`` without yielding to the loop."""
        if ns < 0:
            raise ValueError(f"time cannot go back ({ns} ns)")
        self.ns += ns


class _JumpingSelector(selectors.DefaultSelector):
    """The loop's selector: instead of waiting ``timeout`` for I/O, move the clock past it."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:  # no timer and nothing ready (threads are not waited for: no executor here)
            raise RuntimeError("virtual loop: nothing is scheduled and nothing can wake it (a deadlock)")
        self.clock.ns += math.ceil(timeout * 1e9) if timeout > 0 else self.clock.tick_ns
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a ``VirtualClock``: ``asyncio.sleep``, ``wait_for`` and every timer run
    on virtual time, so code that takes its clock as a parameter (the engine, the simulator)
    can be driven to the nanosecond without sockets and without real waiting. Pass
    ``loop.clock`` as that clock. For tests: no real I/O timing, and no threads (an
    executor's result would never be waited for); a program left waiting on nothing
    raises instead of hanging.
    """

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        super().__init__(_JumpingSelector(self.clock))

    def time(self) -> float:
        return self.clock.ns / 1e9


def run_virtual(coro: Coroutine[Any, Any, T], clock: VirtualClock | None = None) -> T:
    """Run ``coro`` to its end on a fresh ``VirtualLoop`` (with ``clock``, if given)."""
    loop = VirtualLoop(clock)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
