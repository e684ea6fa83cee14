"""The simulated engine's real-time loop: model steps run on the clock, tokens written at their end.

This is the only part of the engine with a clock and an event loop, and the part that is
timing-sensitive, so it stands apart from what a step computes (``scheduler.py``) and costs
(``step_cost.py``). ``EngineLoop._loop`` plans each step with the scheduler (``step_at``, which the
virtual-time loop in ``sim/virtual/`` runs too), waits for the step's
absolute end on the model clock (so wake-up jitter never accumulates), writes the step's prepared
tokens first thing at that instant, then does the step's bookkeeping and counts lateness.
``headroom`` lets the server's front-end work (request handling) run in the gaps between steps.
``start`` asks the kernel for fine timer slack on the thread the loop runs on (``_fine_timer_slack``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import time
from collections.abc import Awaitable, Callable

from loadgen.clock import sleep_until
from loadgen.sim.model import COALESCE_NS, Clock
from loadgen.sim.scheduler import BatchScheduler
from loadgen.sim.sequences import StepPlan

__all__ = ["EngineLoop"]

# The engine loop's wait for a step's end: no asyncio timer within 2 ms of it (they wake up to
# ~1.2 ms late, later when a loop turn runs long); over that stretch, kernel naps of <= 0.1 ms with
# the server's I/O run between them (clock.py), and over the last 0.25 ms one kernel sleep to the
# instant, so that no loop turn (a request's HTTP parsing, its handler) starts just before the step's
# writes are due. Lands ~0.03 ms late (p50), and a process that sleeps rather than spins is the one the
# OS scheduler favours on a shared core.
_SPIN_NS, _NAP_NS, _HOLD_NS = 2_000_000, 100_000, 250_000
# How far past a step's end the server's front-end work may run it, in all; and how much front-end
# work goes between two steps even when it does not fit (``headroom``).
_FRONTEND_SLACK_NS, _FRONTEND_GAP_NS = 250_000, 1_000_000
# A loop that is behind yields to the event loop at least this often; and a step in flight this far
# past its end means the loop is far behind: front-end work is no longer held back for it.
_BEHIND_YIELD_NS = _FAR_BEHIND_NS = 5_000_000


_sched_yield = getattr(os, "sched_yield", lambda: None)


def _fine_timer_slack() -> None:
    """Ask Linux for 1 us of timer slack on this thread instead of the default 50 us: the engine
    loop's kernel naps before a step's end (``_NAP_NS``) then wake within ~10 us of when asked,
    not ~60 us, and that is lateness every step would carry. A no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in ns
    except (OSError, AttributeError):
        pass


def _collect_young() -> None:
    """Run the garbage collector's youngest pass now, just after a step's tokens went out, if it
    is due soon: left to its allocation trigger it runs at any moment, and on a slow core a pass
    takes a millisecond or more, which in a step's write burst makes the step late. Older passes
    (one in ten) are left to the collector's own trigger and policy."""
    if gc.isenabled():
        c0, c1, _ = gc.get_count()
        t0, t1, _ = gc.get_threshold()
        if c0 > t0 // 2 and c1 + 1 < t1:
            gc.collect(0)


class EngineLoop(BatchScheduler):
    """The asyncio side of ``RooflineModel``: start/stop, ``headroom``, ``behind`` and the stepping loop."""

    # Set by ``RooflineModel.__init__``.
    clock: Clock
    late_threshold_ns: int
    _wait_until: Callable[[int], Awaitable[None]]  # until the model clock reads a step's end
    _next_end: int | None  # the step in flight (its end on the model clock), for ``headroom``
    _stepped: asyncio.Event
    _slack_left: int  # overrun of the step in flight still allowed to front-end work
    _gap_used: int  # front-end work let through since the last step ended
    _frontend_waits: int
    _frontend_wait_ns: int
    _task: asyncio.Task[None] | None
    _max_late_ns: int
    _last_late_ns: int

    # ---- TimingModel --------------------------------------------------------------------
    async def start(self) -> None:
        if self._dset is not None:
            raise RuntimeError("bulk decode is for virtual time: a real-time engine emits every token at its step")
        if self._task is None:
            _fine_timer_slack()  # this thread runs the engine loop
            self._stepped.clear()
            self._task = asyncio.get_running_loop().create_task(self._loop())
            self._task.add_done_callback(self._on_done)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            self.error = task.exception()
        self._next_end = None  # nothing will step again: release whoever waits for headroom
        self._stepped.set()

    async def headroom(self, need_ns: int) -> None:
        """Wait, if need be, until front-end work estimated at ``need_ns`` fits before the next step ends.

        The server's request handling (parsing, tokenizing, a stream's first and last writes) runs
        on the engine loop's core: a burst of it just before a step ends (a wave of requests ending
        and starting together) would make every token of that step late. The server calls this
        first, so that work fills the gaps between steps the way a real server's front end works
        beside its engine, and a burst is admitted over the next steps instead of stalling one.
        Work that would run past the step's end goes ahead while the step's small overrun
        allowance lasts (a lone arrival is never held back), and all of it goes while the loop is
        far behind (it catches up by coalescing writes, see stream_writer.py); when less than a millisecond of
        work went between two steps, work held back goes whether it fits or not, so that steps
        shorter than ``need_ns`` still admit at a steady pace.
        """
        waited_from = 0
        while True:
            end = self._next_end
            if end is None:
                break
            left = end - self.clock()
            if left < -_FAR_BEHIND_NS:
                break  # the loop is far behind: holding work back would not put it on time
            over = need_ns - left
            if over <= 0:
                self._gap_used += need_ns
                break
            if over <= self._slack_left:
                self._slack_left -= over
                self._gap_used += need_ns
                break
            if waited_from and self._gap_used < _FRONTEND_GAP_NS:
                self._gap_used += need_ns
                break
            waited_from = waited_from or self.clock()
            await self._stepped.wait()
        if waited_from:
            self._frontend_waits += 1
            self._frontend_wait_ns += self.clock() - waited_from

    def behind(self) -> bool:
        """True when the last step's tokens went out later than its model end time + threshold."""
        return self._last_late_ns > self.late_threshold_ns

    # ---- the engine ---------------------------------------------------------------------
    def step_at(self, start: int) -> tuple[StepPlan, int] | None:
        """The step that starts at ``start`` on the model clock and the instant it ends, or None
        when there is nothing to run: the per-step logic this loop and the virtual-time one
        (``sim/virtual/loop.py``) share. The step's end is then applied with ``_complete``."""
        plan = self._schedule(start)
        return None if plan is None else (plan, start + int(plan.seconds * 1e9))

    def finish_at(self, plan: StepPlan, end: int) -> None:
        """Apply a step at its end in virtual time: its tokens stamped ``end`` (no clock), never late."""
        self._complete(plan, end)
        self._count_lateness(0)

    async def _loop(self) -> None:
        yielded = self.clock()
        while True:
            start = self._next_start()
            step = None if start is None else self.step_at(start)
            if step is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            plan, end = step
            self._next_end, self._slack_left = end, _FRONTEND_SLACK_NS
            now = self.clock()
            writes: list[Callable[[], None]] = []
            if now < end:  # to ~0.1 ms: no timer can be late past `end` (clock.py)
                writes = self._prepare(plan)  # while there is time: the step's writes, ready to go
                await self._wait_until(end)
                yielded = self.clock()
            elif now - yielded > _BEHIND_YIELD_NS:
                # Behind: steps run back to back to catch up, but the server's I/O (new requests,
                # and the writes of tokens that were emitted late, coalesced) still runs this often.
                await asyncio.sleep(0)
                yielded = self.clock()
            self._count_lateness(self._emit(plan, end, writes) - end)
            # The writes just woke the streams' readers. One that shares this core (a client not
            # pinned elsewhere) was queued behind this loop; let it run now rather than after the
            # next step is planned: it halves the client-side delay of loopback tokens (p99).
            _sched_yield()
            self._next_end, self._gap_used = None, 0
            self._stepped.set()  # front-end work held back for headroom: the next gap starts now
            self._stepped.clear()
            _collect_young()

    async def _sleep_to(self, end: int) -> None:
        """The real-time wait for a step's end (the default ``_wait_until``): timers and naps to
        ``_HOLD_NS`` before it, then one kernel sleep to the instant (see ``_SPIN_NS``)."""
        await sleep_until(end - _HOLD_NS, self.clock, spin_ns=_SPIN_NS, nap_ns=_NAP_NS)
        left = end - self.clock()
        if left > 0:
            time.sleep(left / 1e9)

    def _emit(self, plan: StepPlan, end: int, writes: list[Callable[[], None]]) -> int:
        """The step's end, now: its tokens stamped and written; returns when the last went to its socket.

        The model's clock stays at ``end`` (no drift); the ground truth is when tokens really went
        out: stamped now, then written, first the prepared writes (one call each), then, in
        ``_complete``'s bookkeeping, the others by the server's sink. A step far behind gets no
        prepared writes: its tokens go the sink's way (coalesced, stream_writer.py)."""
        emitted = written = self.clock()
        if writes and emitted - end <= COALESCE_NS:
            for write in writes:
                write()
            written = self.clock()
        else:
            writes = []
        if self._complete(plan, end, emitted_ns=emitted) > len(writes) or not writes:
            written = self.clock()  # a sink may have written in the bookkeeping
        return written

    def _count_lateness(self, late: int) -> None:
        """A step is late when its tokens went out (the last of them was handed to its socket) more
        than the threshold after the modelled instant. (Tokens emitted more than COALESCE_NS late are
        written later still, coalesced: their step counts late anyway.)"""
        self._last_late_ns = late
        self._c["steps"] += 1
        if late > self._max_late_ns:
            self._max_late_ns = late
        if late > self.late_threshold_ns:
            self._c["late"] += 1

    def _prepare(self, plan: StepPlan) -> list[Callable[[], None]]:
        """The writes of the tokens this step will emit, made ready before its end by the requests'
        ``prepare`` (the server's direct streams), to be called first thing at the end."""
        writes = []
        for s in plan.items:
            r = s.req
            prepare = r.prepare
            if (
                prepare is not None
                and not s.done
                and r.max_tokens > 0
                and s.computed + s.step_tokens == s.prompt_len + r.emitted
            ):
                write = prepare()
                if write is not None:
                    writes.append(write)
        return writes
