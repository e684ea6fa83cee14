"""Every figure of the metric contract, pinned with hand-built records."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from hdrh.histogram import HdrHistogram

from loadgen.analysis.interval_counts import HIST_HIGHEST_US, fill_histogram, hist_percentile
from loadgen.analysis.latency_samples import latency_samples
from loadgen.analysis.metrics import SLO, Summary, summarize, summary_to_json
from loadgen.analysis.timeseries import iter_interval_histograms, timeseries
from loadgen.analysis.validity import summary_caveats
from loadgen.analysis.window import MetricsError, Window, choose_window
from loadgen.records import SCHEMA, Record, to_batch


def messages(s: Summary, lag_p99_limit_ms: float = 10.0) -> list[str]:
    """The summary's caveats, as the terminal words them."""
    return [c.message for c in summary_caveats(s, lag_p99_limit_ms=lag_p99_limit_ms)]


BASE = 10**12  # perf_counter_ns values are large; keep the tests honest about that
MS = 1_000_000


def ns(ms: float) -> int:
    return BASE + round(ms * MS)


def rec(
    sched: float,
    chunks: list[tuple[float, int]] = (),  # type: ignore[assignment]
    *,
    sent: float | None = None,
    done: float | None = None,
    status: str = "ok",
    out: int | None = None,
    **kw,
) -> Record:
    """A record with times in ms from BASE; chunks as (arrival ms, tokens)."""
    sent = sched if sent is None else sent
    if done is None:
        done = (chunks[-1][0] if chunks else sent) + 1
    return Record(
        t_sched=ns(sched),
        t_sent=ns(sent),
        t_first=ns(chunks[0][0]) if chunks else None,
        t_last=ns(chunks[-1][0]) if chunks else None,
        t_done=ns(done),
        chunk_ns=[ns(t) for t, _ in chunks],
        chunk_tokens=[k for _, k in chunks],
        output_tokens=sum(k for _, k in chunks) if out is None else out,
        status=status,
        **kw,
    )


def table(*records: Record) -> pa.Table:
    for i, r in enumerate(records):
        r.request = i
    return pa.Table.from_batches([to_batch(list(records))])


def whole(t: pa.Table) -> Window:
    """A window that holds every request and every chunk of these small tables."""
    return Window(BASE - 10**12, BASE + 10**12, BASE)


def test_multi_token_chunks_itl_icl_tpot() -> None:
    t = table(rec(0, [(100, 1), (120, 2), (150, 3)], sent=1, done=155))
    s = summarize(t)
    assert s.ttft.n == 1 and s.ttft.mean == 100.0
    assert s.ttft_sent.mean == 99.0
    assert s.e2e.mean == 155.0
    assert s.tpot.mean == pytest.approx(10.0)  # (150 - 100) / (6 - 1)
    assert s.per_user_tps.mean == pytest.approx(100.0)
    # ITL: 2 samples of 20/2, 3 of 30/3; the first chunk gives none.
    assert s.itl.n == 5 and s.itl.min == s.itl.max == pytest.approx(10.0)
    # ICL: the raw chunk gaps.
    assert s.icl.n == 2 and (s.icl.min, s.icl.max) == (20.0, 30.0)


def test_zero_token_chunks_pass_their_time_to_the_next_token() -> None:
    s = summarize(table(rec(0, [(100, 1), (110, 0), (130, 2)])))
    assert s.icl.n == 2  # chunk gaps 10 and 20
    assert s.itl.n == 2 and s.itl.max == pytest.approx(15.0)  # 30 ms over 2 tokens


@pytest.mark.parametrize(
    "chunks, n_ttft, n_tpot, n_itl, burst",
    [
        ([], 0, 0, 0, 0),
        ([(50, 1)], 1, 0, 0, 0),
        ([(50, 1), (60, 1)], 1, 1, 1, 0),
        ([(50, 2)], 1, 1, 0, 1),  # TPOT 0: no per-user speed, flagged as one burst
    ],
)
def test_output_token_thresholds(chunks, n_ttft: int, n_tpot: int, n_itl: int, burst: int) -> None:
    s = summarize(table(rec(0, chunks)))
    assert (s.ttft.n, s.tpot.n, s.itl.n, s.e2e.n) == (n_ttft, n_tpot, n_itl, 1)
    assert s.per_user_tps.n == (1 if chunks == [(50, 1), (60, 1)] else 0)
    assert s.single_burst == burst


def test_failures_and_cancellations_are_counted_and_timed_censored() -> None:
    t = table(
        rec(0, [(10, 1), (20, 1)]),
        rec(100, [], status="http_error", http_status=500, error="boom"),
        rec(200, [(210, 3), (290, 1)], status="timeout", error="read timeout"),
        rec(300, [(305, 2)], status="disconnected"),
        rec(400, [(410, 1)], status="cancelled"),
    )
    s = summarize(t, whole(t))
    assert s.requests == 5 and s.ok == 1 and s.failed == 3 and s.cancelled == 1
    assert s.by_status["http_error"] == 1 and s.by_status["bad_stream"] == 0
    # docs/metrics.md, "Censoring": TTFT is exact for the 4 that got a first token however they
    # ended; E2E exact for the ok one, censored for the two loadgen stopped waiting for (timeout,
    # cancelled). The http_error (no first token) and the disconnected stream were ended by the
    # endpoint: failures, counted as such and as misses, not latency samples.
    assert (s.ttft.n, s.ttft.censored, s.e2e.n, s.e2e.censored) == (4, 0, 3, 2)
    # TPOT and ITL from every request with >= 2 tokens, cut ones over what they received.
    assert (s.tpot.n, s.itl.n, s.icl.n) == (3, 2, 2)
    assert s.schedule_lag.n == 5  # lag is the client's: every sent request
    assert s.errors_by_status == {"cancelled": 1, "disconnected": 1, "http_error": 1, "timeout": 1}
    assert s.errors_by_http == {"500": 1, "none": 3}
    assert "http_error 500: boom" in s.error_examples
    assert "timeout: read timeout" in s.error_examples
    assert s.success_pct == pytest.approx(20.0)
    # Partial output still arrived: it counts in throughput, not in the ok figure.
    assert s.output_tokens_in_window == 2 + 4 + 2 + 1
    assert s.output_tokens_in_window_ok == 2
    warnings = messages(s)
    assert any("3 of 5 requests failed" in w for w in warnings)
    assert any("1 requests were cancelled" in w for w in warnings)


TEN = [rec(100 * i, [(100 * i + 50, 1)]) for i in range(10)]  # sched 0, 100, ..., 900 ms


@pytest.mark.parametrize(
    "options, first, last",
    [
        (dict(), 0, 900),
        (dict(warmup_s=0.25), 300, 900),
        (dict(warmup_s=0.25, cooldown_s=0.2), 300, 700),
        (dict(warmup_requests=2), 200, 900),
        (dict(cooldown_requests=3), 0, 600),
        (dict(warmup_s=0.15, warmup_requests=3), 300, 900),
        (dict(cooldown_s=0.05, cooldown_requests=1), 0, 800),
    ],
)
def test_window_trimming(options: dict, first: int, last: int) -> None:
    t = table(*TEN)
    w = choose_window(t, **options)
    s = summarize(t, w)
    expected = (last - first) // 100 + 1
    assert s.requests == expected == s.ttft.n
    assert s.before_window == first // 100 and s.after_window == 9 - last // 100
    assert s.ttft.min == 50.0
    assert w.start_ns <= ns(first) and w.end_ns > ns(last)


def test_untrimmed_window_gives_the_exact_constant_rate() -> None:
    s = summarize(table(*TEN))
    assert s.window_s == pytest.approx(1.0)  # 0..900 ms plus one mean gap
    assert s.offered_rps == pytest.approx(10.0) == s.sent_rps


def test_single_request_window_runs_to_its_completion() -> None:
    t = table(rec(0, [(40, 1), (60, 1)], done=80))
    w = choose_window(t)
    assert (w.start_ns, w.end_ns) == (ns(0), ns(80))
    s = summarize(t, w)
    assert s.requests == 1 and s.output_tps == pytest.approx(2 / 0.08)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(warmup_s=0.6, cooldown_s=0.5), "no measurement window"),
        (dict(warmup_requests=6, cooldown_requests=4), "leave none"),
        (dict(warmup_s=-1.0), "warmup_s"),
        (dict(cooldown_requests=1.5), "cooldown_requests"),
    ],
)
def test_window_errors(options: dict, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        choose_window(table(*TEN), **options)


def test_goodput_and_attainment() -> None:
    t = table(
        rec(0, [(100, 1), (110, 1)], done=700),  # warm-up; finishes in the window, meets SLO
        rec(1000, [(1100, 1), (1110, 1), (1120, 1)]),  # meets TTFT 100, TPOT 10
        rec(2000, [(2500, 1), (2510, 1)]),  # TTFT 500: miss
        rec(3000, [(3100, 1), (3200, 1), (3300, 1)]),  # TPOT 100: miss
        rec(4000, [], status="http_error", http_status=503),  # failure: miss
    )
    w = choose_window(t, warmup_s=0.5)
    assert w.length_s == pytest.approx(4.5)  # [500, 5000) ms
    slo = SLO(ttft_ms=200, tpot_ms=50)
    s = summarize(t, w, slo)
    assert s.requests == 4 and s.slo_met == 1
    assert s.slo_attainment_pct == pytest.approx(25.0)
    assert s.goodput_rps == pytest.approx(2 / 4.5)  # warm-up request + the good one
    assert s.completed_rps == pytest.approx(4 / 4.5)
    assert str(slo) == "TTFT <= 200 ms, TPOT <= 50 ms"
    assert summarize(t, w).goodput_rps is None


def test_slo_met_semantics() -> None:
    slo = SLO(ttft_ms=100, tpot_ms=10, e2e_ms=1000)
    nan = math.nan
    got = slo.met(
        np.array([50.0, 50.0, nan, 150.0, 50.0]),
        np.array([5.0, nan, 5.0, 5.0, 5.0]),
        np.array([500.0, 500.0, 500.0, 500.0, nan]),
    )
    # TPOT undefined (1 token) is moot; no first token or no finish is a miss.
    assert got.tolist() == [True, True, False, False, False]
    with pytest.raises(MetricsError, match="ttft_ms"):
        SLO(ttft_ms=0)


def test_throughput_counts_only_chunks_inside_the_window() -> None:
    t = table(
        rec(0, [(50, 1), (150, 2), (250, 3)]),
        rec(10, [(120, 4)], status="disconnected"),
        rec(150, []),
    )
    w = Window(ns(100), ns(200), ns(0))
    s = summarize(t, w)
    assert s.requests == 1  # only the request scheduled at 150 ms
    assert s.output_tokens_in_window == 6 and s.output_tps == pytest.approx(60.0)
    assert s.output_tokens_in_window_ok == 2 and s.output_tps_ok == pytest.approx(20.0)


def test_schedule_lag_and_per_user_speed() -> None:
    t = table(
        rec(0, [(100, 1), (110, 1)], sent=0),  # TPOT 10 -> 100 tok/s
        rec(100, [(200, 1), (220, 1)], sent=101),  # TPOT 20 -> 50 tok/s
        rec(200, [(300, 1), (340, 1)], sent=205),  # TPOT 40 -> 25 tok/s
    )
    s = summarize(t)
    assert (s.schedule_lag.min, s.schedule_lag.max) == (0.0, 5.0)
    assert s.schedule_lag.pct(50)[0] == 1.0
    assert sorted(1000 / np.array([10.0, 20.0, 40.0])) == pytest.approx(
        [s.per_user_tps.min, s.per_user_tps.pct(50)[0], s.per_user_tps.max]
    )
    assert s.ttft.min == 100.0 and s.ttft_sent.min == 95.0
    warnings = messages(s, lag_p99_limit_ms=2.0)
    assert any("client fell behind" in w for w in warnings)
    assert not any("fell behind" in w for w in messages(s, lag_p99_limit_ms=10.0))


def test_token_accounting() -> None:
    common = dict(prompt_tokens_requested=100, output_tokens_requested=4)
    t = table(
        rec(
            0,
            [(10, 1)] * 4,
            prompt_tokens_reported=120,
            output_tokens_reported=4,
            output_tokens_source="usage",
            finish_reason="length",
            **common,
        ),
        rec(
            100,
            [(110, 1), (120, 1)],
            prompt_tokens_reported=120,
            output_tokens_reported=3,
            output_tokens_source="usage",
            finish_reason="stop",
            **common,
        ),
        rec(
            200,
            [(210, 1)],
            output_tokens_source="chunks",
            finish_reason="stop",
            prompt_tokens_requested=100,
        ),
    )
    s = summarize(t)
    assert s.prompt_compared == 2 and s.prompt_gap_mean == 20.0
    assert s.prompt_gap_pct == pytest.approx(20.0)
    assert s.prompt_tokens_in_window == 120 + 120 + 100  # reported, else requested
    assert s.output_short == 1 and s.output_requested_mean == 4.0
    assert s.output_counted_mean == pytest.approx(7 / 3)
    assert s.token_mismatch == 1
    assert s.token_sources == {"chunks": 1, "usage": 2}
    assert s.finish_reasons == {"length": 1, "stop": 2}
    warnings = "\n".join(messages(s))
    assert "differ from the streamed count" in warnings
    assert "+20.0 %" in warnings
    assert "ignore_eos" in warnings
    assert "only 3 TTFT" in warnings and "at least 368" in warnings


def test_mismatched_token_list_falls_back_to_one_per_chunk() -> None:
    bad = rec(0, [(10, 1), (20, 1), (30, 1)])
    bad.chunk_tokens = [5]
    s = summarize(table(bad, rec(100, [(110, 2), (130, 2)])), Window(BASE, ns(1000), BASE))
    assert s.output_tokens_in_window == 3 + 4
    assert s.itl.n == 2 + 2


def test_empty_table_and_json() -> None:
    s = summarize(SCHEMA.empty_table())
    assert s.requests == 0 and s.ttft.n == 0 and math.isnan(s.offered_rps)
    json.dumps(summary_to_json(s), allow_nan=False)
    assert timeseries(SCHEMA.empty_table()) == []


def test_summary_json_is_strict_json() -> None:
    t = table(*TEN, rec(1000, [], status="timeout"))
    d = summary_to_json(summarize(t, slo=SLO(e2e_ms=100)))
    text = json.dumps(d, allow_nan=False)
    back = json.loads(text)
    p99 = back["ttft"]["percentiles"]["p99"]  # no "inf" strings: null and a flag
    assert (p99["hi"], p99["hi_unbounded"]) == (None, True)
    # the timeout never got a first token: censored at its elapsed time, above every exact TTFT
    assert (back["ttft"]["n"], back["ttft"]["censored"], p99["lower_bound"]) == (11, 1, True)
    assert "inf" not in text
    assert back["slo"] == {"ttft_ms": None, "tpot_ms": None, "e2e_ms": 100}
    assert back["window"]["start_ns"] == ns(0)


def test_timeseries_buckets() -> None:
    t = table(
        rec(0, [(100, 1), (1500, 1)], done=1600),
        rec(500, [], status="http_error", done=2500),
        rec(2200, [(2300, 1), (2310, 2)], done=2400),
    )
    rows = timeseries(t, interval_s=1.0)
    assert [r["t_s"] for r in rows] == [0.0, 1.0, 2.0]
    assert [r["sent"] for r in rows] == [2, 0, 1]
    assert [r["completed"] for r in rows] == [0, 1, 1]
    assert [r["errors"] for r in rows] == [0, 0, 1]
    assert [r["in_flight"] for r in rows] == [2, 1, 0]
    assert [r["output_tps"] for r in rows] == [1.0, 1.0, 3.0]
    assert rows[0]["ttft_p50_ms"] == pytest.approx(100.0, rel=1e-3)
    assert rows[1]["ttft_p50_ms"] is None
    assert rows[1]["itl_p99_ms"] == pytest.approx(1400.0, rel=1e-3)
    assert rows[2]["itl_p50_ms"] == pytest.approx(5.0, rel=1e-3)  # 10 ms over 2 tokens
    assert rows[2]["ttft_p99_ms"] == pytest.approx(100.0, rel=1e-3)


def test_interval_histograms_merge_exactly() -> None:
    rng = np.random.default_rng(5)
    recs = []
    for i in range(300):
        start = i * 20.0
        arrivals = start + 30 + np.cumsum(rng.uniform(1, 30, size=8))
        recs.append(
            rec(
                start,
                [(float(a), int(k)) for a, k in zip(arrivals, rng.integers(1, 4, 8), strict=True)],
            )
        )
    t = table(*recs)
    hists = list(iter_interval_histograms(t, interval_s=0.5))
    assert len(hists) == len(timeseries(t, interval_s=0.5))
    merged = HdrHistogram(1, HIST_HIGHEST_US, 3)
    for h in hists:
        merged.add(h.itl)
    s = summarize(t)
    assert merged.get_total_count() == s.itl.n
    assert hist_percentile(merged, 99) / 1000 == pytest.approx(s.itl.pct(99)[0], rel=2e-3)
    assert sum(h.ttft.get_total_count() for h in hists) == 300


def test_vectorised_fill_equals_record_value() -> None:
    rng = np.random.default_rng(0)
    edges = [0, 1, 2047, 2048, 2049, 4095, 4096, 10**6, HIST_HIGHEST_US]
    values = np.concatenate([rng.integers(0, HIST_HIGHEST_US, 5000), edges])
    counts = rng.integers(1, 5, values.size)
    fast, slow = HdrHistogram(1, HIST_HIGHEST_US, 3), HdrHistogram(1, HIST_HIGHEST_US, 3)
    fill_histogram(fast, values, counts)
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        slow.record_value(v, c)
    assert np.array_equal(np.ctypeslib.as_array(fast.counts), np.ctypeslib.as_array(slow.counts))
    assert fast.get_total_count() == slow.get_total_count()
    assert (fast.get_min_value(), fast.get_max_value()) == (
        slow.get_min_value(),
        slow.get_max_value(),
    )
    for p in (0.1, 50, 90, 99, 99.9, 100):
        assert hist_percentile(fast, p) == slow.get_value_at_percentile(p)


def test_large_table_is_folded_exactly() -> None:
    """4000 requests x 50 chunks through the vectorised list columns: the ITL count and median,
    the output rate, every request within the SLO, one timeseries row per second.

    (How fast this is, at up to a million requests, is measured in benchmarks/analysis_speed.py.)"""
    n, k = 4000, 50
    sched = np.arange(n, dtype=np.int64) * 10 * MS + BASE
    chunk = sched[:, None] + 50 * MS + np.cumsum(np.full((n, k), 5 * MS), axis=1)
    cols = {name: [None] * n for name in SCHEMA.names}
    cols.update(
        t_sched=sched,
        t_sent=sched,
        t_first=chunk[:, 0],
        t_last=chunk[:, -1],
        t_done=chunk[:, -1] + 1,
        chunk_ns=list(chunk),
        chunk_tokens=[[1] * k] * n,
        output_tokens=[k] * n,
        status=["ok"] * n,
        run_id=[""] * n,
    )
    t = pa.Table.from_pydict(cols, schema=SCHEMA)
    s = summarize(t, slo=SLO(ttft_ms=100))
    rows = timeseries(t)
    assert s.itl.n == n * (k - 1) and s.itl.pct(50)[0] == pytest.approx(5.0)
    assert s.output_tps == pytest.approx(k * 100, rel=0.02)
    assert s.requests == s.slo_met == n  # TTFT 55 ms each, under the 100 ms bound
    assert len(rows) == 41


def test_latency_samples_are_what_summarize_folds() -> None:
    """The CDF charts draw these samples; their percentiles must be the summary's."""
    rng = np.random.default_rng(5)
    recs = []
    for i in range(200):
        t0 = BASE + i * 10_000_000
        first = t0 + int(rng.integers(1, 80)) * 1_000_000
        gaps_ns = rng.integers(1, 30, size=5) * 1_000_000
        chunks = (first + np.concatenate([[0], np.cumsum(gaps_ns)])).tolist()
        recs.append(
            Record(
                request=i,
                t_sched=t0,
                t_sent=t0,
                t_first=chunks[0],
                t_last=chunks[-1],
                t_done=chunks[-1] + 1,
                chunk_ns=chunks,
                chunk_tokens=[1, 2, 1, 1, 3, 1],
                output_tokens=9,
                status="ok" if i % 10 else "timeout",
            )
        )
    t = pa.Table.from_batches([to_batch(recs)])
    w = choose_window(t)
    s, got = summarize(t, w), latency_samples(t, w)
    assert got["ttft"].size == s.ttft.n and got["itl"].size == s.itl.n
    for p in (50, 90, 99):
        assert np.percentile(got["itl"], p, method="inverted_cdf") == pytest.approx(s.itl.pct(p)[0])
        assert np.percentile(got["ttft"], p, method="inverted_cdf") == pytest.approx(s.ttft.pct(p)[0])


# --------------------------------------------------------------------------- tokens beside latency


def test_token_goodput_counts_the_output_of_requests_that_met_every_bound() -> None:
    t = table(
        rec(0, [(50, 1), (60, 9)]),  # TTFT 50 ms, 10 tokens: met
        rec(10, [(500, 1), (510, 4)]),  # TTFT 490 ms: missed
        rec(20, [(60, 3)], status="timeout", done=900),  # its tokens arrived, but it failed: missed
    )
    s = summarize(t, whole(t), SLO(ttft_ms=100))
    assert s.goodput_rps == pytest.approx(1 / s.window_s)
    assert s.goodput_tps == pytest.approx(10 / s.window_s)
    assert summarize(t, whole(t)).goodput_tps is None  # no SLO, no goodput


def test_per_user_speed_reports_the_slowest_users() -> None:
    """TPOT 1..100 ms: speeds 1000/100 .. 1000 tok/s; p10 and p1 are the slow tail, p90 the fast one."""
    t = table(*(rec(200 * i, [(200 * i + 50, 1), (200 * i + 50 + tpot, 1)]) for i, tpot in enumerate(range(1, 101))))
    s = summarize(t, whole(t))
    p10, p1 = s.per_user_slow
    assert p1 == pytest.approx(1000 / 100)  # the slowest user
    assert p10 == pytest.approx(1000 / 91)  # rank 10 of 100 from the slow end
    assert s.per_user_tps.pct(90)[0] == pytest.approx(1000 / 11)  # the fast tail, which a planner does not need
    doc = summary_to_json(s)["per_user_tps"]["percentiles"]
    assert {"p1", "p10", "p50", "p90", "p99"} <= set(doc)


def test_cached_prompt_fraction_and_ttft_split_by_cache() -> None:
    t = table(
        rec(0, [(20, 4)], prompt_tokens_reported=100, cached_tokens=80),
        rec(1, [(21, 4)], prompt_tokens_reported=100, cached_tokens=60),
        rec(2, [(102, 4)], prompt_tokens_reported=100, cached_tokens=0),
        rec(4, [(104, 4)], prompt_tokens_reported=100, cached_tokens=20),  # a shared template prefix: no hit
        rec(3, [(203, 4)], prompt_tokens_reported=100),  # cache not reported: in neither group
    )
    s = summarize(t, whole(t))
    assert (s.cached_reported, s.cached_prompt_tokens) == (4, 160)
    assert s.cached_prompt_fraction == pytest.approx(160 / 400)
    assert s.ttft_ms_cached is not None and s.ttft_ms_uncached is not None
    assert (s.ttft_ms_cached.n, s.ttft_ms_cached.max) == (2, 20.0)  # at least half the prompt cached
    assert (s.ttft_ms_uncached.n, s.ttft_ms_uncached.mean) == (2, 100.0)
    doc = summary_to_json(s)
    assert doc["cached_prompt_fraction"] == pytest.approx(160 / 400) and doc["ttft_ms_cached"]["n"] == 2
    json.dumps(doc, allow_nan=False)
    # one kind only: no split; nothing reported: no fraction
    warm = summarize(table(rec(0, [(20, 4)], prompt_tokens_reported=100, cached_tokens=900)))
    assert warm.cached_prompt_fraction == pytest.approx(1.0) and warm.ttft_ms_cached is None  # at most the prompt
    assert summarize(table(rec(0, [(20, 4)]))).cached_prompt_fraction is None


def test_reasoning_tokens_and_ttft_to_first_content() -> None:
    t = table(
        # two reasoning chunks, then content: TTFT 10 ms, to content 30 ms
        rec(0, [(10, 1), (20, 1), (30, 1), (40, 1)], t_first_content=ns(30), reasoning_tokens=2),
        rec(100, [(110, 1), (120, 1)], t_first_content=ns(110), reasoning_tokens=0),  # content first
        rec(200, [(210, 1)], status="cancelled", done=300),  # cut while reasoning: censored at 100 ms
        rec(400, [(420, 2)], status="ok"),  # an answer without content (a tool call): no sample
    )
    s = summarize(t, whole(t))
    assert (s.reasoning_reported, s.reasoning_tokens) == (2, 2)
    assert s.reasoning_output_pct == pytest.approx(100 * 2 / 6)
    assert s.content_after_first == 3  # the first, the cut one and the tool call began with something else
    assert (s.ttft_content.n, s.ttft_content.censored) == (3, 1)
    assert (s.ttft_content.min, s.ttft_content.max) == (10.0, 100.0)
    assert s.ttft_content.max_lower_bound
    assert s.ttft.pct(50)[0] == 10.0 and s.ttft_content.pct(50)[0] == 30.0


def test_records_without_content_times_have_no_content_figure() -> None:
    t = table(rec(0, [(10, 1), (20, 1)]), rec(5, [(30, 1)], status="cancelled"))
    s = summarize(t.drop_columns(["t_first_content", "cached_tokens", "reasoning_tokens"]))
    assert (s.ttft_content.n, s.content_after_first, s.reasoning_reported, s.cached_reported) == (0, 0, 0, 0)
    assert summarize(t).content_after_first == 0  # the column is there but never set: not recorded


def test_summary_json_has_no_inf_with_censored_samples() -> None:
    t = table(rec(0, [(10, 1), (20, 1)]), rec(5, [], status="timeout", done=900))
    text = json.dumps(summary_to_json(summarize(t, whole(t), SLO(ttft_ms=50))), allow_nan=False)
    assert '"inf"' not in text and "Infinity" not in text
