"""Censoring, not survivorship: every request scheduled in the window counts in its latency figures.

A request that got its first token counts for TTFT however it ended; one that never did is a
right-censored sample at its elapsed time, and a percentile that reaches it is a lower bound
(docs/metrics.md, "Censoring"). Hand-built records throughout.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from hand_runs import written
from rich.console import Console

from loadgen.analysis.columns import int_column
from loadgen.analysis.latency_samples import latency_samples
from loadgen.analysis.metrics import SLO, summarize, summary_to_json
from loadgen.analysis.stats import describe, percentile_ci
from loadgen.analysis.timeseries import timeseries
from loadgen.analysis.window import Window, choose_window
from loadgen.client.settings import RunSettings
from loadgen.conformance.bounds import measure, percentile, verdict
from loadgen.conformance.samples import Point
from loadgen.conformance.slo import Criterion
from loadgen.records import Record, read_records
from loadgen.report.terminal import latency_table
from loadgen.schedule import Arrival
from loadgen.sweep.plan import SweepPlan
from loadgen.sweep.run import SweepSettings, run_sweep
from loadgen.workload.base import SyntheticChat

BASE = 10**12
MS = 1_000_000
INF = math.inf


def ns(ms: float) -> int:
    return BASE + round(ms * MS)


def rec(sched: float, first: float | None = None, done: float | None = None, status: str = "ok", **kw) -> Record:
    """A request scheduled at ``sched`` ms; with ``first``, two one-token chunks (first, first + 10)."""
    chunks = [] if first is None else [ns(first), ns(first + 10)]
    if done is None and status != "not_sent":
        done = (first + 11) if first is not None else sched + 1
    return Record(
        t_sched=ns(sched),
        t_sent=None if status == "not_sent" else ns(sched),
        t_first=chunks[0] if chunks else None,
        t_last=chunks[-1] if chunks else None,
        t_done=None if done is None else ns(done),
        chunk_ns=chunks,
        chunk_tokens=[1] * len(chunks),
        output_tokens=len(chunks),
        status=status,
        **kw,
    )


WHOLE = Window(BASE - 10**12, BASE + 10**12, BASE)


# --------------------------------------------------------------------------- the vLLM case


def overloaded(tmp_path) -> pa.Table:
    """The issue's point in miniature: 2 requests finished fast, 8 were cut at the end of the
    point after their first token arrived (late: they queued), 2 never got one."""
    recs = [rec(0, first=100), rec(10, first=110)]
    recs += [rec(20 + 10 * i, first=1500 + 50 * i, done=3000, status="cancelled") for i in range(8)]
    recs += [rec(200, done=3000, status="cancelled"), rec(210, status="not_sent")]
    return written(tmp_path, *recs)


def test_a_request_cut_after_its_first_token_counts_for_ttft(tmp_path) -> None:
    s = summarize(overloaded(tmp_path), WHOLE)
    all_first = [100, 110] + [1500 + 50 * i - (20 + 10 * i) for i in range(8)]
    assert s.ttft.n == 12 and s.ttft.censored == 2
    # p50 over 12: rank 6, among the exact ones (both censored ones wait ~2.8 s, above all of them)
    assert s.ttft.pct(50)[0] == sorted(all_first)[5] and not s.ttft.lower_bound(50)
    assert s.ttft.pct(50)[0] >= float(np.percentile(all_first, 50, method="inverted_cdf"))
    # the old rule saw only the two ok requests: ~100 ms
    assert s.ttft.pct(50)[0] > 10 * 110


def test_a_request_without_first_token_is_censored_at_its_elapsed_time(tmp_path) -> None:
    t = overloaded(tmp_path)
    got = latency_samples(t, WHOLE)
    # the cancelled one waited until it was cut (t_done); the not_sent one until the end of
    # observation, the latest instant any record holds (3000 ms here)
    assert list(got["ttft_censored"]) == [3000 - 210, 3000 - 200]  # sorted
    s = summarize(t, WHOLE)
    assert s.ttft.lower_bound(99) and s.ttft.pct(99)[0] == 2800.0  # ">= 2800": it may be higher
    assert s.ttft.pct(99)[2] == INF  # its upper end rests on censored samples: unbounded


def test_e2e_censors_every_request_that_did_not_finish_ok(tmp_path) -> None:
    s = summarize(overloaded(tmp_path), WHOLE)
    assert (s.e2e.n, s.e2e.censored) == (12, 10)
    assert s.e2e.lower_bound(50) and s.e2e.mean_lower_bound and s.e2e.pct(50)[2] == INF


def test_tpot_and_itl_count_cut_requests_over_the_tokens_they_received(tmp_path) -> None:
    s = summarize(overloaded(tmp_path), WHOLE)
    assert s.tpot.n == 10 and s.itl.n == 10 and s.tpot.censored == 0  # two tokens 10 ms apart each
    assert s.tpot.pct(50)[0] == pytest.approx(10.0)


def test_not_sent_is_counted_and_lags_at_least_its_wait(tmp_path) -> None:
    s = summarize(overloaded(tmp_path), WHOLE)
    assert s.not_sent == 1 and s.cancelled == 9 and s.failed == 0 and s.requests == 12
    assert (s.schedule_lag.n, s.schedule_lag.censored) == (12, 1)


def test_timeseries_ttft_counts_cut_requests_too(tmp_path) -> None:
    rows = timeseries(overloaded(tmp_path), interval_s=1.0)
    assert rows[1]["ttft_p50_ms"] is not None  # the cut requests' first tokens arrived in second 1


# --------------------------------------------------------------------------- the statistics


@pytest.mark.parametrize("seed", range(20))
def test_censored_percentiles_bracket_every_completion_of_the_data(seed: int) -> None:
    """Whatever the censored samples' true values (at least their censored value): the estimate is
    exact unless flagged, a flagged one is <= the truth, and the interval ends hold as bounds of the
    interval the true data would give."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    x = rng.lognormal(size=n)
    cens = rng.random(n) < rng.uniform(0, 0.3)
    d = describe(x[~cens], censored=x[cens])
    for _ in range(5):
        later = x + rng.exponential(5, size=n) * (rng.random(n) < 0.5)  # some later, some at once
        truth = np.sort(np.where(cens, np.where(rng.random(n) < 0.2, INF, later), x))  # some never
        for p in (50, 90, 99):
            est, lo, hi = d.pct(p)
            t_est, t_lo, t_hi = percentile_ci(truth, p)
            f = d.pct_flags(p)
            assert est <= t_est and (f.value or est == t_est)
            assert lo <= t_lo and (f.lo or lo == t_lo or lo == -INF)
            assert hi >= t_hi or (math.isinf(t_hi) and math.isinf(hi))


def test_a_tie_with_a_censored_sample_is_exact() -> None:
    d = describe([1.0, 2.0, 3.0], censored=[2.0])  # censored at 2: its true value is >= 2
    assert d.pct(50)[0] == 2.0 and not d.lower_bound(50)  # rank 2 of 4 is the exact 2.0
    assert d.lower_bound(90) and d.max_lower_bound and not d.min_lower_bound


def test_summary_json_carries_the_flags_and_no_inf(tmp_path) -> None:
    text = json.dumps(summary_to_json(summarize(overloaded(tmp_path), WHOLE)), allow_nan=False)
    doc = json.loads(text)
    p99 = doc["ttft"]["percentiles"]["p99"]
    assert (p99["value"], p99["lower_bound"], p99["hi"], p99["hi_unbounded"]) == (2800.0, True, None, True)
    assert doc["ttft"]["percentiles"]["p50"]["lower_bound"] is False
    assert doc["ttft"]["censored"] == 2 and doc["e2e"]["mean_lower_bound"] is True
    assert doc["not_sent"] == 1 and '"inf"' not in text


def test_terminal_shows_a_lower_bound_as_at_least(tmp_path) -> None:
    console = Console(width=250, record=True)
    console.print(latency_table(summarize(overloaded(tmp_path), WHOLE)))
    out = console.export_text()
    assert ">= 2,800" in out and "(2 censored)" in out and "lower bound" in out


# --------------------------------------------------------------------------- goodput and attainment


def test_unfinished_requests_are_misses_in_goodput_and_attainment(tmp_path) -> None:
    t = written(
        tmp_path,
        *(rec(100 * i, first=100 * i + 50) for i in range(4)),
        rec(400, first=450, done=2000, status="cancelled"),  # fast first token, but cut: a miss
        rec(500, done=2000, status="timeout"),
        rec(600, status="not_sent"),
    )
    s = summarize(t, WHOLE, SLO(ttft_ms=100))
    assert s.slo_met == 4 and s.requests == 7 and s.slo_attainment_pct == pytest.approx(400 / 7)
    assert s.goodput_rps == pytest.approx(4 / WHOLE.length_s)
    point = Point(0, "", None, None, t, WHOLE, SLO(ttft_ms=100))
    assert point.proportion("attainment") == (4, 7)


def test_a_stopped_runs_window_ends_where_observation_ended(tmp_path) -> None:
    recs = [rec(100 * i, first=100 * i + 20) for i in range(5)]  # observed until 431 ms
    recs += [rec(100 * i, status="not_sent") for i in range(5, 10)]  # scheduled after the stop
    t = written(tmp_path, *recs)
    w = choose_window(t)
    assert w.end_ns == ns(431) and "end of observation" in w.how
    s = summarize(t, w)
    assert s.requests == 5 and s.after_window == 5 and s.slo_met is None
    assert not s.ttft.censored


# --------------------------------------------------------------------------- the gate


def crit(statistic: str, bound: float, metric: str = "ttft", op: str = "<=") -> Criterion:
    return Criterion(name=f"{statistic} {metric}", metric=metric, statistic=statistic, op=op, bound=bound, unit="ms")


def censored_point(tmp_path, exact_ms: list[float], waiting_ms: list[float]) -> Point:
    """Requests with these TTFTs, then requests cut (cancelled) after waiting these long without one."""
    recs = [rec(10 * i, first=10 * i + v) for i, v in enumerate(exact_ms)]
    k = len(recs)
    recs += [rec(10 * (k + i), done=10 * (k + i) + w, status="cancelled") for i, w in enumerate(waiting_ms)]
    return Point(0, "", None, None, written(tmp_path, *recs), WHOLE)


def test_a_percentile_on_censored_samples_cannot_pass(tmp_path) -> None:
    # 400 answered in 50 ms, 20 still waiting after 100 ms: p99 >= 100 ms, unbounded above
    p = censored_point(tmp_path, [50.0] * 400, [100.0] * 20)
    m = measure(crit("p99", 200), p, 0.95)
    assert m.lower_bound and m.censored == 20 and m.hi == INF
    assert verdict(m, "<=", 200) == "inconclusive"
    assert m.over == 20 and m.needed is not None and m.needed > m.n  # each censored one may be over


def test_a_censored_percentile_whose_lower_bound_is_over_the_limit_fails(tmp_path) -> None:
    p = censored_point(tmp_path, [50.0] * 300, [900.0] * 100)
    m = measure(crit("p90", 500), p, 0.95)
    assert m.lower_bound and m.lo > 500 and verdict(m, "<=", 500) == "fail"
    assert m.over == 100  # waiting 900 ms already: known misses


def test_a_few_censored_samples_below_the_rank_pass_only_as_if_never_answered(tmp_path) -> None:
    # 2 requests failed fast (no first token after 1 ms): even taken as never answering, p90 of
    # 1000 stays within 100 ms, so the PASS does not depend on their true values
    p = censored_point(tmp_path, list(np.linspace(10.0, 90.0, 1000)), [1.0, 1.0])
    m = measure(crit("p90", 100), p, 0.95)
    assert m.lower_bound and m.hi < 100 and verdict(m, "<=", 100) == "pass"
    exact = percentile(np.sort(np.linspace(10.0, 90.0, 1000)), 90, 0.95, 100, "<=")
    assert m.hi >= exact.hi  # the censored samples only push the upper bound up


def test_a_mean_with_censored_samples_is_a_lower_bound(tmp_path) -> None:
    p = censored_point(tmp_path, [50.0] * 100, [30.0] * 5)
    m = measure(crit("mean", 200), p, 0.95)
    assert m.lower_bound and m.hi == INF and verdict(m, "<=", 200) == "inconclusive"


# --------------------------------------------------------------------------- against the simulator


@pytest.mark.timing  # real time; past saturation by ~5x, so requests are cut at any machine load
def test_a_point_past_saturation_counts_its_cut_requests_in_ttft(tmp_path) -> None:
    """A sweep point at ~5x the capacity of a small simulated engine, with a short drain: requests
    still queued or streaming at the end are cut. Its TTFT includes the cut ones, so its p50 is at
    least the p50 over every request that got a first token (the ok ones alone would be lower)."""
    sim = ["--gpu", "a100", "--model", "llama-3.1-8b", "--max-num-seqs", "4"]  # ~6 req/s at 128 -> 64 tokens
    plan = SweepPlan("rates", (Arrival("constant", rate=30),), point_duration_s=2.0, warmup_s=0.0, drain_s=0.3)
    base = RunSettings(endpoint=None, model=None, duration_s=2.0, lag_limit_ms=50.0)
    result = run_sweep(
        SweepSettings(base=base, plan=plan),
        lambda salt: SyntheticChat(128, 64, seed=0, salt=salt),
        tmp_path / "s",
        sim_flags=sim,
    )
    s = result.points[0].summary
    t = read_records(tmp_path / "s")
    first, has_first = int_column(t, "t_first")
    cut = has_first & (np.asarray(t.column("status").to_pylist(), dtype=object) == "cancelled")
    assert cut.any()  # the point really cut requests that were streaming
    with_first = (first - int_column(t, "t_sched")[0])[has_first] / 1e6
    assert s.ttft.pct(50)[0] >= float(np.percentile(with_first, 50, method="inverted_cdf"))
    assert s.ttft.n == s.requests  # every request of the window counts: none vanished


def test_the_turns_a_failed_turn_left_unsent_are_misses_not_latency_samples(tmp_path) -> None:
    t = written(
        tmp_path,
        rec(0, first=50, session=1, turn=0),
        rec(100, done=150, status="http_error", session=1, turn=1),  # the session breaks here
        rec(150, status="not_sent", session=1, turn=2),  # never due: no made-up wait
        rec(200, status="not_sent", session=2, turn=0),  # was due, waited: censored
        rec(900, first=950, session=3, turn=0),
    )
    s = summarize(t, WHOLE, SLO(ttft_ms=100))
    assert (s.ttft.n, s.ttft.censored) == (3, 1)  # session 2's turn; the http_error is a failure
    assert s.requests == 5 and s.slo_met == 2  # every unsent turn is still a miss
