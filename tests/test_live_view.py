"""The live views: what a person watching a run or a sweep reads (elapsed, left, counters, tok/s).

Rendered to a recording console (no terminal needed), on a clock the test sets.
"""

from __future__ import annotations

import io
import pickle
from collections import deque
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from loadgen.analysis.metrics import summarize
from loadgen.analysis.points import point_window
from loadgen.analysis.saturation import Observation
from loadgen.cli.live import LiveView, SweepView
from loadgen.cli.progress import Horizon, LiveSnapshot, duration_text, horizon_of, merge_live, progress
from loadgen.cli.sweep_progress import points_after, step_now, sweep_eta
from loadgen.client.config import LiveCounters
from loadgen.client.settings import RunSettings
from loadgen.records import SCHEMA
from loadgen.schedule import Arrival
from loadgen.sweep import run as sweep_run
from loadgen.sweep.plan import SweepPlan
from loadgen.sweep.run import PointResult, SweepSettings
from loadgen.sweep.search import AutoSearch, Step

S = 1_000_000_000  # ns per second
T0 = 1_000 * S  # the schedule's start instant on the fake clock


class Clock:
    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def counters(**kw: Any) -> LiveCounters:
    c = LiveCounters(start_ns=T0)
    for k, v in kw.items():
        setattr(c, k, deque(v) if k.startswith("recent_") else v)
    return c


def text_of(renderable: Any, width: int = 200) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


# --------------------------------------------------------------------------- merging


def test_merge_live_sums_counts_pools_samples_and_takes_the_earliest_start() -> None:
    a = counters(scheduled=50, sent=40, inflight=3, done=37, errors=1, output_tokens=4000, recent_ttft_ms=[10.0])
    b = counters(scheduled=50, sent=41, inflight=2, done=39, not_sent=2, output_tokens=4100, recent_ttft_ms=[30.0])
    a.span_ns, b.span_ns, b.start_ns = 29 * S, 30 * S, T0 + 5
    m = merge_live([a, b])
    assert (m.engines, m.scheduled, m.sent, m.inflight, m.done) == (2, 100, 81, 5, 76)
    assert (m.errors, m.not_sent, m.output_tokens) == (1, 2, 8100)
    assert sorted(m.ttft_ms) == [10.0, 30.0]
    assert (m.start_ns, m.span_ns) == (T0, 30 * S)


def test_merge_live_has_no_span_while_one_engine_does_not_know_its_own() -> None:
    a, b = counters(), counters()
    a.span_ns = 10 * S
    assert merge_live([a, b]).span_ns is None
    assert merge_live([]) == LiveSnapshot()


def test_engine_troubles_are_summed_and_the_latest_message_kept() -> None:
    a = counters(writer_errors=2, last_error="writer.add: boom")
    b = counters(internal_errors=1, housekeeping_errors=1)
    m = merge_live([a, b])
    assert (m.troubles, m.last_error) == (4, "writer.add: boom")


def test_a_snapshot_keeps_every_counter_and_the_latest_samples_and_crosses_a_pipe() -> None:
    live = counters(sent=7, done=5, output_tokens=640, recent_lag_ms=[float(i) for i in range(1000)])
    live.span_ns, live.stop_ns = 9 * S, T0 + 3 * S
    snap = live.snapshot(recent=100)
    assert list(snap.recent_lag_ms) == [float(i) for i in range(900, 1000)]
    assert (snap.sent, snap.done, snap.output_tokens, snap.span_ns, snap.stop_ns) == (7, 5, 640, 9 * S, T0 + 3 * S)
    assert len(live.recent_lag_ms) == 1000  # the engine's own deques are untouched
    back = pickle.loads(pickle.dumps(snap))
    assert merge_live([back]) == merge_live([snap])


# --------------------------------------------------------------------------- horizon and progress


@pytest.mark.parametrize(
    ("arrival", "duration", "requests", "expected"),
    [
        (Arrival("poisson", rate=4.0), 30.0, None, Horizon(30.0, 60.0)),
        (Arrival("constant", rate=4.0), None, 40, Horizon(10.0, 60.0, 40, exact=True)),
        (Arrival("poisson", rate=4.0), None, 40, Horizon(10.0, 60.0, 40, exact=False)),
        (Arrival("poisson", rate=4.0), 5.0, 40, Horizon(5.0, 60.0, 40)),  # whichever ends first
        (Arrival("closed", concurrency=8), None, 100, Horizon(None, 60.0, 100)),
    ],
)
def test_the_horizon_is_the_duration_or_the_count_at_the_rate(
    arrival: Arrival, duration: float | None, requests: int | None, expected: Horizon
) -> None:
    settings = RunSettings(endpoint=None, model=None, arrival=arrival, duration_s=duration, requests=requests)
    assert horizon_of(settings) == expected


def test_progress_through_the_phases_of_a_point() -> None:
    h = Horizon(30.0, 60.0)
    snap = merge_live([counters()])
    assert progress(merge_live([LiveCounters()]), h, T0).phase == "starting"
    p = progress(snap, h, T0 + 12 * S)
    assert (p.phase, p.elapsed_s, p.left_s, p.about, p.fraction) == ("sending", 12.0, 18.0, False, 0.4)
    p = progress(snap, h, T0 + 40 * S)
    assert (p.phase, p.left_s) == ("draining", 50.0)  # the drain counts from the last scheduled send
    stopped = replace(snap, stop_ns=T0 + 20 * S)
    p = progress(stopped, h, T0 + 25 * S)
    assert (p.phase, p.left_s) == ("stopping", 55.0)


def test_the_engines_own_span_beats_the_estimate_from_the_rate() -> None:
    snap = replace(merge_live([counters()]), span_ns=8 * S)
    p = progress(snap, Horizon(10.0, 5.0, 40, exact=False), T0 + 2 * S)
    assert (p.left_s, p.about) == (6.0, False)


def test_a_closed_loop_that_ends_at_its_count_estimates_from_its_pace() -> None:
    snap = merge_live([counters(done=25)])
    p = progress(snap, Horizon(None, 60.0, 100), T0 + 10 * S)
    assert (p.phase, p.left_s, p.about) == ("sending", 30.0, True)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "?"), (0.04, "0.0 s"), (12.34, "12.3 s"), (65, "1 min 05 s"), (3725, "1 h 02 min")],
)
def test_durations_read_as_a_person_says_them(seconds: float | None, text: str) -> None:
    assert duration_text(seconds) == text


# --------------------------------------------------------------------------- the run view


def run_view(clock: Clock, **kw: Any) -> LiveView:
    settings = RunSettings(endpoint=None, model=None, arrival=Arrival("poisson", rate=4.0), duration_s=30.0, **kw)
    view = LiveView.for_run(settings, enabled=False)
    view.now_ns = clock
    return view


def test_the_run_view_shows_time_counters_throughput_and_latency() -> None:
    clock = Clock(T0 + 12 * S)
    view = run_view(clock)
    live = counters(
        scheduled=120,
        sent=49,
        inflight=5,
        done=46,
        errors=2,
        not_sent=0,
        output_tokens=6000,
        recent_ttft_ms=[20.0] * 99 + [80.0],
        recent_itl_ms=[10.0] * 100,
        recent_lag_ms=[0.2] * 100,
    )
    view.attach(SimpleNamespace(live=live))  # type: ignore[arg-type]  # the view reads only .live
    out = text_of(view)
    assert "loadgen run: poisson @ 4 req/s" in out
    assert "elapsed 12.0 s, 18.0 s left" in out
    assert "scheduled 120 · sent 49 · in flight 5 · done 46 · errors 2 · not sent 0" in out
    assert "500.0 tok/s so far (6,000 tokens)" in out  # 6000 tokens in 12 s
    assert "TTFT p50/p99 20.0 / 20.6 ms · ITL p50/p99 10.0 / 10.0 ms · schedule lag p99 0.2 ms" in out
    assert "above --lag-limit-ms" not in out


def test_the_run_view_says_when_it_drains_and_when_the_client_is_late() -> None:
    clock = Clock(T0 + 35 * S)
    view = run_view(clock, drain_s=30.0)
    view.attach(SimpleNamespace(live=counters(sent=120, recent_lag_ms=[25.0] * 100)))  # type: ignore[arg-type]
    out = text_of(view)
    assert "all sent, waiting for answers in flight: at most 25.0 s more (--drain 30 s)" in out
    assert "schedule lag p99 25.0 ms is above --lag-limit-ms 10" in out


def test_the_run_view_after_ctrl_c() -> None:
    view = run_view(Clock(T0 + 5 * S))
    view.attach(SimpleNamespace(live=counters(stop_ns=T0 + 4 * S)))  # type: ignore[arg-type]
    assert "stopping: sending stopped; answers in flight get at most 59.0 s more" in text_of(view)


def test_with_workers_the_run_view_merges_what_each_worker_sent() -> None:
    clock = Clock(T0 + 10 * S)
    view = run_view(clock, workers=4)
    view.on_shard(0, counters(scheduled=30, sent=10, done=8, output_tokens=1000).snapshot())
    view.on_shard(1, counters(scheduled=30, sent=11, done=9, output_tokens=1000).snapshot())
    view.on_shard(0, counters(scheduled=30, sent=12, done=10, output_tokens=1500).snapshot())  # newer, replaces
    out = text_of(view)
    assert "scheduled 60 · sent 23 · in flight 0 · done 19" in out
    assert "250.0 tok/s so far" in out  # 2500 tokens in 10 s
    assert "2 of 4 worker processes reporting" in out


def test_before_any_engine_the_view_says_it_is_starting() -> None:
    assert "starting" in text_of(run_view(Clock()))


# --------------------------------------------------------------------------- the sweep view


def sweep_settings(plan: SweepPlan) -> SweepSettings:
    return SweepSettings(base=RunSettings(endpoint=None, model=None), plan=plan)


def finished(k: int, step: Step, rate_done: float | None = None) -> PointResult:
    table = SCHEMA.empty_table()
    summary = summarize(table, point_window(table, 2.0)[0], None)
    done = step.rate if rate_done is None else rate_done
    obs = Observation(step.rate, step.rate, done, 100 * done, 100 * step.rate, 30.0, 1.0, 0.0)
    return PointResult(k, step, summary, obs, {}, [])


def test_a_listed_sweep_says_point_i_of_n_and_the_planned_time_left() -> None:
    plan = SweepPlan(
        "rates", (Arrival("poisson", rate=2.0), Arrival("poisson", rate=4.0), Arrival("poisson", rate=8.0))
    )
    clock = Clock(T0)
    view = SweepView(sweep_settings(plan), enabled=False, console=Console(file=io.StringIO()), now_ns=clock)
    view.attach(SimpleNamespace(live=counters()))  # type: ignore[arg-type]
    clock.t = T0 + 3 * S
    # this point: 8 s of sending (2 warm-up + 6 measured), 5 left; then 2 points of 8 s; drains <= 15 s each
    assert view.position() == "point 1 of 3 (#0): 2 req/s; sweep: 21.0 s left (at most 1 min 06 s with every drain)"
    out = text_of(view)
    assert "elapsed 3.0 s, 5.0 s left" in out
    view.on_point(finished(0, plan.fixed_steps()[0]))
    clock.t = T0 + 12 * S
    view.attach(SimpleNamespace(live=counters(start_ns=clock.t)))  # type: ignore[arg-type]
    assert view.position().startswith("point 2 of 3 (#1): 4 req/s; sweep: 16.0 s left")


def test_a_search_says_about_from_the_points_so_far() -> None:
    plan = SweepPlan("auto", auto=AutoSearch(start_rate=2.0, max_rate=16.0))  # ramp 2, 4, 8, 16 at most
    clock = Clock(T0)
    view = SweepView(sweep_settings(plan), enabled=False, console=Console(file=io.StringIO()), now_ns=clock)
    view.attach(SimpleNamespace(live=counters()))  # type: ignore[arg-type]
    assert view.step is not None and view.step.rate == 2.0
    # at most 3 more ramp points and 3 spread points after this one, at the planned 8 s each
    assert view.position() == "point 1 (of at most 7) (#0): 2 req/s (ramp: light load); sweep: about 56.0 s left"
    clock.t = T0 + 10 * S  # the first point took 10 s, drain and summary included
    view.on_point(finished(0, view.step))
    view.attach(SimpleNamespace(live=counters(start_ns=clock.t)))  # type: ignore[arg-type]
    assert view.step is not None and view.step.rate == 4.0  # the search's own next step
    assert view.position() == (
        "point 2 (of at most 7) (#1): 4 req/s (ramp: x2: still keeping up at 2 req/s); "
        "sweep: about 58.0 s left, from the 1 points so far"
    )


def test_a_sweep_of_multi_turn_sessions_says_sessions_per_second_everywhere() -> None:
    plan = SweepPlan("auto", auto=AutoSearch(start_rate=2.0, max_rate=16.0))
    clock = Clock(T0)
    console = Console(file=io.StringIO(), width=400)
    view = SweepView(sweep_settings(plan), enabled=False, console=console, now_ns=clock, unit="sessions/s")
    view.attach(SimpleNamespace(live=counters()))  # type: ignore[arg-type]
    assert view.step is not None
    view.on_point(finished(0, view.step))
    view.attach(SimpleNamespace(live=counters(start_ns=clock.t)))  # type: ignore[arg-type]
    assert "4 sessions/s (ramp: x2: still keeping up at 2 sessions/s)" in view.position()
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "2 sessions/s" in printed and "req/s" not in printed + view.position()


def test_the_view_picks_the_step_the_sweep_sends() -> None:
    """step_now is sweep.run's choice of the next step, for listed points and the search alike."""
    auto = SweepPlan("auto", auto=AutoSearch(start_rate=2.0, max_rate=64.0), has_slo=False)
    listed = SweepPlan("rates", (Arrival("poisson", rate=1.0), Arrival("poisson", rate=3.0)))
    for plan in (auto, listed):
        settings = sweep_settings(plan)
        history: list[tuple[Step, Observation]] = []
        for k in range(6):
            step = step_now(plan, history)
            assert step == sweep_run._steps(settings, history)
            if step is None:
                break
            saturating = step.rate >= 16  # the endpoint serves at most 12 req/s
            history.append((step, finished(k, step, 12.0 if saturating else None).observation))


def test_points_after_counts_what_the_search_may_still_send() -> None:
    plan = SweepPlan("auto", auto=AutoSearch(start_rate=2.0, max_rate=256.0), has_slo=True)
    ramp = Step(Arrival("poisson", rate=2.0), "ramp", "light load", 6.0)
    assert points_after(plan, [], ramp) == 7 + 3 + 4  # 8 ramp points at most, 3 spread, 4 bisection
    eta = sweep_eta(plan, [], ramp, point_left_s=4.0, drain_left_s=15.0, point_walls_s=[10.0, 12.0])
    assert (eta.left_s, eta.about, eta.more) == (4.0 + 14 * 11.0, True, 14)
