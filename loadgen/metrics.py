"""Every figure of a report, computed from the records (DESIGN.md, "the contract").

The engine only times and records; this module is the one place where records
become numbers, so a report can always be re-rendered from a run folder. Inputs
are Arrow tables with ``records.SCHEMA`` (one run, or one load point of a sweep).
Columns are converted to numpy once and everything is vectorised, including the
per-chunk list columns, so a million-request run summarises in seconds.

Conventions: latencies are in milliseconds; only ``ok`` requests enter latency
distributions (failed, cancelled and partial requests are counted, never mixed
in); open-loop latency is measured from the intended send time ``t_sched``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hdrh.histogram import HdrHistogram

from .records import STATUSES
from .stats import Dist, describe, json_number, min_samples_bounded

__all__ = [
    "MetricsError",
    "Window",
    "SLO",
    "Summary",
    "IntervalHistograms",
    "choose_window",
    "summarize",
    "validity_warnings",
    "summary_to_json",
    "timeseries",
    "interval_histograms",
    "iter_interval_histograms",
    "hist_percentile",
    "HIST_HIGHEST_US",
]

# HdrHistogram range: 1 us .. 1 hour, 3 significant digits (0.1 % relative error).
HIST_HIGHEST_US = 3_600_000_000
_HIST_DIGITS = 3
_EXAMPLES = 5
_ERROR_CHARS = 160
_EXAMPLE_SCAN = 10_000  # failed rows searched for distinct example errors


class MetricsError(ValueError):
    """Records or options that cannot give a meaningful figure (e.g. an empty window)."""


# --------------------------------------------------------------------------- columns


@dataclass
class _Cols:
    """The table's columns as numpy arrays (ints with a validity mask, never NaN)."""

    n: int
    t_sched: np.ndarray
    t: dict[str, tuple[np.ndarray, np.ndarray]]  # t_sent/t_first/t_last/t_done -> (ns, valid)
    status: np.ndarray
    ok: np.ndarray
    out: np.ndarray
    ints: dict[str, tuple[np.ndarray, np.ndarray]]
    source: np.ndarray
    finish: np.ndarray
    error: np.ndarray
    c_owner: np.ndarray  # per output-carrying chunk: its row
    c_ns: np.ndarray
    c_tok: np.ndarray
    c_len: np.ndarray  # per row: number of chunks

    @classmethod
    def of(cls, table: pa.Table) -> _Cols:
        n = table.num_rows
        status = _strings(table, "status")
        owner, ns, tok, lens = _chunks(table)
        ints = (
            "prompt_tokens_requested",
            "prompt_tokens_reported",
            "output_tokens_requested",
            "output_tokens_reported",
            "http_status",
        )
        return cls(
            n=n,
            t_sched=_int(table, "t_sched")[0],
            t={k: _int(table, k) for k in ("t_sent", "t_first", "t_last", "t_done")},
            status=status,
            ok=status == "ok",
            out=_int(table, "output_tokens")[0],
            ints={k: _int(table, k) for k in ints},
            source=_strings(table, "output_tokens_source"),
            finish=_strings(table, "finish_reason"),
            error=_strings(table, "error"),
            c_owner=owner,
            c_ns=ns,
            c_tok=tok,
            c_len=lens,
        )


def _int(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table.column(name)
    valid = np.asarray(col.is_valid().to_numpy(), dtype=bool)
    return np.asarray(pc.fill_null(col, 0).to_numpy(), dtype=np.int64), valid


def _strings(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy(), dtype=object)


def _list_col(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    arr = table.column(name).combine_chunks()
    lens = np.asarray(pc.fill_null(pc.list_value_length(arr), 0).to_numpy(), dtype=np.int64)
    vals = np.asarray(pc.fill_null(arr.flatten(), 0).to_numpy(), dtype=np.int64)
    return vals, lens


def _chunks(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Flattened chunk arrays. A row whose token list does not match its arrival
    list (a malformed record) falls back to one token per chunk."""
    ns, lens = _list_col(table, "chunk_ns")
    tok_vals, tok_lens = _list_col(table, "chunk_tokens")
    rows = np.arange(table.num_rows)
    owner = np.repeat(rows, lens)
    if np.array_equal(lens, tok_lens):
        tok = tok_vals
    else:
        good = lens == tok_lens
        tok = np.ones(ns.size, dtype=np.int64)
        tok[good[owner]] = tok_vals[good[np.repeat(rows, tok_lens)]]
    return owner, ns, tok, lens


def _gaps(owner: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gap to the previous chunk of the same request, mask of chunks that have one)."""
    has_prev = np.zeros(owner.size, dtype=bool)
    has_prev[1:] = owner[1:] == owner[:-1]
    gap = np.zeros(ns.size, dtype=np.int64)
    gap[1:] = np.diff(ns)
    return gap, has_prev


def _ms(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a - b) in ms; the int64 difference is taken first so ns precision is kept."""
    return (a - b).astype(np.float64) / 1e6


# --------------------------------------------------------------------------- window


@dataclass(frozen=True)
class Window:
    """The measurement window [start_ns, end_ns) in perf_counter_ns.

    A request is in the window when its t_sched is; throughput counts tokens
    whose chunks arrived in it. ``t0_ns`` (the first t_sched) is the origin for
    the relative times shown in reports.
    """

    start_ns: int
    end_ns: int
    t0_ns: int
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    warmup_requests: int = 0
    cooldown_requests: int = 0
    how: str = ""

    @property
    def length_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def contains(self, t_ns: np.ndarray) -> np.ndarray:
        return (t_ns >= self.start_ns) & (t_ns < self.end_ns)

    def __str__(self) -> str:
        a, b = (self.start_ns - self.t0_ns) / 1e9, (self.end_ns - self.t0_ns) / 1e9
        return f"window {a:.3f}-{b:.3f} s ({self.length_s:.3f} s): {self.how}"


def choose_window(
    table: pa.Table,
    *,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
    warmup_requests: int = 0,
    cooldown_requests: int = 0,
) -> Window:
    """Trim warm-up from the start and cool-down from the end of the schedule span.

    The span runs from the first t_sched to the last plus one mean gap, so with
    no trimming every request is inside and a constant rate r gives an offered
    rate of exactly r. Time and count trims combine (the stricter wins); count
    trims follow t_sched order. A zero span (one request) gives
    [t_sched, last completion].
    """
    for name, v in (("warmup_s", warmup_s), ("cooldown_s", cooldown_s)):
        if not (math.isfinite(v) and v >= 0):
            raise MetricsError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
    for name, k in (("warmup_requests", warmup_requests), ("cooldown_requests", cooldown_requests)):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise MetricsError(f"{name} must be an integer >= 0, got {k!r}")
    opts = dict(
        warmup_s=warmup_s,
        cooldown_s=cooldown_s,
        warmup_requests=warmup_requests,
        cooldown_requests=cooldown_requests,
    )
    ts = np.sort(_int(table, "t_sched")[0])
    n = ts.size
    if n == 0:
        return Window(0, 0, 0, **opts, how="no requests")
    if warmup_requests + cooldown_requests >= n:
        raise MetricsError(
            f"warm-up ({warmup_requests}) + cool-down ({cooldown_requests}) requests "
            f"leave none of the {n} requests to measure"
        )
    first, last = int(ts[0]), int(ts[-1])
    if last == first:
        done = [int(v.max()) for k in ("t_done", "t_last") if (v := _valid(table, k)).size]
        end = max([first + 1, *done])
        return Window(
            first, end, first, **opts, how="one scheduled instant: until the last completion"
        )
    span_end = last + (last - first) // (n - 1)
    start = first + round(warmup_s * 1e9)
    if warmup_requests:
        start = max(start, int(ts[warmup_requests]))
    end = span_end - round(cooldown_s * 1e9)
    if cooldown_requests:
        end = min(end, int(ts[n - cooldown_requests]))
    if end <= start:
        raise MetricsError(
            f"warm-up and cool-down leave no measurement window: the schedule spans "
            f"{(span_end - first) / 1e9:.3f} s"
        )
    how = (
        f"requests scheduled in the window; warm-up {warmup_s:g} s / {warmup_requests} req, "
        f"cool-down {cooldown_s:g} s / {cooldown_requests} req"
    )
    return Window(start, end, first, **opts, how=how)


def _valid(table: pa.Table, name: str) -> np.ndarray:
    vals, ok = _int(table, name)
    return vals[ok]


# --------------------------------------------------------------------------- SLO


@dataclass(frozen=True)
class SLO:
    """Per-request latency bounds in ms; a bound left as None is not checked."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise MetricsError(f"SLO {f.name} must be a finite number > 0, got {v!r}")

    def met(self, ttft_ms: np.ndarray, tpot_ms: np.ndarray, e2e_ms: np.ndarray) -> np.ndarray:
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
    Latency Dists hold ok requests only; ``schedule_lag`` holds every request that
    was sent (it describes the client). ``ttft_sent`` is TTFT from the actual send,
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
    failed: int  # neither ok nor cancelled
    cancelled: int
    window_s: float
    schedule_lag: Dist
    ttft: Dist
    ttft_sent: Dist
    e2e: Dist
    tpot: Dist
    itl: Dist
    icl: Dist
    per_user_tps: Dist  # 1000 / TPOT per request (TPOT 0, one burst, left out)
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
    slo_attainment_pct: float | None  # met / scheduled in window; failures miss
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
    token_sources: dict[str, int]
    token_mismatch: int  # reported usage != sum of chunk tokens
    single_burst: int  # ok, >= 2 tokens, all in one chunk (no real streaming)
    errors_by_status: dict[str, int]
    errors_by_http: dict[str, int]
    error_examples: list[str]


def summarize(table: pa.Table, window: Window | None = None, slo: SLO | None = None) -> Summary:
    """Fold the records into a Summary; the window defaults to the whole schedule span."""
    c = _Cols.of(table)
    w = window if window is not None else choose_window(table)
    length = w.length_s
    inwin = w.contains(c.t_sched)
    okw = inwin & c.ok
    (sent, has_sent), (first, has_first), (last, has_last), (done, has_done) = (
        c.t[k] for k in ("t_sent", "t_first", "t_last", "t_done")
    )
    # Per-request latencies of every ok request (goodput also counts requests
    # scheduled before the window that finish inside it); Dists take the window's.
    nan = np.full(c.n, np.nan)
    a_ttft = c.ok & has_first & (c.out >= 1)
    a_e2e = c.ok & has_done
    a_tpot = c.ok & has_first & has_last & (c.out >= 2)
    ttft, e2e, tpot = nan.copy(), nan.copy(), nan.copy()
    ttft[a_ttft] = _ms(first[a_ttft], c.t_sched[a_ttft])
    e2e[a_e2e] = _ms(done[a_e2e], c.t_sched[a_e2e])
    tpot[a_tpot] = _ms(last[a_tpot], first[a_tpot]) / (c.out[a_tpot] - 1)
    m_ttft, m_e2e, m_tpot = a_ttft & inwin, a_e2e & inwin, a_tpot & inwin
    m_lag = inwin & has_sent
    m_ts = m_ttft & has_sent
    itl, icl = _itl_icl(c, okw)
    tp = tpot[m_tpot]

    chunk_in = w.contains(c.c_ns)
    out_all = int(c.c_tok[chunk_in].sum())
    out_ok = int(c.c_tok[chunk_in & c.ok[c.c_owner]].sum())
    prompt_in = _prompt_tokens(c, inwin)

    goodput = met_n = attain = None
    if slo is not None:
        met = c.ok & slo.met(ttft, tpot, e2e)
        goodput = _rate(int((met & has_done & w.contains(done)).sum()), length)
        met_n = int((met & inwin).sum())
        attain = _pct(met_n, int(inwin.sum()))

    counts = _status_counts(c.status[inwin])
    n_in = int(inwin.sum())
    return Summary(
        window=w,
        slo=slo,
        records=c.n,
        requests=n_in,
        before_window=int((c.t_sched < w.start_ns).sum()),
        after_window=int((c.t_sched >= w.end_ns).sum()),
        by_status=counts,
        ok=counts.get("ok", 0),
        failed=n_in - counts.get("ok", 0) - counts.get("cancelled", 0),
        cancelled=counts.get("cancelled", 0),
        window_s=length,
        schedule_lag=describe(_ms(sent[m_lag], c.t_sched[m_lag])),
        ttft=describe(ttft[m_ttft]),
        ttft_sent=describe(_ms(first[m_ts], sent[m_ts])),
        e2e=describe(e2e[m_e2e]),
        tpot=describe(tp),
        itl=describe(itl),
        icl=describe(icl),
        per_user_tps=describe(1000.0 / tp[tp > 0]),
        output_tokens_in_window=out_all,
        output_tokens_in_window_ok=out_ok,
        output_tps=_rate(out_all, length),
        output_tps_ok=_rate(out_ok, length),
        prompt_tokens_in_window=prompt_in,
        total_tps=_rate(out_all + prompt_in, length),
        offered_rps=_rate(n_in, length),
        sent_rps=_rate(int((has_sent & w.contains(sent)).sum()), length),
        completed_rps=_rate(int((c.ok & has_done & w.contains(done)).sum()), length),
        goodput_rps=goodput,
        slo_met=met_n,
        slo_attainment_pct=attain,
        success_pct=_pct(counts.get("ok", 0), n_in),
        **_token_fields(c, inwin, okw),
        **_error_fields(c, inwin),
    )


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else math.nan


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if x.size else math.nan


def _itl_icl(c: _Cols, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ITL: a chunk of k tokens arriving g after the previous token-carrying chunk
    gives k samples of g/k (zero-token chunks are skipped, so their time goes to
    the next token). ICL: raw gaps between consecutive output chunks."""
    sel = rows[c.c_owner]
    owner, ns, tok = c.c_owner[sel], c.c_ns[sel], c.c_tok[sel]
    gap, has_prev = _gaps(owner, ns)
    icl = gap[has_prev] / 1e6
    t = tok > 0
    gap, has_prev = _gaps(owner[t], ns[t])
    k = tok[t][has_prev]
    itl = np.repeat(gap[has_prev] / 1e6 / k, k)
    return itl, icl


def _prompt_tokens(c: _Cols, rows: np.ndarray) -> int:
    """Prompt tokens processed: the endpoint's reported count where given (it says it
    read them, whatever the outcome), else the requested count for ok requests."""
    req, has_req = c.ints["prompt_tokens_requested"]
    rep, has_rep = c.ints["prompt_tokens_reported"]
    use_rep = rows & has_rep
    use_req = rows & ~has_rep & has_req & c.ok
    return int(rep[use_rep].sum() + req[use_req].sum())


def _token_fields(c: _Cols, inwin: np.ndarray, okw: np.ndarray) -> dict[str, Any]:
    req, has_req = c.ints["prompt_tokens_requested"]
    rep, has_rep = c.ints["prompt_tokens_reported"]
    both = inwin & has_req & has_rep
    req_sum = int(req[both].sum())
    oreq, has_oreq = c.ints["output_tokens_requested"]
    orep, has_orep = c.ints["output_tokens_reported"]
    chunk_sum = np.bincount(c.c_owner, weights=c.c_tok, minlength=c.n).astype(np.int64)
    asked = okw & has_oreq
    return dict(
        prompt_compared=int(both.sum()),
        prompt_requested_mean=_mean(req[both]),
        prompt_reported_mean=_mean(rep[both]),
        prompt_gap_mean=_mean(rep[both] - req[both]),
        prompt_gap_pct=_pct(int(rep[both].sum()) - req_sum, req_sum),
        output_requested_mean=_mean(oreq[asked]),
        output_counted_mean=_mean(c.out[okw]),
        output_short=int((asked & (c.out < oreq)).sum()),
        finish_reasons=_counts(c.finish[okw], none="none"),
        token_sources=_counts(c.source[inwin], none="none"),
        token_mismatch=int((inwin & has_orep & (orep != chunk_sum)).sum()),
        single_burst=int((okw & (c.out >= 2) & (c.c_len == 1)).sum()),
    )


def _error_fields(c: _Cols, inwin: np.ndarray) -> dict[str, Any]:
    bad = inwin & ~c.ok
    http, has_http = c.ints["http_status"]
    http_keys = np.where(has_http[bad], http[bad].astype(str), "none")
    examples: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    for i in np.flatnonzero(bad)[:_EXAMPLE_SCAN]:  # counts above are complete
        key = (c.status[i], int(http[i]) if has_http[i] else None, c.error[i])
        if key in seen:
            continue
        seen.add(key)
        code = f" {key[1]}" if key[1] is not None else ""
        text = (key[2] or "")[:_ERROR_CHARS]
        examples.append(f"{key[0]}{code}: {text}" if text else f"{key[0]}{code}")
        if len(examples) >= _EXAMPLES:
            break
    return dict(
        errors_by_status=_counts(c.status[bad], none="none"),
        errors_by_http=_counts(http_keys, none="none"),
        error_examples=examples,
    )


def _counts(values: np.ndarray, none: str) -> dict[str, int]:
    return dict(sorted(Counter(none if v is None else str(v) for v in values).items()))


def _status_counts(status: np.ndarray) -> dict[str, int]:
    found = _counts(status, none="none")
    out = {s: found.pop(s, 0) for s in STATUSES}
    out.update(found)  # unknown statuses are kept, not dropped
    return out


# --------------------------------------------------------------------------- validity


def validity_warnings(
    summary: Summary, *, lag_p99_limit_ms: float = 10.0, min_samples: int = 100
) -> list[str]:
    """Reasons a reader should distrust or qualify this result, in plain words."""
    s, out = summary, []
    lag99 = s.schedule_lag.pct(99)[0]
    if lag99 > lag_p99_limit_ms:
        out.append(
            f"schedule lag p99 is {lag99:.1f} ms (limit {lag_p99_limit_ms:g} ms): "
            "the client fell behind its schedule; result suspect"
        )
    if s.ok == 0 and s.requests:
        out.append(f"no request succeeded out of {s.requests} in the window")
    for name, d in (("TTFT", s.ttft), ("TPOT", s.tpot), ("E2E", s.e2e)):
        need = max(min_samples, min_samples_bounded(99, d.confidence))
        if 0 < d.n < need:
            out.append(
                f"only {d.n} {name} samples: a p99 with a bounded "
                f"{d.confidence:.0%} interval needs at least {need}"
            )
    if s.token_mismatch:
        out.append(
            f"{s.token_mismatch} requests: reported output tokens differ from the streamed count"
        )
    if s.prompt_compared and abs(s.prompt_gap_pct) > 10:
        out.append(
            f"prompt tokens reported differ from requested by {s.prompt_gap_pct:+.1f} % "
            "(tokenizer mismatch? prompts are not the size intended)"
        )
    if s.output_short:
        out.append(
            f"{s.output_short} of {s.ok} ok requests ended before max_tokens "
            "(is ignore_eos honoured?); shorter outputs flatter latency"
        )
    if s.single_burst:
        out.append(f"{s.single_burst} responses arrived in one chunk (buffered, not streamed?)")
    if s.failed:
        detail = ", ".join(f"{k} {v}" for k, v in s.errors_by_status.items() if k != "cancelled")
        out.append(f"{s.failed} of {s.requests} requests failed ({detail})")
    if s.cancelled:
        out.append(f"{s.cancelled} requests were cancelled (still in flight at stop)")
    return out


def summary_to_json(summary: Summary) -> dict[str, Any]:
    """A JSON-safe dict (NaN -> null, inf -> "inf")."""
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
    if isinstance(v, (int, float, np.integer, np.floating)):
        return json_number(v)
    return str(v)


# --------------------------------------------------------------------------- time series


@dataclass
class IntervalHistograms:
    """Latency histograms (microseconds, 3 significant digits) of one interval.

    TTFT by the interval of the first token, ITL by the interval of the chunk,
    E2E by the interval of completion; ok requests only. Intervals (or worker
    shards aligned on the same ``t0_ns``) merge exactly with ``HdrHistogram.add``.
    """

    start_ns: int
    ttft: HdrHistogram
    itl: HdrHistogram
    e2e: HdrHistogram


def hist_percentile(h: HdrHistogram, p: float) -> int:
    """``h.get_value_at_percentile(p)`` computed with numpy (the library walks
    every counter in Python, ~2 ms a call)."""
    counts = np.ctypeslib.as_array(h.counts)
    idx = int(np.searchsorted(np.cumsum(counts), h.get_target_count_at_percentile(p)))
    if idx >= counts.size:
        return 0
    return int(h.get_highest_equivalent_value(h.get_value_from_index(idx)))


@dataclass
class _Sparse:
    """Values already quantised to HdrHistogram bins, grouped by interval, so a
    histogram is filled with one ``record_value`` per distinct bin."""

    bucket: np.ndarray  # sorted
    value: np.ndarray  # lowest equivalent value, us
    count: np.ndarray

    @classmethod
    def of(cls, bucket: np.ndarray, ms: np.ndarray, counts: np.ndarray | None = None) -> _Sparse:
        v = np.clip(np.rint(ms * 1000.0), 0, HIST_HIGHEST_US).astype(np.int64)
        # Below 2048 us bins are exact; above, the top 11 bits are kept.
        shift = np.maximum(np.frexp(v.astype(np.float64))[1] - 11, 0)
        v = (v >> shift) << shift
        key = bucket.astype(np.int64) * (HIST_HIGHEST_US + 1) + v
        w = np.ones(v.size) if counts is None else counts.astype(np.float64)
        uniq, inv = np.unique(key, return_inverse=True)
        total = np.rint(np.bincount(inv.ravel(), weights=w, minlength=uniq.size)).astype(np.int64)
        b, val = np.divmod(uniq, HIST_HIGHEST_US + 1)
        return cls(b, val, total)

    def hist(self, i: int) -> HdrHistogram:
        h = HdrHistogram(1, HIST_HIGHEST_US, _HIST_DIGITS)
        lo, hi = np.searchsorted(self.bucket, [i, i + 1])
        _fill(h, self.value[lo:hi], self.count[lo:hi])
        return h


def _fill(h: HdrHistogram, values: np.ndarray, counts: np.ndarray) -> None:
    """``h.record_value(v, n)`` for each pair, vectorised.

    ``record_value`` costs ~7 us in Python, too slow for a million ITL samples,
    so the counter index is computed as the library does and the counters are
    added in place; tests pin this to per-value recording.
    """
    if values.size == 0:
        return
    v = values.astype(np.int64)
    bits = np.frexp((v | h.sub_bucket_mask).astype(np.float64))[1]  # bit length
    bucket = bits - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    sub = v >> (bucket + h.unit_magnitude)
    idx = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub - h.sub_bucket_half_count
    np.add.at(np.ctypeslib.as_array(h.counts), idx, counts.astype(np.uint64))
    h.total_count += int(counts.sum())
    h.min_value = min(h.min_value, int(v.min()))
    h.max_value = max(h.max_value, int(v.max()))


def _bucket(t_ns: np.ndarray, t0: int, step: int, nb: int) -> np.ndarray:
    return np.clip((t_ns - t0) // step, 0, nb - 1)


def _span(c: _Cols, t0: int) -> int:
    ends = [int(c.t_sched.max())]
    ends += [int(v[ok].max()) for v, ok in c.t.values() if ok.any()]
    if c.c_ns.size:
        ends.append(int(c.c_ns.max()))
    return max(ends) - t0


@dataclass
class _Series:
    t0: int
    step: int
    cols: dict[str, np.ndarray]
    ttft: _Sparse
    itl: _Sparse
    e2e: _Sparse

    def histograms(self, i: int) -> IntervalHistograms:
        return IntervalHistograms(
            self.t0 + i * self.step, self.ttft.hist(i), self.itl.hist(i), self.e2e.hist(i)
        )


def _series(table: pa.Table, interval_s: float, t0_ns: int | None) -> _Series | None:
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise MetricsError(f"interval must be > 0 s, got {interval_s!r}")
    c = _Cols.of(table)
    if c.n == 0:
        return None
    t0 = int(c.t_sched.min()) if t0_ns is None else int(t0_ns)
    step = max(round(interval_s * 1e9), 1)
    nb = _span(c, t0) // step + 1
    (sent, has_sent), (first, has_first), _, (done, has_done) = c.t.values()

    def per(t: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.bincount(_bucket(t[mask], t0, step, nb), minlength=nb)

    m = c.ok & has_first & (c.out >= 1)
    ttft = _Sparse.of(_bucket(first[m], t0, step, nb), _ms(first[m], c.t_sched[m]))
    m = c.ok & has_done
    e2e = _Sparse.of(_bucket(done[m], t0, step, nb), _ms(done[m], c.t_sched[m]))
    sel = c.ok[c.c_owner] & (c.c_tok > 0)
    gap, has_prev = _gaps(c.c_owner[sel], c.c_ns[sel])
    k = c.c_tok[sel][has_prev]
    itl = _Sparse.of(_bucket(c.c_ns[sel][has_prev], t0, step, nb), gap[has_prev] / 1e6 / k, k)
    cols = {
        "sent": per(sent, has_sent),
        "completed": per(done, c.ok & has_done),
        "errors": per(np.where(has_done, done, c.t_sched), ~c.ok),
        "in_flight": np.cumsum(per(sent, has_sent)) - np.cumsum(per(done, has_sent & has_done)),
        "output_tokens": np.bincount(_bucket(c.c_ns, t0, step, nb), weights=c.c_tok, minlength=nb),
    }
    return _Series(t0, step, cols, ttft, itl, e2e)


def iter_interval_histograms(
    table: pa.Table, interval_s: float = 1.0, t0_ns: int | None = None
) -> Iterator[IntervalHistograms]:
    """Histograms per interval from ``t0_ns`` (default: first t_sched), built one
    interval at a time (each set holds ~0.5 MB of counters)."""
    series = _series(table, interval_s, t0_ns)
    if series is not None:
        for i in range(series.cols["sent"].size):
            yield series.histograms(i)


def interval_histograms(
    table: pa.Table, interval_s: float = 1.0, t0_ns: int | None = None
) -> list[IntervalHistograms]:
    """All of ``iter_interval_histograms`` as a list (mind memory on long runs)."""
    return list(iter_interval_histograms(table, interval_s, t0_ns))


def timeseries(table: pa.Table, interval_s: float = 1.0) -> list[dict[str, Any]]:
    """Per-interval rows from the first t_sched: requests sent, completed ok,
    errors (by completion), in flight at the interval's end, output tok/s, and
    TTFT/ITL p50/p99 in ms (from the HdrHistograms, so within 0.1 %; None when
    no first token / chunk arrived in the interval)."""
    series = _series(table, interval_s, None)
    if series is None:
        return []
    rows = []
    for i in range(series.cols["sent"].size):
        row: dict[str, Any] = {"t_s": i * series.step / 1e9}
        row.update({k: int(v[i]) for k, v in series.cols.items() if k != "output_tokens"})
        row["output_tps"] = float(series.cols["output_tokens"][i]) / interval_s
        for name, sp in (("ttft", series.ttft), ("itl", series.itl)):
            h = sp.hist(i)
            for p in (50, 99):
                empty = h.get_total_count() == 0
                row[f"{name}_p{p}_ms"] = None if empty else hist_percentile(h, p) / 1000
        rows.append(row)
    return rows
