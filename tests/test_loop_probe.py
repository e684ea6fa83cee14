"""The client's self-check (loop_probe.py): loop lag and read lateness, on virtual time.

A stall of the loop counts every probe tick it swallowed; a loop kept busy by 2 ms callbacks
makes each read wait 2 ms, and the probe's read lateness says so; the run.json figures of
several workers merge by taking the worst.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loadgen.client.loop_probe import PERIOD_NS, READ_EVERY, LagHistogram, LoopProbe
from loadgen.client.shards import merge_health
from loadgen.clock import VirtualClock, run_virtual

MS = 1_000_000


def test_the_histogram_keeps_quantiles_within_its_error_and_the_maximum_exactly() -> None:
    h = LagHistogram()
    assert h.quantile_ms(0.99) == 0.0
    for us in range(1, 100_001):  # 1 us to 100 ms, evenly
        h.record(us * 1000)
    assert h.max_ns == 100 * MS and h.n == 100_000
    for q in (0.5, 0.9, 0.99):
        assert h.quantile_ms(q) == pytest.approx(q * 100, rel=0.02)
    assert h.quantile_ms(1.0) == 100.0
    h.record(-5)  # a timer that fired a hair early: not late
    assert h.quantile_ms(0.0) == 0.001


def _probe_run(clock: VirtualClock, seconds: float, during: Any = None) -> LoopProbe:
    async def go() -> LoopProbe:
        probe = LoopProbe(clock)
        probe.start()
        if during is not None:
            during(asyncio.get_running_loop())
        await asyncio.sleep(seconds)
        probe.stop()
        return probe

    return run_virtual(go(), clock)


def test_a_stall_counts_every_tick_it_swallowed() -> None:
    """A 100 ms stall in 1 s, from just before a tick: that tick is 100 ms late, and the nine it
    swallowed are counted too (90, 80, ... 10 ms): one sample in ~100 would hide it from the p95."""
    clock = VirtualClock()

    def stall(loop: asyncio.AbstractEventLoop) -> None:
        loop.call_later(0.4999, clock.advance, 100 * MS)

    probe = _probe_run(clock, 1.0, stall)
    assert 99.8 <= probe.lag_max_ms <= 100
    assert probe.lag.n == pytest.approx(100, abs=2)
    assert 39 <= probe.lag.quantile_ms(0.95) <= 61  # the stall's ten ticks, 10 ms apart, are the top 10%
    assert probe.lag.quantile_ms(0.85) < 0.1  # the rest on time


def test_reads_waiting_behind_busy_callbacks_show_as_read_lateness() -> None:
    """The loop always has a 2 ms callback ready: a read that becomes ready waits for it."""
    clock = VirtualClock()

    def busy(loop: asyncio.AbstractEventLoop) -> None:
        def work() -> None:
            clock.advance(2 * MS)
            loop.call_soon(work)

        loop.call_soon(work)

    probe = _probe_run(clock, 0.5, busy)
    assert probe.reads.n >= 0.5e9 / PERIOD_NS / READ_EVERY - 2  # one sample every READ_EVERY ticks
    assert 2.0 <= probe.read_p99_ms <= 2.1
    assert 2.0 <= probe.lag_p99_ms <= 4.1  # a timer waits for a callback, as a read does


def test_an_idle_loop_reads_at_once() -> None:
    probe = _probe_run(VirtualClock(), 0.2)
    assert probe.read_p99_ms < 0.01 and probe.lag_max_ms < 0.01 and probe.reads.n >= 4


def _worker(lag99: float, lagmax: float, read99: float) -> dict[str, Any]:
    return {
        "clock_anchor": {},
        "cpu_seconds": 1.0,
        "wall_seconds": 2.0,
        "sends_delayed_by_max_inflight": 0,
        "loop_lag_p99_ms": lag99,
        "loop_lag_max_ms": lagmax,
        "read_lateness_p99_ms": read99,
    }


def test_workers_merge_to_the_worst_of_their_self_checks() -> None:
    merged = merge_health([_worker(1.0, 30.0, 0.5), _worker(12.0, 20.0, 3.0)])
    assert (merged["loop_lag_p99_ms"], merged["loop_lag_max_ms"], merged["read_lateness_p99_ms"]) == (12.0, 30.0, 3.0)
