"""Every figure of a report, computed from the records (DESIGN.md, "the contract").

The engine only times and records; the analysis layer is the one place where records
become numbers, so a report can always be re-rendered from a run folder, and this
module folds one run's (or one load point's) records into a ``Summary``. Inputs
are Arrow tables with ``records.SCHEMA`` (one run, or one load point of a sweep).
Columns are converted to numpy once and everything is vectorised, including the
per-chunk list columns, so a million-request run summarises in seconds
(``benchmarks/analysis_speed.py`` measures it). The measurement window is chosen
in ``window``.

Conventions: latencies are in milliseconds; open-loop latency is measured from the
intended send time ``t_sched``. Censoring, not survivorship (``columns.Latencies``,
docs/metrics.md): every request scheduled in the window counts in its latency
figures; one that got its first token counts for TTFT however it ended, one that
did not is a right-censored sample at its elapsed time, and a percentile that
reaches a censored sample is a lower bound (``Dist.lower_bound``). Goodput and SLO
attainment count every request that did not finish ok, ``not_sent`` included, as a miss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loadgen.analysis.columns import Cols, Floats, Mask
from loadgen.analysis.latencies import Latencies
from loadgen.analysis.latency_samples import itl_icl_dists
from loadgen.analysis.outcomes import error_fields, status_counts, token_count_fields, value_counts
from loadgen.analysis.stats import PERCENTILES, Dist, describe, json_number
from loadgen.analysis.tokens import token_fields
from loadgen.analysis.window import MetricsError, Window, choose_window
from loadgen.analysis.window_tokens import window_tokens

__all__ = ["SLO", "Summary", "summarize", "summary_to_json"]

# per-user speed also at p10 and p1: the slowest users (p90 / p99 of TPOT), which a planner needs
SPEED_PERCENTILES = tuple(sorted({1.0, 10.0, *PERCENTILES}))


# --------------------------------------------------------------------------- SLO


@dataclass(frozen=True)
class SLO:
    """Per-request latency bounds in ms; a bound left as None is not checked.

    Only an ok request can meet an SLO (``summarize`` and the gate apply ``met`` to ok
    requests); a failed, cancelled or ``not_sent`` one is a miss whatever its latencies.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise MetricsError(f"SLO {f.name} must be a finite number > 0, got {v!r}")

    def met(self, ttft_ms: Floats, tpot_ms: Floats, e2e_ms: Floats) -> Mask:
        """Per request: every given bound met. NaN TTFT or E2E (no first token, not
        finished) is a miss; NaN TPOT (fewer than 2 tokens) leaves that bound moot."""
        ok = np.ones(np.shape(ttft_ms), dtype=bool)
        if self.ttft_ms is not None:
            ok &= np.asarray(ttft_ms) <= self.ttft_ms
        if self.tpot_ms is not None:
            tpot = np.asarray(tpot_ms)
            ok &= np.isnan(tpot) | (tpot <= self.tpot_ms)
        if self.e2e_ms is not None:
            ok &= np.asarray(e2e_ms) <= self.e2e_ms
        return ok

    def __str__(self) -> str:
        parts = [
            f"{n} <= {v:g} ms"
            for n, v in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("E2E", self.e2e_ms))
            if v is not None
        ]
        return ", ".join(parts) or "no bounds"


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class Summary:
    """Every figure of one run or load point. Latencies in ms, rates per second.

    Counts are of requests scheduled in the window unless the name says otherwise.
    Latency Dists hold every such request, censored where it never got what the
    figure times (``columns.Latencies``); ``schedule_lag`` holds every request that
    was sent, a ``not_sent`` one censored (it describes the client). ``ttft_sent`` is TTFT from the actual send,
    the uncorrected view kept beside the open-loop one. ``goodput_rps``,
    ``slo_met`` and ``slo_attainment_pct`` are None without an SLO.
    """

    window: Window
    slo: SLO | None
    records: int  # rows in the table
    requests: int  # scheduled in the window
    before_window: int
    after_window: int
    by_status: dict[str, int]
    ok: int
    failed: int  # neither ok nor cancelled nor not_sent
    cancelled: int
    not_sent: int  # scheduled in the window, never written to the wire
    window_s: float
    schedule_lag: Dist
    ttft: Dist
    ttft_sent: Dist
    e2e: Dist
    tpot: Dist
    itl: Dist
    icl: Dist
    per_user_tps: Dist  # 1000 / TPOT per request (TPOT 0, one burst, left out); also p1 and p10, the slow tail
    output_tokens_in_window: int  # from every request's chunks arriving in the window
    output_tokens_in_window_ok: int
    output_tps: float
    output_tps_ok: float
    prompt_tokens_in_window: int  # reported, else requested for ok requests
    total_tps: float  # (output tokens arrived + prompt tokens) / window
    offered_rps: float  # scheduled in the window
    sent_rps: float  # t_sent in the window
    completed_rps: float  # ok with t_done in the window
    goodput_rps: float | None  # ok, t_done in the window, every SLO bound met
    slo_met: int | None
    slo_attainment_pct: float | None  # met / scheduled in window; failures, cancelled, not_sent miss
    success_pct: float
    prompt_compared: int  # requests with both requested and reported prompt tokens
    prompt_requested_mean: float
    prompt_reported_mean: float
    prompt_gap_mean: float  # reported - requested, tokens
    prompt_gap_pct: float
    output_requested_mean: float  # ok requests with a max_tokens
    output_counted_mean: float  # ok requests
    output_short: int  # ok requests that ended before the requested count
    finish_reasons: dict[str, int]
    token_sources: dict[str, int]  # requests per output_tokens_source: where per-chunk counts came from
    spread_tokens_per_chunk: float  # mean tokens per chunk where usage was spread evenly over chunks
    token_mismatch: int  # reported usage != sum of chunk tokens
    single_burst: int  # ok, >= 2 tokens, all in one chunk (no real streaming)
    buffered: int  # ok, >= 4 tokens, most in one read after a long silence (``buffered.buffered_rows``)
    buffered_of: int  # ok requests with >= 4 tokens: what ``buffered`` is out of
    no_done_marker: int  # ok, ended with a finish_reason but no [DONE] (stream_end "finish")
    errors_by_status: dict[str, int]
    errors_by_http: dict[str, int]
    error_examples: list[str]
    # tokens beside the latencies (``analysis.tokens``): null/None where the endpoint reported none
    goodput_tps: float | None  # output tokens of the requests in goodput_rps, per second
    ttft_content: Dist  # TTFT to the first visible content (not reasoning), censored like TTFT
    content_after_first: int  # requests whose first output chunk was not visible content
    reasoning_reported: int  # requests that reported reasoning tokens
    reasoning_tokens: int  # their sum
    reasoning_output_pct: float  # their share of those requests' output tokens
    cached_reported: int  # requests that reported cached prompt tokens
    cached_prompt_tokens: int  # sum over the requests that reported both cached and prompt tokens
    cached_prompt_fraction: float | None  # that sum / their reported prompt tokens
    ttft_ms_cached: Dist | None  # TTFT of cache hits (>= half the prompt cached), where hits and misses occur
    ttft_ms_uncached: Dist | None  # TTFT of the misses, likewise

    @property
    def token_source_shares(self) -> dict[str, float]:
        """Share (0..1) of each per-chunk token source among the requests that streamed output
        (``none`` left out), largest first."""
        counted = {k: v for k, v in self.token_sources.items() if k != "none" and v > 0}
        whole = sum(counted.values())
        return {k: v / whole for k, v in sorted(counted.items(), key=lambda kv: -kv[1])} if whole else {}

    @property
    def per_user_slow(self) -> tuple[float, float]:
        """(p10, p1) of per-user tok/s: the slow tail (NaN without samples)."""
        d = self.per_user_tps
        return (d.pct(10)[0], d.pct(1)[0]) if d.n else (math.nan, math.nan)


def summarize(table: pa.Table, window: Window | None = None, slo: SLO | None = None) -> Summary:
    """Fold the records into a Summary; the window defaults to the whole schedule span
    (folded once per table, window and SLO: a report asking again gets the same Summary)."""
    c = Cols.of(table)
    w = window if window is not None else choose_window(table)
    return c.once(("summarize", w, slo), lambda: _summarize(table, c, w, slo))


def _summarize(table: pa.Table, c: Cols, w: Window, slo: SLO | None) -> Summary:
    inwin = w.contains(c.t_sched)
    okw = inwin & c.ok
    lat = Latencies.of(c)
    counts = status_counts(value_counts(c, "status", inwin, none="none"))
    n_in = int(inwin.sum())
    met = c.ok & slo.met(lat.ttft, lat.tpot, lat.e2e) if slo is not None else None
    return Summary(
        window=w,
        slo=slo,
        records=c.n,
        requests=n_in,
        before_window=int((c.t_sched < w.start_ns).sum()),
        after_window=int((c.t_sched >= w.end_ns).sum()),
        by_status=counts,
        ok=counts.get("ok", 0),
        failed=n_in - sum(counts.get(k, 0) for k in ("ok", "cancelled", "not_sent")),
        cancelled=counts.get("cancelled", 0),
        not_sent=counts.get("not_sent", 0),
        window_s=w.length_s,
        success_pct=_pct(counts.get("ok", 0), n_in),
        **_latency_fields(c, lat, w),
        **_throughput_fields(table, c, w, inwin),
        **_slo_fields(c, w, inwin, met),
        **token_count_fields(c, inwin, okw),
        **error_fields(c, inwin),
        **token_fields(table, c, lat, w, inwin, met),
    )


def _latency_fields(c: Cols, lat: Latencies, w: Window) -> dict[str, Any]:
    """The latency Dists over every request scheduled in the window, censored where due."""
    inwin = w.contains(c.t_sched)
    tp = lat.tpot[inwin]
    tp = tp[~np.isnan(tp)]
    itl, icl = itl_icl_dists(c, w)  # from the same walks of the chunks, with the steps of ITL's CDF
    return dict(
        schedule_lag=_dist(lat.lag, lat.lag_c, inwin),
        ttft=_dist(lat.ttft, lat.ttft_c, inwin),
        ttft_sent=_dist(lat.ttft_sent, lat.ttft_sent_c, inwin),
        e2e=_dist(lat.e2e, lat.e2e_c, inwin),
        tpot=describe(tp),
        itl=itl,
        icl=icl,
        per_user_tps=describe(1000.0 / tp[tp > 0], percentiles=SPEED_PERCENTILES),
    )


def _dist(exact: Floats, censored: Floats, rows: Mask) -> Dist:
    """``describe`` of the rows' exact values with their censored ones (NaNs are dropped there)."""
    return describe(exact[rows], censored=censored[rows])


def _throughput_fields(table: pa.Table, c: Cols, w: Window, inwin: Mask) -> dict[str, Any]:
    """Tokens whose chunks arrived in the window, and request rates, per second of it."""
    (sent, has_sent), (done, has_done) = c.t["t_sent"], c.t["t_done"]
    length = w.length_s
    out_all, out_ok, _ = window_tokens(table, w)  # (the walk also counts the batches of the tok/s interval)
    prompt_in = _prompt_tokens(c, inwin)
    return dict(
        output_tokens_in_window=out_all,
        output_tokens_in_window_ok=out_ok,
        output_tps=_rate(out_all, length),
        output_tps_ok=_rate(out_ok, length),
        prompt_tokens_in_window=prompt_in,
        total_tps=_rate(out_all + prompt_in, length),
        offered_rps=_rate(int(inwin.sum()), length),
        sent_rps=_rate(int((has_sent & w.contains(sent)).sum()), length),
        completed_rps=_rate(int((c.ok & has_done & w.contains(done)).sum()), length),
    )


def _slo_fields(c: Cols, w: Window, inwin: Mask, met: Mask | None) -> dict[str, Any]:
    """Goodput (ok, done in the window, every bound met) and attainment (met / every request
    scheduled in the window: a failed, cancelled or not_sent one is a miss); None without an SLO
    (``met``: per row, ok and every bound met)."""
    if met is None:
        return dict(goodput_rps=None, slo_met=None, slo_attainment_pct=None)
    done, has_done = c.t["t_done"]
    met_n = int((met & inwin).sum())
    return dict(
        goodput_rps=_rate(int((met & has_done & w.contains(done)).sum()), w.length_s),
        slo_met=met_n,
        slo_attainment_pct=_pct(met_n, int(inwin.sum())),
    )


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else math.nan


def _mean(x: NDArray[np.int64]) -> float:
    return float(np.mean(x)) if x.size else math.nan


def _prompt_tokens(c: Cols, rows: Mask) -> int:
    """Prompt tokens processed: the endpoint's reported count where given (it says it
    read them, whatever the outcome), else the requested count for ok requests."""
    req, has_req = c.ints["prompt_tokens_requested"]
    rep, has_rep = c.ints["prompt_tokens_reported"]
    use_rep = rows & has_rep
    use_req = rows & ~has_rep & has_req & c.ok
    return int(rep[use_rep].sum() + req[use_req].sum())


def summary_to_json(summary: Summary) -> dict[str, Any]:
    """A JSON-safe dict: NaN -> null; a Dist's unbounded ends are null with a flag (``Dist.to_json``)."""
    return {f.name: _jsonable(getattr(summary, f.name)) for f in fields(summary)}


def _jsonable(v: Any) -> Any:
    if isinstance(v, Dist):
        return v.to_json()
    if isinstance(v, (Window, SLO)):
        return {f.name: _jsonable(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bool, str)) or v is None:
        return v
    if isinstance(v, (int, np.integer)):
        return json_number(v)
    if isinstance(v, (float, np.floating)):  # no scalar figure is infinite; never write "inf"
        return float(v) if math.isfinite(v) else None
    return str(v)
