"""Sweep planning as pure functions (a model endpoint drives the search), and one short
``--auto`` sweep against the roofline simulator that must find its analytic capacity."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from loadgen.analysis.attainment import attainment_interval, capacity_at_slo, samples_to_confirm
from loadgen.analysis.saturation import Observation, saturation_reason
from loadgen.client.settings import RunSettings
from loadgen.errors import ConfigError
from loadgen.run_folder import read_run_meta
from loadgen.schedule import Arrival
from loadgen.sim.roofline import RooflineModel
from loadgen.sweep.plan import SweepPlan, parse_list
from loadgen.sweep.run import SweepSettings, point_salt, run_sweep
from loadgen.sweep.search import AutoSearch, Step, next_step, search_end
from loadgen.workload.base import SyntheticChat

# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "integer", "expected"),
    [
        ("1,2,4", False, [1.0, 2.0, 4.0]),
        ("0.5, 1.5", False, [0.5, 1.5]),
        ("1:16:x2", False, [1.0, 2.0, 4.0, 8.0, 16.0]),
        ("5:20:+5", False, [5.0, 10.0, 15.0, 20.0]),
        ("1,4:8:x2", True, [1.0, 4.0, 8.0]),
    ],
)
def test_parse_list(text: str, integer: bool, expected: list[float]) -> None:
    assert parse_list(text, "--rates", integer=integer) == expected


@pytest.mark.parametrize("bad", ["", "a", "0", "-1", "1,1", "4:1:x2", "1:8:x1", "1:8:*2", "1.5"])
def test_parse_list_rejects(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_list(bad, "--concurrency", integer=True)


# --------------------------------------------------------------------------- statistics


def test_samples_to_confirm_matches_the_binomial_rule() -> None:
    assert samples_to_confirm(99, 0.95) == 299  # 0.99**299 <= 0.05 < 0.99**298
    assert samples_to_confirm(90, 0.95) == 29
    for target, conf in ((99, 0.95), (95, 0.9)):
        n = samples_to_confirm(target, conf)
        assert attainment_interval(n, n, conf)[0] >= target / 100 > attainment_interval(n - 1, n - 1, conf)[0]


@pytest.mark.parametrize(("met", "n"), [(0, 10), (5, 10), (10, 10), (990, 1000), (1, 1)])
def test_attainment_interval_brackets_the_estimate(met: int, n: int) -> None:
    lo, hi = attainment_interval(met, n)
    assert 0.0 <= lo <= met / n <= hi <= 1.0


@pytest.mark.parametrize(
    ("points", "target", "rate", "lower", "upper", "confirmed"),
    [
        # clean passes with enough samples, then a clear miss
        ([(5, 400, 400), (10, 400, 400), (20, 100, 400)], 99, 10, 10, 20, True),
        # the top passing point has too few samples to confirm: estimate 10, confirmed only 5
        ([(5, 400, 400), (10, 50, 50), (20, 10, 100)], 99, 10, 5, 20, False),
        # nothing misses: capacity is at least the highest rate
        ([(5, 400, 400), (10, 400, 400)], 99, 10, 10, math.inf, True),
        # everything misses
        ([(5, 10, 100), (10, 0, 100)], 99, None, 0.0, 5, False),
        # non-monotone noise above the first miss does not count as a pass
        ([(5, 400, 400), (10, 300, 400), (15, 400, 400)], 99, 5, 5, 10, True),
    ],
)
def test_capacity_at_slo(
    points: list[tuple[float, int, int]], target: float, rate: float | None, lower: float, upper: float, confirmed: bool
) -> None:
    c = capacity_at_slo(points, target)
    assert (c.rate, c.lower, c.upper, c.confirmed) == (rate, lower, upper, confirmed)
    assert c.note


# --------------------------------------------------------------------------- saturation and the search


def model_endpoint(
    rate: float, capacity: float = 40.0, slo_capacity: float = 30.0, out_tokens: int = 100, window_s: float = 30.0
) -> Observation:
    """A made-up endpoint: completes min(rate, capacity); TTFT climbs near capacity; attainment
    is perfect below ``slo_capacity`` and falls linearly above it."""
    done = min(rate, capacity)
    util = min(rate / capacity, 0.999)
    ttft = 20 / (1 - util) if rate < capacity else 20_000.0
    n = int(rate * window_s)
    att = 1.0 if rate <= slo_capacity else max(0.0, 1 - (rate - slo_capacity) / slo_capacity)
    return Observation(
        rate=rate,
        offered_rps=rate,
        completed_rps=done,
        output_tps=done * out_tokens,
        expected_output_tps=rate * out_tokens,
        ttft_p50_ms=ttft,
        lag_p99_ms=1.0,
        failed_pct=0.0,
        met=int(att * n),
        n=n,
    )


def drive(cfg: AutoSearch, has_slo: bool, **endpoint: float) -> list[tuple[Step, Observation]]:
    history: list[tuple[Step, Observation]] = []
    while (step := next_step(cfg, history, point_duration_s=30.0, has_slo=has_slo)) is not None:
        history.append((step, model_endpoint(step.rate, **endpoint)))
        assert len(history) < 40, "the search must terminate"
    return history


def test_an_endpoint_saturated_at_the_start_rate_is_ramped_down_until_a_point_keeps_up() -> None:
    cfg = AutoSearch(start_rate=15, factor=2, max_rate=256)
    history = drive(cfg, has_slo=True, capacity=3.0, slo_capacity=2.5)
    ramp = [(s.rate, s.why) for s, _ in history if s.phase == "ramp"]
    assert [r for r, _ in ramp] == [15, 7.5, 3.75]  # down while every point is past saturation; 3.75 keeps up
    assert [w for _, w in ramp[1:]] == [
        "/2: already past saturation at 15 req/s",
        "/2: already past saturation at 7.5 req/s",
    ]
    assert search_end(cfg, history).startswith("saturated: delivered 40% of the offered load at 7.5 req/s")
    assert [s.rate for s, _ in history if s.phase == "spread"] == [1.5, 2.25, 2.7]  # around the 3 req/s found
    assert [(s.rate, o.met == o.n) for s, o in history if s.phase == "bisect"] == [(2.46, True)]
    never = drive(cfg, has_slo=False, capacity=0.01)
    assert [s.rate for s, _ in never if s.phase == "ramp"] == [15, 7.5, 3.75, 1.88, 0.94]  # at most 4 steps down


def test_saturation_reasons() -> None:
    light = model_endpoint(5)
    assert saturation_reason(None, light) is None
    assert "delivered" in (saturation_reason(light, model_endpoint(80)) or "")
    failing = Observation(10, 10, 5, 1000, 1000, 30, 1, 50.0)
    assert "failed" in (saturation_reason(None, failing) or "")
    # throughput flat while the load doubled and TTFT climbed: saturated even though "delivered" is not computable
    a = Observation(10, 10, 10, 1000, math.nan, 30, 1, 0.0)
    b = Observation(20, 20, 19.0, 1040, math.nan, 300, 1, 0.0)  # requests keep up, tokens do not
    assert "rose only" in (saturation_reason(a, b) or "")


def test_auto_search_ramps_to_saturation_then_spreads() -> None:
    cfg = AutoSearch(start_rate=2, factor=2, spread=(0.5, 0.75, 0.9))
    history = drive(cfg, has_slo=False, capacity=40.0)
    ramp = [s.rate for s, _ in history if s.phase == "ramp"]
    assert ramp == [2, 4, 8, 16, 32, 64]  # 64 > 40 / 0.9: the first point that cannot keep up
    spread = [s.rate for s, _ in history if s.phase == "spread"]
    assert spread == [20.0, 36.0]  # 75% (30) is within 10% of the measured 32: not repeated
    assert all(s.duration_s == 30.0 for s, _ in history)
    assert search_end(cfg, history).startswith("saturated")
    assert len(history) <= SweepPlan("auto", auto=cfg).max_points()


def test_auto_search_bisects_capacity_at_slo() -> None:
    cfg = AutoSearch(start_rate=2, factor=2, spread=(), tolerance=0.05, max_bisect=8)
    history = drive(cfg, has_slo=True, capacity=40.0, slo_capacity=24.0)
    bisect = [s for s, _ in history if s.phase == "bisect"]
    assert bisect and all(16 < s.rate < 32 for s in bisect)
    c = capacity_at_slo([(o.rate, o.met or 0, o.n) for _, o in history], cfg.target_pct)
    assert c.rate is not None and 24 / 1.05 <= c.rate <= 24.0
    # bisection points run long enough to confirm a clean pass (299 requests), within the stretch cap
    for s in bisect:
        assert s.duration_s == min(max(30.0, 299 / s.rate), 90.0)


def test_auto_search_stops_at_max_rate_and_on_client_lag() -> None:
    cfg = AutoSearch(start_rate=2, max_rate=16)
    history = drive(cfg, has_slo=False, capacity=1e9)
    assert [s.rate for s, _ in history] == [2, 4, 8, 16]
    assert "max-rate" in search_end(cfg, history)
    lagging = Observation(4, 4, 4, 400, 400, 20, 50.0, 0.0, client_limited=True)
    step = Step(Arrival("poisson", rate=4), "ramp", "", 1.0)
    assert next_step(cfg, [(step, lagging)], point_duration_s=1.0, has_slo=False) is None
    assert "client fell behind" in search_end(cfg, [(step, lagging)])


def test_plan_bounds_and_description() -> None:
    plan = SweepPlan(
        "rates",
        arrivals=(Arrival("poisson", rate=1), Arrival("poisson", rate=2)),
        point_duration_s=10,
        warmup_s=2,
        drain_s=5,
    )
    assert plan.time_bound_s() == (24.0, 34.0)
    assert "2 points" in plan.describe()
    auto = SweepPlan("auto", point_duration_s=8, warmup_s=2, drain_s=15, has_slo=True)
    send, bound = auto.time_bound_s()
    assert auto.max_points() == 8 + 3 + 4
    assert send == 11 * 10 + 4 * (2 + 24) and bound == send + 15 * 15
    assert "at most 15 points" in auto.describe()
    unsized = SweepPlan("auto")  # with --point-duration (a bare `loadgen sweep` is sized: test_sweep_sizing)
    assert unsized.time_bound_s()[0] <= 120
    with pytest.raises(ConfigError):
        SweepPlan("rates")
    with pytest.raises(ConfigError):
        AutoSearch(target_pct=100)


# --------------------------------------------------------------------------- against the simulator

SIM = ["--gpu", "a100", "--model", "llama-3.1-8b", "--max-num-seqs", "4"]
SHAPE = (128, 32)


@pytest.mark.timing  # the simulator serves in real time; the factor-2 band and 18 >> 11.5 req/s hold under load
def test_auto_sweep_finds_the_simulators_capacity(tmp_path: Path) -> None:
    """Ramp x3 from 6 req/s on a deliberately small engine (a100, 4 sequences: ~11.5 req/s analytic)."""
    analytic = RooflineModel("a100", "llama-3.1-8b", max_num_seqs=4).saturation_estimate(*SHAPE)
    auto = AutoSearch(start_rate=6, factor=3, max_rate=200, spread=())
    plan = SweepPlan("auto", point_duration_s=1.5, warmup_s=0.5, drain_s=1.0, auto=auto)
    base = RunSettings(endpoint=None, model=None, duration_s=2.0, warmup_s=0.5, lag_limit_ms=50.0)
    settings = SweepSettings(base=base, plan=plan)
    out = tmp_path / "sweep"
    result = run_sweep(settings, lambda salt: SyntheticChat(*SHAPE, seed=0, salt=salt), out, sim_flags=SIM)
    rates = [p.step.rate for p in result.points]
    if any(p.observation.validity.withholding.suspect for p in result.points):
        pytest.skip(f"this box made a point suspect, so no saturation call is made: {result.points[-1].caveats}")
    # 18 > 11.5 req/s: the engine falls behind at once; a 1 s window at 18 req/s holds too few
    # requests to call it (MIN_REQUESTS), 54 req/s is called
    assert rates[:2] == [6.0, 18.0] and len(rates) <= 3
    achieved = max(p.summary.completed_rps for p in result.points)
    assert analytic.requests_per_s / 2 <= achieved <= analytic.requests_per_s * 2
    meta = read_run_meta(out)
    assert meta["sweep"]["search_end"].startswith("saturated")
    # a fresh sweep salt (recorded), and each point's own part on it
    assert meta["salt_source"] == "fresh" and len(meta["salt"]) == 6
    resolved = replace(settings, salt=meta["salt"])
    assert [p["salt"] for p in meta["points"]] == [point_salt(resolved, k) for k in range(len(rates))]
    assert (out / "records.parquet").exists() and not list(out.glob("*.arrows"))

    from loadgen.analysis.points import analyze_run
    from loadgen.records import read_records

    table = read_records(out)
    assert sorted(set(table.column("point").to_pylist())) == list(range(len(rates)))
    analysis = analyze_run(out, table=table)  # the report of the same folder (rendering: test_report_html)
    if analysis.validity.withholding.suspect:  # e.g. a busy box made the simulator late: no call on suspect data
        assert analysis.saturation is None
    elif any(analysis.point_validity(p).withholding.suspect for p in analysis.points):
        pass  # the report reads the simulator's own health, which the sweep's live judgement lacked
    else:
        assert analysis.saturation is not None and analysis.frontier


@pytest.mark.timing  # a signal 1 s into a 4 s point lands inside it on any box
def test_a_sweep_stopped_by_sigint_keeps_its_interrupted_point_and_sends_no_other(tmp_path: Path) -> None:
    import os
    import signal
    import threading

    from loadgen.client.engine import Engine

    plan = SweepPlan("rates", arrivals=(Arrival("poisson", rate=5.0), Arrival("poisson", rate=10.0)),
                     point_duration_s=4.0, warmup_s=0.0, drain_s=5.0)  # fmt: skip
    base = RunSettings(endpoint=None, model=None, duration_s=4.0, lag_limit_ms=50.0)
    out = tmp_path / "sweep"

    def interrupt_soon(engine: Engine) -> None:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()

    result = run_sweep(
        SweepSettings(base=base, plan=plan),
        lambda salt: SyntheticChat(16, 4, seed=0, salt=salt),
        out,
        sim_flags=["--ttft-ms", "10", "--itl-ms", "10"],
        on_engine=interrupt_soon,
    )
    assert result.interrupted and result.stop_reason == "SIGINT" and len(result.points) == 1
    meta = read_run_meta(out)
    assert (meta["state"], meta["interrupted_reason"]) == ("interrupted", "SIGINT")
    [point] = meta["points"]  # the stopped point is kept; the second was never started
    assert (point["state"], point["interrupted_reason"]) == ("interrupted", "SIGINT")
    assert point["client"]["interrupted"] is True
    with pytest.raises(ConfigError, match="--force"):  # the folder holds a run now
        run_sweep(SweepSettings(base=base, plan=plan), lambda salt: SyntheticChat(16, 4), out)


@pytest.mark.parametrize("report", [True, False])
def test_a_sweep_writes_report_html_unless_told_not_to(tmp_path: Path, report: bool) -> None:
    from loadgen.cli.main import main

    out = tmp_path / "sweep"
    argv = ["sweep", "--sim-virtual", "--rates", "2,4", "--point-duration", "4", "--warmup", "1"]
    argv += ["--input-tokens", "32", "--output-tokens", "8", "--no-live", "--out", str(out)]
    assert main(argv if report else [*argv, "--no-report"]) == 0
    assert (out / "summary.json").exists() and (out / "records.parquet").exists()
    assert (out / "report.html").exists() is report and (out / "pareto.svg").exists() is report
