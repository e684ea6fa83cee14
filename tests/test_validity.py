"""Validity is data: caveats with codes, suspect runs and points, and decisions made only on valid points."""

from __future__ import annotations

import math
import os
from pathlib import Path

import orjson
import pytest
from hand_runs import make_run, make_sweep, point_entry

from loadgen.analysis.metrics import Summary, summarize
from loadgen.analysis.points import analyze_run
from loadgen.analysis.run_summary import summarize_run
from loadgen.analysis.saturation import MIN_REQUESTS, Observation, first_saturated, saturation_reason
from loadgen.analysis.validity import (
    VALID,
    Caveat,
    Validity,
    client_caveats,
    interruption,
    run_state,
    simulator_caveats,
    state_caveats,
    summary_caveats,
)
from loadgen.records import read_records
from loadgen.run_folder import PROCESS_ENDED
from loadgen.schedule import Arrival
from loadgen.sweep.search import AutoSearch, Step, capacity_estimate, next_step


def _summary(d: Path) -> Summary:
    return summarize(read_records(d))


# --------------------------------------------------------------------------- caveats and codes


def test_a_lagging_client_makes_the_point_suspect(tmp_path: Path) -> None:
    s = _summary(make_run(tmp_path / "r", [600.0] * 400, lag_ms=518.0))
    caveats = summary_caveats(s, lag_p99_limit_ms=10.0)
    assert [c.code for c in caveats] == ["client_lag"]
    assert caveats[0].message.startswith("schedule lag p99 is 518.0 ms (limit 10 ms)")
    v = Validity.of(caveats)
    assert (v.state, v.codes, v.reasons) == ("suspect", ("client_lag",), (caveats[0].message,))


def test_few_samples_is_one_caveat_and_withholds_nothing(tmp_path: Path) -> None:
    s = _summary(make_run(tmp_path / "r", [50.0] * 30))
    (few,) = summary_caveats(s)
    assert few.code == "few_samples"
    assert few.message == "only 30 TTFT, 30 TPOT, 30 E2E samples: a p99 with a bounded 95% interval needs at least 368"
    v = Validity.of([few])
    assert v.suspect and not v.withholding.suspect  # each verdict's own sample rule judges it
    assert not Validity.of(summary_caveats(_summary(make_run(tmp_path / "big", [50.0] * 400)))).suspect


def test_caveats_that_qualify_without_making_suspect(tmp_path: Path) -> None:
    s = _summary(make_run(tmp_path / "r", [50.0] * 400, failed=4))
    caveats = summary_caveats(s)
    assert [c.code for c in caveats] == ["failed"] and caveats[0].message == "4 of 404 requests failed (http_error 4)"
    assert Validity.of(caveats) is VALID


@pytest.mark.parametrize(
    ("client", "codes", "shown"),
    [
        # a zero-length point: the share of a core over 5 ms is start-up noise, not saturation
        ({"cpu_utilisation": 1.01, "wall_seconds": 0.005}, [], None),
        ({"cpu_utilisation": 1.01, "wall_seconds": 0.0}, [], None),
        ({"cpu_utilisation": 0.97, "wall_seconds": 12.0}, ["client_cpu"], "97% of a core over 12.0 s"),
        # threads count too: the share is clamped to the one core the figure speaks of
        ({"cpu_utilisation": 1.3, "wall_seconds": 12.0}, ["client_cpu"], "100% of a core over 12.0 s"),
        ({"cpu_utilisation": 0.5, "wall_seconds": 12.0, "records_degraded": 3}, ["writer_degraded"], "3 records"),
        ({"sends_delayed_by_max_inflight": 7}, ["max_inflight"], "7 sends waited"),
        ({"loop_lag_max_ms": 80.0}, ["client_loop_stall"], "up to 80 ms"),
        ({"fast_read": False, "fast_read_why_not": "old aiohttp"}, ["slow_path"], "(old aiohttp)"),
    ],
)
def test_client_caveats(client: dict[str, object], codes: list[str], shown: str | None) -> None:
    got = client_caveats(client)
    assert [c.code for c in got] == codes
    if shown:
        assert shown in got[0].message


def test_a_late_simulator() -> None:
    assert simulator_caveats({"simulator": {"late_steps": 1, "steps": 1000, "max_lateness_ms": 3.0}}) == []
    (late,) = simulator_caveats({"simulator": {"late_steps": 146, "steps": 853, "max_lateness_ms": 23.1}})
    assert late.code == "sim_late" and "146 of 853 steps (up to 23.1 ms late)" in late.message


@pytest.mark.parametrize(
    ("meta", "state", "reason"),
    [
        ({}, "complete", None),  # a folder from before run states were written
        ({"state": "complete"}, "complete", None),
        ({"state": "interrupted", "interrupted_reason": "SIGINT"}, "interrupted", "SIGINT"),
        ({"state": "running", "pid": 999_999_999}, "interrupted", PROCESS_ENDED),  # its process is gone
        ({"state": "running", "pid": os.getpid()}, "running", None),  # still going (this very process)
    ],
)
def test_run_state_and_its_caveat(meta: dict[str, object], state: str, reason: str | None) -> None:
    assert run_state(meta) == (state, reason)
    caveats = state_caveats(state, reason)
    assert [c.code for c in caveats] == ([] if state == "complete" else ["interrupted"])
    if state == "running":
        assert caveats[0].message == "the run is still running: its figures cover only what was sent so far"


# --------------------------------------------------------------------------- summary.json and first lines


def test_summary_json_carries_validity_as_data(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", [600.0] * 400, lag_ms=518.0, failed=2)
    report = summarize_run(run)
    doc = orjson.loads((run / "summary.json").read_bytes())
    assert doc["validity"]["state"] == "suspect" and doc["validity"]["codes"] == ["client_lag"]
    assert [w["code"] for w in doc["validity"]["warnings"]] == ["client_lag", "failed"]
    assert all(set(w) == {"code", "message"} and w["message"] for w in doc["validity"]["warnings"])
    assert report.validity.codes == ("client_lag",) and report.warnings[0].startswith("schedule lag p99")
    assert report.interruption is None
    clean = make_run(tmp_path / "clean", [50.0] * 400)
    summarize_run(clean)
    assert orjson.loads((clean / "summary.json").read_bytes())["validity"] == {
        "state": "valid",
        "codes": [],
        "warnings": [],
    }


def test_an_interrupted_run_and_sweep_say_so_first(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", [50.0] * 400, meta={"state": "interrupted", "interrupted_reason": "SIGTERM"})
    report = summarize_run(run)
    assert report.interruption == (
        "INTERRUPTED: this run was interrupted (SIGTERM); its figures cover only what was sent before the stop"
    )
    assert "interrupted" in report.validity.codes
    cut = point_entry(1, 20.0, state="interrupted", interrupted_reason="SIGINT")
    meta = {"state": "interrupted", "interrupted_reason": "SIGINT", "points": [point_entry(0, 10.0), cut]}
    line = interruption(meta)
    assert line is not None and line.startswith("INTERRUPTED: this sweep was interrupted (SIGINT); point 1")
    assert "(shown, marked suspect)" in line


# --------------------------------------------------------------------------- decisions on valid points only


def test_a_sweep_decides_on_valid_points_and_shows_the_suspect(tmp_path: Path) -> None:
    """Three points; the client lagged at the fastest. It stays in the sweep, marked, but is off the
    frontier, out of capacity at SLO (whose note names it), and no saturation call rests on it."""
    d = make_sweep(
        tmp_path / "s",
        [(10.0, [50.0] * 400, 0.0), (20.0, [60.0] * 400, 0.0), (40.0, [900.0] * 400, 800.0)],
        sweep={"mode": "rates", "slo": {"name": "t", "ttft_ms": 500.0, "tpot_ms": None, "e2e_ms": None}},
    )
    a = analyze_run(d)
    assert [p.validity.state for p in a.points] == ["valid", "valid", "suspect"]
    assert a.points[2].validity.codes == ("client_lag",)
    assert [p.short_label for p in a.trusted] == ["10 req/s", "20 req/s"]
    assert 2 not in a.frontier and not a.points[2].on_frontier
    assert a.capacity is not None and a.capacity.rate == 20.0
    assert "left out 1 suspect point (40 req/s: schedule lag p99 is 800.0 ms" in a.capacity.note
    assert a.saturation is None  # the only point that might be saturated is suspect


def test_a_suspect_run_has_no_frontier_or_capacity(tmp_path: Path) -> None:
    d = make_sweep(
        tmp_path / "s",
        [(10.0, [50.0] * 400, 0.0), (20.0, [60.0] * 400, 0.0)],
        simulator={"late_steps": 146, "steps": 853, "max_lateness_ms": 23.1},
        sweep={"mode": "rates", "slo": {"name": "t", "ttft_ms": 500.0, "tpot_ms": None, "e2e_ms": None}},
    )
    a = analyze_run(d)
    assert a.validity.codes == ("sim_late",) and a.trusted == [] and a.frontier == []
    assert a.capacity is not None and a.capacity.rate is None and a.capacity.note.startswith("no trusted point")


def _obs(rate: float, ratio: float, n: int, validity: Validity = VALID) -> Observation:
    return Observation(rate, rate, rate * ratio, 100 * rate * ratio, 100 * rate, 30.0, 1.0, 0.0, n=n, validity=validity)


LAG = Validity.of([Caveat("client_lag", "schedule lag p99 is 900 ms")])


@pytest.mark.parametrize(
    ("ratio", "n", "called"),
    [
        (0.24, 3, False),  # a 1 s window at 4 req/s: 3 requests, "delivered 24%" at TTFT p50 17 ms
        (0.6, MIN_REQUESTS - 1, False),  # below the floor
        (0.6, MIN_REQUESTS, False),  # 12 requests' worth delivered could be 19.7 at its 95% bound: no shortfall yet
        (0.87, 27, False),  # a 1 s window at 32 req/s: the edges of a short window, not the endpoint
        (0.6, 100, True),
        (0.3, 134, True),  # an overloaded point: few finished in the window, but their tokens tell
        (0.95, 5000, False),  # keeping up
    ],
)
def test_a_saturation_call_needs_enough_requests(ratio: float, n: int, called: bool) -> None:
    assert (saturation_reason(None, _obs(8.0, ratio, n=n)) is not None) is called


def test_failures_call_saturation_only_when_sure() -> None:
    def failing(pct: float, n: int) -> Observation:
        return Observation(10, 10, 10, 1000, 1000, 30, 1, pct, n=n)

    assert saturation_reason(None, failing(15.0, 20)) is None  # 3 of 20: could be under 10%
    assert saturation_reason(None, failing(30.0, 200)) is not None


def test_a_suspect_point_is_never_called_saturated_nor_a_baseline() -> None:
    assert saturation_reason(None, _obs(64.0, 0.3, n=2000, validity=LAG)) is None
    # the judgeable points alone are a ramp: the suspect one is skipped, and is no baseline either
    ramp = [_obs(2.0, 1.0, 8), _obs(4.0, 1.0, 100), _obs(8.0, 0.5, 400, LAG), _obs(16.0, 0.5, 800)]
    assert first_saturated(ramp) == (3, saturation_reason(None, ramp[3]))


def test_the_search_spreads_and_bisects_on_valid_points_only() -> None:
    def step(rate: float, phase: str = "ramp") -> Step:
        return Step(Arrival("poisson", rate=rate), phase, "", 30.0)

    # the suspect point "served" 60 req/s: it must not set the capacity the spread is placed from
    history = [(step(8), _obs(8, 1.0, 240)), (step(16), _obs(16, 0.5, 480)), (step(32), _obs(32, 1.9, 960, LAG))]
    assert capacity_estimate(history) == pytest.approx(8.0)
    cfg = AutoSearch(start_rate=8, spread=(0.5,))
    nxt = next_step(cfg, history, point_duration_s=30.0, has_slo=False)
    assert nxt is not None and nxt.phase == "spread" and nxt.rate == 4.0
    # bisection brackets only valid attainment: the suspect miss at 12 req/s is no bracket
    met = [
        (step(8), Observation(8, 8, 8, 800, 800, 30, 1, 0, met=240, n=240)),
        (step(16), Observation(16, 16, 16, 1600, 1600, 30, 1, 0, met=100, n=480)),
        (step(12, "spread"), Observation(12, 12, 12, 1200, 1200, 30, 1, 0, met=10, n=360, validity=LAG)),
    ]
    b = next_step(AutoSearch(start_rate=8, max_rate=16, spread=()), met, point_duration_s=30.0, has_slo=True)
    # met at 8, missed at 16: the geometric middle (the suspect 12 would have made it sqrt(8 x 12) = 9.8)
    assert b is not None and b.phase == "bisect" and b.rate == pytest.approx(math.sqrt(8 * 16), rel=0.01)
