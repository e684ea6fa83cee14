"""The newcomer's first sweep is a valid one: point sizing, and what a bare ``loadgen sweep`` chooses.

Each point runs until its window holds the samples its p99 verdicts need (within a cap per
point and for the sweep), as a pure function of the settings and the points so far; a bare
``loadgen sweep`` judges by a default SLO profile and prices tokens at a labelled example
price. One short sized sweep of the fixed-latency simulator checks what run.json records.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hand_runs import make_run
from scipy import stats as sps

from loadgen.analysis.metrics import summarize
from loadgen.analysis.saturation import Observation
from loadgen.analysis.validity import Caveat, Validity, summary_caveats
from loadgen.cli.main import build_parser
from loadgen.cli.sweep_cmd import settings_from_args
from loadgen.cli.sweep_defaults import EXAMPLE_PRICE, defaults_note, sizing_note
from loadgen.client.settings import RunSettings
from loadgen.errors import ConfigError
from loadgen.records import read_records
from loadgen.run_folder import read_run_meta
from loadgen.schedule import Arrival
from loadgen.sim.roofline import RooflineModel
from loadgen.sweep.plan import SweepPlan
from loadgen.sweep.run import SweepSettings, point_simulator, run_sweep
from loadgen.sweep.search import AutoSearch, Step, next_step, search_end, spent_s
from loadgen.sweep.sizing import Sizing, expected_for, nice_rate_at_least, samples_needed
from loadgen.workload.base import SyntheticChat

# --------------------------------------------------------------------------- how many samples


def _few_samples(d: Path, n: int) -> bool:
    caveats = summary_caveats(summarize(read_records(make_run(d, [50.0] * n))))
    return any(c.code == "few_samples" for c in caveats)


def test_samples_needed_is_exactly_where_the_few_samples_warning_stops(tmp_path: Path) -> None:
    n = samples_needed()
    assert n == 368  # a p99 with both ends of its 95% interval finite
    assert _few_samples(tmp_path / "short", n - 1)
    assert not _few_samples(tmp_path / "enough", n)


def test_an_slo_target_that_needs_more_to_confirm_raises_the_count() -> None:
    assert samples_needed(0.95, 99.0) == 368  # confirming 99% needs 299: the p99 rule decides
    assert samples_needed(0.95, 99.9) == 2995  # confirming 99.9% needs more than the p99 rule


@pytest.mark.parametrize("needed", [30, 368, 2995])
def test_a_poisson_window_sized_by_expected_for_holds_enough_99_times_in_100(needed: int) -> None:
    mean = expected_for(needed, cv=1.0)
    assert mean > needed
    assert sps.poisson.cdf(needed - 1, mean) <= 0.011  # fewer than needed: about a 1-in-100 event
    assert mean <= needed + 3 * math.sqrt(needed) + 2  # and no longer than a 3-sigma margin


def test_a_constant_arrival_needs_no_margin_but_the_window_edge() -> None:
    assert expected_for(368, cv=0.0) == 369


# --------------------------------------------------------------------------- a point's window

Z = Sizing(samples=368, min_s=6.0, max_point_s=30.0, max_total_s=150.0)


@pytest.mark.parametrize(
    ("rate", "spent", "duration", "capped"),
    [
        (15.0, 0.0, 27.8, ""),  # 417 expected / 15 req/s
        (60.0, 0.0, 6.95, ""),
        (200.0, 0.0, 6.0, ""),  # never shorter than min_s
        (8.0, 0.0, 30.0, "point"),  # would need 52 s
        (15.0, 140.0, 10.0, "sweep"),  # 10 s of the sweep's budget left
        (15.0, 149.0, 6.0, "sweep"),  # a listed point still runs its shortest window
        (None, 0.0, 30.0, "point"),  # a closed loop with no estimate: the cap
    ],
)
def test_a_point_runs_until_it_holds_its_samples_within_the_caps(
    rate: float | None, spent: float, duration: float, capped: str
) -> None:
    sized = Z.sized(rate, spent)
    assert (sized.duration_s, sized.capped) == (duration, capped)
    if rate is not None:
        assert sized.needed_s == pytest.approx(Z.expected() / rate, abs=1e-3)


def test_sizing_rejects_caps_that_contradict_each_other() -> None:
    with pytest.raises(ConfigError, match="--max-point-duration"):
        Sizing(min_s=10.0, max_point_s=5.0)
    with pytest.raises(ConfigError, match="--max-sweep-duration"):
        Sizing(min_s=6.0, max_total_s=5.0)


@pytest.mark.parametrize(("rate", "nice"), [(13.85, 15.0), (15.0, 15.0), (0.3, 0.3), (2.1, 2.5), (91.0, 100.0)])
def test_nice_rate_at_least(rate: float, nice: float) -> None:
    assert nice_rate_at_least(rate) == nice


# --------------------------------------------------------------------------- the plan


def test_a_listed_sweep_plans_sized_windows_from_its_settings_alone() -> None:
    rates = tuple(Arrival("poisson", rate=r) for r in (8.0, 30.0, 120.0))
    plan = SweepPlan("rates", rates, point_duration_s=6.0, warmup_s=2.0, sizing=Z)
    steps = plan.fixed_steps()
    assert [(s.duration_s, s.capped) for s in steps] == [(30.0, "point"), (13.9, ""), (6.0, "")]
    assert steps == SweepPlan("rates", rates, point_duration_s=6.0, warmup_s=2.0, sizing=Z).fixed_steps()
    assert plan.time_bound_s()[0] == pytest.approx(3 * 2.0 + 30.0 + 13.9 + 6.0)
    assert "hold >= 368 requests" in plan.describe()
    unsized = SweepPlan("rates", rates, point_duration_s=6.0)  # --point-duration given: it wins
    assert [s.duration_s for s in unsized.fixed_steps()] == [6.0, 6.0, 6.0]


def _obs(rate: float, completed: float, lag_p99_ms: float = 1.0, validity: Validity | None = None) -> Observation:
    return Observation(
        rate=rate,
        offered_rps=rate,
        completed_rps=completed,
        output_tps=completed * 100,
        expected_output_tps=rate * 100,
        ttft_p50_ms=30.0 if completed >= rate else 3000.0,
        lag_p99_ms=lag_p99_ms,
        failed_pct=0.0,
        n=int(rate * 20) if math.isfinite(rate) else 0,
        validity=validity or Validity(),
    )


def test_a_concurrency_point_is_sized_by_the_rate_the_point_before_completed() -> None:
    users = tuple(Arrival("closed", concurrency=c) for c in (4, 16, 2))
    plan = SweepPlan("concurrency", users, sizing=Z)
    first = plan.next_step([])
    assert first is not None and (first.duration_s, first.capped) == (30.0, "point")  # no rate known yet
    second = plan.next_step([(first, _obs(math.nan, 20.0))])
    assert second is not None and second.duration_s == round(Z.expected() / 20.0, 3)  # more users: >= 20 req/s
    third = plan.next_step([(first, _obs(math.nan, 20.0)), (second, _obs(math.nan, 40.0))])
    assert third is not None and third.duration_s == 30.0 and third.capped == "point"  # 2 of 16 users: >= 5 req/s


def endpoint(rate: float, capacity: float = 52.0, slo_rate: float = 24.0) -> Observation:
    """The default simulator, roughly: serves up to ``capacity``; meets the SLO up to ``slo_rate``."""
    done, n = min(rate, capacity), int(rate * 20)
    return replace(_obs(rate, done), met=n if rate <= slo_rate else int(n * 0.9), n=n)


def test_the_sized_search_sizes_every_point_and_stops_when_its_budget_is_spent() -> None:
    cfg = AutoSearch(start_rate=15.0, max_rate=256.0)
    history: list[tuple[Step, Observation]] = []
    while (step := next_step(cfg, history, point_duration_s=6.0, has_slo=True, sizing=Z)) is not None:
        assert step.duration_s == Z.sized(step.rate, spent_s(history)).duration_s
        history.append((step, endpoint(step.rate)))
    rates = [s.rate for s, _ in history]
    assert rates[:3] == [15.0, 30.0, 60.0]  # the ramp saturates at 60 > 52 req/s
    assert spent_s(history) <= Z.max_total_s
    tight = Sizing(max_total_s=45.0)
    short: list[tuple[Step, Observation]] = []
    while (step := next_step(cfg, short, point_duration_s=6.0, has_slo=True, sizing=tight)) is not None:
        short.append((step, endpoint(step.rate)))
    assert [s.rate for s, _ in short] == [15.0, 30.0]  # 27.8 + 13.9 s: less than 6 s is left
    assert "--max-sweep-duration" in search_end(cfg, short, tight)


def test_the_ramp_stops_at_a_suspect_point_that_looks_saturated_without_calling_it() -> None:
    cfg = AutoSearch(start_rate=15.0, max_rate=256.0, spread=())
    lagging = Validity.of([Caveat("client_lag", "schedule lag p99 is 41.6 ms (limit 10 ms)")])
    history = [
        (Step(Arrival("poisson", rate=15.0), "ramp", "light load", 27.8), _obs(15.0, 15.0)),
        (Step(Arrival("poisson", rate=30.0), "ramp", "x2", 13.9), _obs(30.0, 30.0)),
        (Step(Arrival("poisson", rate=60.0), "ramp", "x2", 6.95), _obs(60.0, 40.0, 41.6, lagging)),
    ]
    assert next_step(cfg, history, point_duration_s=6.0, has_slo=False, sizing=Z) is None  # no 120 req/s
    end = search_end(cfg, history, Z)
    assert end.startswith("stopped at 60 req/s") and "client_lag" in end and "not called saturated" in end


def test_a_suspect_bisection_point_is_retried_once_not_again_and_again() -> None:
    cfg = AutoSearch(start_rate=15.0, max_rate=30.0, spread=(), max_bisect=4)  # the ramp ends at 30
    lagging = Validity.of([Caveat("client_lag", "schedule lag p99 is 17.0 ms (limit 10 ms)")])

    def seen(rate: float, met: float, validity: Validity | None = None) -> Observation:
        return replace(_obs(rate, rate, validity=validity), met=int(met * rate * 20), n=int(rate * 20))

    history = [
        (Step(Arrival("poisson", rate=15.0), "ramp", "", 27.8), seen(15.0, 1.0)),
        (Step(Arrival("poisson", rate=30.0), "ramp", "", 13.9), seen(30.0, 0.9)),
    ]
    first = next_step(cfg, history, point_duration_s=6.0, has_slo=True, sizing=Z)
    assert first is not None and first.phase == "bisect" and first.rate == 21.2
    history.append((first, seen(21.2, 1.0, lagging)))  # the box made it suspect: no bracket
    retry = next_step(cfg, history, point_duration_s=6.0, has_slo=True, sizing=Z)
    assert retry is not None and retry.rate == 21.2 and "again" in retry.why and "client_lag" in retry.why
    history.append((retry, seen(21.2, 1.0, lagging)))
    assert next_step(cfg, history, point_duration_s=6.0, has_slo=True, sizing=Z) is None


# --------------------------------------------------------------------------- a bare `loadgen sweep`


def _settings(monkeypatch: pytest.MonkeyPatch, *argv: str) -> SweepSettings:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    return settings_from_args(build_parser().parse_args(["sweep", *argv]))


def test_a_bare_sweep_judges_by_the_default_slo_at_a_labelled_example_price(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _settings(monkeypatch)
    assert (s.slo_name, s.slo_is_default, s.plan.has_slo) == ("interactive-chat", True, True)
    assert s.price_is_example and list(s.prices.values()) == [EXAMPLE_PRICE]
    [label] = s.prices
    assert label.startswith("example price")  # every cost column carries it; the notes say how to give yours
    assert (s.gpus, s.gpus_is_default) == (1.0, True)  # the simulator's own --sim-tp
    notes = defaults_note(s)
    assert any("default profile interactive-chat" in n for n in notes)
    assert any("example price" in n and "--price-per-gpu-hour" in n for n in notes)


def test_a_bare_sweep_is_sized_and_starts_where_a_point_fills_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _settings(monkeypatch).plan
    assert plan.mode == "auto" and plan.sizing == Sizing(samples=368)
    assert plan.auto.start_rate == 15.0  # 417 expected requests in 30 s: 13.9 req/s, rounded up
    # the built-in simulator's default engine saturates between the third ramp point and the second
    sat = RooflineModel("h100", "llama-3.1-8b").saturation_estimate(512, 128).requests_per_s
    assert plan.auto.start_rate * 2 < sat < plan.auto.start_rate * 4
    assert plan.time_bound_s()[0] <= 200  # the windows' budget plus every warm-up


@pytest.mark.parametrize(
    ("argv", "check"),
    [
        (["--point-duration", "6"], lambda s: s.plan.sizing is None and s.plan.auto.start_rate == 2.0),
        (["--max-rate", "8"], lambda s: s.plan.auto.start_rate == 8.0),
        (["--start-rate", "3"], lambda s: s.plan.auto.start_rate == 3.0),
        (["--slo", "none"], lambda s: s.slo is None and not s.plan.has_slo and not s.slo_is_default),
        (["--slo", "ttft=500"], lambda s: s.slo is not None and s.slo.ttft_ms == 500 and not s.slo_is_default),
        (["--price-per-gpu-hour", "3"], lambda s: not s.price_is_example and s.prices == {"$3/GPU-h": 3.0}),
        (["--gpus", "8"], lambda s: (s.gpus, s.gpus_is_default) == (8.0, False)),
        (["--endpoint", "http://127.0.0.1:9/v1"], lambda s: s.gpus is None and s.price_is_example),
        (["--max-point-duration", "60"], lambda s: s.plan.sizing is not None and s.plan.auto.start_rate == 8.0),
    ],
)
def test_explicit_flags_win_over_the_defaults(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], check: Callable[[SweepSettings], bool]
) -> None:
    assert check(_settings(monkeypatch, *argv))


def test_the_note_after_the_sweep_names_each_point_a_cap_cut_short() -> None:
    steps = Z.sized(8.0), Z.sized(30.0)
    sent = [
        Step(Arrival("poisson", rate=8.0), "ramp", "", steps[0].duration_s, steps[0].needed_s, steps[0].capped),
        Step(Arrival("poisson", rate=30.0), "ramp", "", steps[1].duration_s, steps[1].needed_s, steps[1].capped),
    ]
    note = sizing_note(Z, sent)
    assert note == (
        "sizing: 1 of 2 points hit a cap before holding 368 requests, so their p99s may be open intervals: "
        "8 req/s ran 30 s (needed 52 s; cut by --max-point-duration 30 s)"
    )
    assert (sizing_note(Z, sent[1:]) or "").startswith("sizing: every point ran until its window held the 368")
    assert sizing_note(None, sent) is None


# --------------------------------------------------------------------------- what run.json records


def test_a_sized_sweep_records_its_sizing_slo_and_example_price(tmp_path: Path) -> None:
    tiny = Sizing(samples=20, min_s=0.5, max_point_s=1.0, max_total_s=10.0)  # 10 req/s needs ~3 s: capped
    plan = SweepPlan("rates", (Arrival("constant", rate=10.0), Arrival("constant", rate=40.0)), 0.5, 0.2, 2.0,
                     kind="constant", sizing=tiny)  # fmt: skip
    base = RunSettings(endpoint=None, model=None, duration_s=1.0, lag_limit_ms=50.0)
    settings = SweepSettings(
        base=base, plan=plan, prices={"example": 2.5}, price_is_example=True, gpus=1.0, gpus_is_default=True
    )
    out = tmp_path / "sweep"
    run_sweep(settings, lambda salt: SyntheticChat(16, 4, seed=0, salt=salt), out, sim_flags=["--ttft-ms", "5"])
    meta = read_run_meta(out)
    sw = meta["sweep"]
    assert sw["sizing"] == {
        "samples": 20,
        "expected_samples": 21.0,
        "min_point_s": 0.5,
        "max_point_s": 1.0,
        "max_total_s": 10.0,
    }
    assert (sw["price_is_example"], sw["slo_is_default"], sw["gpus_is_default"]) == (True, False, True)
    assert [p["sizing"] for p in meta["points"]] == [
        {"needed_s": 2.1, "capped": "point"},
        {"needed_s": 0.525, "capped": None},
    ]
    assert [p["duration_s"] for p in meta["points"]] == [1.0, 0.525]
    for p in meta["points"]:  # how the simulator kept up during each point (validity can judge per point)
        assert p["simulator"]["steps"] >= 0 and p["simulator"]["late_steps"] >= 0


def test_a_points_simulator_block_is_the_change_of_the_counters_over_it() -> None:
    before = {"steps": 100, "late_steps": 2, "frontend_waits": 0, "frontend_wait_ms": 0.0, "max_lateness_ms": 30.0}
    calm = {**before, "steps": 400, "late_steps": 2}
    assert point_simulator(before, calm) == {
        "steps": 300,
        "late_steps": 0,
        "frontend_waits": 0,
        "frontend_wait_ms": 0.0,
        "max_lateness_ms": None,  # the 30 ms was an earlier point's: this one's is not known
        "max_lateness_ms_at_most": 30.0,
    }
    late = {**before, "steps": 400, "late_steps": 52, "max_lateness_ms": 80.0}
    assert point_simulator(before, late)["late_steps"] == 50 and point_simulator(before, late)["max_lateness_ms"] == 80
