"""The simulated engine's asyncio loop: steps on a clock, tokens at their end, front-end work in the
gaps, lateness counted; and the precise wait it uses (``loadgen.clock.sleep_until`` with naps).

Most of it runs on a virtual clock (``VirtualTime``), so what it checks does not depend on how busy
the machine is; the few tests that must use the real clock are marked ``timing``, with bounds a
loaded 2-core box meets.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from loadgen.sim.model import SimRequest
from loadgen.sim.roofline import RooflineModel


def sim(**kw) -> RooflineModel:
    return RooflineModel("h100", "llama-3.1-8b", **kw)


def req(rid: str, prompt: int, max_tokens: int, arrival_ns: int = 0) -> SimRequest:
    return SimRequest(rid, list(range(prompt)), max_tokens, arrival_ns)


# ---- the asyncio loop, on a virtual clock ------------------------------------------------
class VirtualTime:
    """A model clock that moves only when told: the engine's wait for a step's end moves it there (at
    once, one event-loop turn later), and front-end work moves it by what it costs. Nothing a test
    on it checks depends on how busy the machine is."""

    def __init__(self, now: int = 1_000_000_000) -> None:
        self.now = now
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now

    async def wait_until(self, t: int) -> None:
        await asyncio.sleep(0)  # the event loop runs meanwhile, as it would while the engine waits
        self.now = max(self.now, t)


def virtual_sim(**kw) -> tuple[RooflineModel, VirtualTime]:
    vt = VirtualTime()
    return sim(clock=vt, wait_until=vt.wait_until, **kw), vt


async def _turns_until(cond, turns: int = 100_000) -> None:
    """Yield to the event loop until ``cond()``: counted in loop turns, not in seconds."""
    for _ in range(turns):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not within {turns} event-loop turns")


def test_async_loop_emits_on_schedule_and_records_truth():
    async def main():
        m, vt = virtual_sim()
        await m.start()
        now = vt()
        rs = [req(str(i), 50, 10, arrival_ns=now) for i in range(4)]
        for r in rs:
            m.submit(r)
        await _turns_until(lambda: all(r.finished for r in rs))
        reads = vt.reads
        await asyncio.sleep(0.05)  # idle: the loop waits on an event, it does not poll the clock
        idle_reads = vt.reads - reads
        vt.now += 10**9  # a second later, a new request
        late = req("late", 50, 2, arrival_ns=vt())
        m.submit(late)
        await _turns_until(lambda: late.finished)
        await m.stop()
        return m, rs, late, idle_reads

    m, rs, late, idle_reads = asyncio.run(main())
    assert idle_reads == 0
    for r in rs:
        assert r.emitted == 10 and len(r.emit_ns) == 10
        assert r.emit_ns[0] == r.prefill_end_ns and r.queue_wait_ns == 0
        assert r.prefill_start_ns == r.arrival_ns
        for k in range(1, 10):
            assert r.model_ns[k] - r.model_ns[k - 1] == int(m.decode_step_s(4, 50 + k - 1) * 1e9)
        assert r.emit_ns == r.model_ns  # on time: each token went out at its modelled instant
    assert len({r.model_ns[0] for r in rs}) == 1  # the four prefills shared one step
    # After idling, a new request's step starts at its own arrival, not at wake-up time.
    assert late.prefill_start_ns == late.arrival_ns
    st = m.stats()
    assert st["request_success_total"] == 5 and st["generation_tokens_total"] == 42
    assert st["prompt_tokens_total"] == 250
    assert st["num_requests_running"] == st["num_requests_waiting"] == 0
    assert st["kv_cache_usage_perc"] == 0
    assert st["late_steps_total"] == 0 and st["max_lateness_seconds"] == 0


def test_async_cancel_frees_blocks_and_others_finish():
    async def main():
        m, vt = virtual_sim()
        await m.start()
        keep, drop = req("keep", 30, 20, vt()), req("drop", 30, 200, vt())
        m.submit(keep)
        m.submit(drop)
        await _turns_until(lambda: drop.emitted >= 3)
        m.cancel(drop)
        emitted = drop.emitted
        await _turns_until(lambda: keep.finished)
        await m.stop()
        return m, keep, drop, emitted

    m, keep, drop, emitted = asyncio.run(main())
    assert drop.cancelled and not drop.finished and drop.emitted == emitted < 200
    assert keep.emitted == 20
    assert m.stats()["kv_cache_usage_perc"] == 0 and m.stats()["num_requests_running"] == 0


def test_headroom_spreads_a_burst_of_front_end_work_over_steps():
    """Request handling waits for room between steps, so a burst does not land in one gap: six
    handlers of 4 ms each, against decode steps of ~6.5 ms, go one to a step."""

    async def main():
        m, vt = virtual_sim()
        await m.start()
        await m.headroom(10**9)  # idle: nothing to protect, returns at once
        r = req("a", 50, 100_000, arrival_ns=vt())
        m.submit(r)
        await _turns_until(lambda: r.emitted >= 2)
        at: list[int] = []

        async def handle() -> None:
            await m.headroom(4_000_000)
            at.append(int(m.stats()["steps_total"]))
            vt.now += 4_000_000  # 4 ms of front-end work on the engine's core

        await asyncio.gather(*(handle() for _ in range(6)))
        m.cancel(r)
        await m.stop()
        return m, r, at

    m, r, at = asyncio.run(main())
    assert m.decode_step_s(1, 50) > 0.006  # room for one handler in a step's gap, not two
    assert at == list(range(at[0], at[0] + 6))  # one per step, in order
    assert m.stats()["frontend_waits_total"] == 5  # all but the first waited
    assert m.stats()["late_steps_total"] == 0  # the work fitted the gaps: no step went out late
    assert r.emit_ns == r.model_ns


# ---- the asyncio loop, on the real clock --------------------------------------------------
async def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.002)


@pytest.mark.timing
def test_a_loop_that_falls_behind_counts_lateness_without_shifting_times():
    """Real time: the loop's clock jumps 50 ms ahead of the steps it has planned; lateness only grows
    on a loaded machine, so the bounds are one-sided."""

    class SkewClock:
        skew = 0

        def __call__(self) -> int:
            return time.perf_counter_ns() + self.skew

    async def main():
        clock = SkewClock()
        m = sim(clock=clock)
        await m.start()
        r = req("a", 50, 5, arrival_ns=clock())
        clock.skew = 50_000_000  # from now on the loop reads 50 ms "late" every step
        m.submit(r)
        await _until(lambda: r.finished)
        await m.stop()
        return m, r

    m, r = asyncio.run(main())
    assert m.behind()
    st = m.stats()
    assert st["late_steps_total"] >= 5 and st["max_lateness_seconds"] >= 0.04
    for k in range(1, 5):  # model times kept: not moved to the late real time
        assert r.model_ns[k] - r.model_ns[k - 1] == int(m.decode_step_s(1, 50 + k - 1) * 1e9)
    assert all(e >= m_ for e, m_ in zip(r.emit_ns, r.model_ns, strict=True))  # never before its instant


# ---- the wait the loop uses (loadgen.clock.sleep_until with naps) -------------------------
def test_sleep_until_with_naps_lands_on_the_instant_and_lets_the_loop_run(monkeypatch):
    """The last stretch before the instant: kernel naps of at most ``nap_ns``, one event-loop turn
    after each, and a final nap of exactly what is left. Run on a virtual clock that the naps move."""
    from loadgen import clock as clock_mod

    vt = VirtualTime()
    naps: list[int] = []

    def nap(seconds: float) -> None:
        naps.append(round(seconds * 1e9))
        vt.now += round(seconds * 1e9)

    monkeypatch.setattr(clock_mod.time, "sleep", nap)

    async def main() -> tuple[bool, int]:
        ticks = 0

        async def other() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(other())
        await asyncio.sleep(0)
        due = vt.now + 1_050_000  # inside the spin window: no timer, naps only
        on_time = await clock_mod.sleep_until(due, vt, spin_ns=1_300_000, nap_ns=100_000)
        task.cancel()
        return on_time and vt.now == due, ticks

    landed, ticks = asyncio.run(main())
    assert landed  # exactly at the instant: never early, and no nap past it
    assert naps == [100_000] * 10 + [50_000]
    assert ticks >= 10  # the event loop ran between naps: no stretch longer than one nap without it


@pytest.mark.timing
def test_sleep_until_with_naps_is_never_early_on_the_real_clock():
    """Real time: the wait never returns before its instant, and comes back after it by at most a
    few scheduler slices even on a loaded 2-core box (load average 8: each core shared four ways,
    so a woken process may wait a slice or two of ~3 ms for it). The precision figure on an idle
    core (~0.03 ms late) is benchmarks/sim_capacity.py's, not a test's."""
    from loadgen.clock import sleep_until

    async def main() -> list[int]:
        late = []
        for _ in range(20):
            due = time.perf_counter_ns() + 3_000_000
            await sleep_until(due, spin_ns=1_300_000, nap_ns=100_000)
            late.append(time.perf_counter_ns() - due)
        return late

    late = sorted(asyncio.run(main()))
    assert late[0] >= 0
    assert late[10] < 20_000_000  # the median: a few scheduler slices (a unit slip or a lost wake-up is far more)
