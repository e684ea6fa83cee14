"""Figures over time: one HdrHistogram per interval, so intervals (and worker shards) merge exactly."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from hdrh.histogram import HdrHistogram
from numpy.typing import NDArray

from loadgen.analysis.chunk_walk import ChunkBlock, chunk_blocks, every_chunk_has_tokens, gaps
from loadgen.analysis.columns import Cols, Floats, Ints, Mask, Tokens, ms
from loadgen.analysis.forked import Beside, start_beside
from loadgen.analysis.interval_counts import (
    ClosingCounter,
    IntervalCounter,
    IntervalCounts,
    IntervalPercentiles,
    percentiles,
    us_index,
)
from loadgen.analysis.window import MetricsError

__all__ = [
    "IntervalHistograms",
    "timeseries",
    "start_timeseries",
    "drop_timeseries",
    "iter_interval_histograms",
    "chart_interval",
    "CHART_INTERVALS",
]


@dataclass
class IntervalHistograms:
    """Latency histograms (microseconds, 3 significant digits) of one interval.

    TTFT by the interval of the first token and ITL by the interval of the chunk,
    of every request that got them however it ended (as ``metrics.summarize`` counts
    them); E2E by the interval of completion, ok requests only (a histogram holds
    no censored sample: a request that never finished has no completion interval). Intervals (or worker
    shards aligned on the same ``t0_ns``) merge exactly with ``HdrHistogram.add``.
    """

    start_ns: int
    ttft: HdrHistogram
    itl: HdrHistogram
    e2e: HdrHistogram


CHART_INTERVALS = 300  # the time-series chart's intervals at most (``chart_interval``)
# chunks per block of the series' walk: its figures are counts (any blocks give the same), and a
# quarter of a million keeps a block's dozen temporaries in cache (twice as fast as 4 Mi)
_SERIES_BLOCK = 1 << 18


def _bucket(t_ns: Ints, t0: int, step: int, nb: int) -> Ints:
    out: Ints = (t_ns - t0) // step
    return np.clip(out, 0, nb - 1, out=out)


def _gaps(blk: ChunkBlock, every: bool) -> tuple[Ints, Ints, Tokens, Ints, Tokens]:
    """A block's token-carrying chunks that follow another of their request: (arrival, gap to it in
    ns, tokens), and the others (each request's first): (arrival, tokens)."""
    if every:  # no chunk to skip: each chunk but a request's first has a gap
        later = blk.later()
        starts = (np.cumsum(blk.lens) - blk.lens)[blk.lens > 0]
        ns, tok = blk.ns, blk.tok
        return ns[1:][later], np.diff(ns)[later], tok[1:][later], ns[starts], tok[starts]
    sel = blk.tok > 0
    ns, tok = blk.ns[sel], blk.tok[sel]
    gap, has_prev = gaps(blk.owner[sel], ns)
    return ns[has_prev], gap[has_prev], tok[has_prev], ns[~has_prev], tok[~has_prev]


def _span(c: Cols, t0: int) -> int:
    ends = [int(c.t_sched.max())]
    ends += [int(v[ok].max()) for v, ok in c.t.values() if ok.any()]
    if (last := c.chunk_max()) is not None:
        ends.append(last)
    return max(ends) - t0


@dataclass
class _Series:
    t0: int
    step: int
    cols: dict[str, NDArray[np.intp] | Floats]  # per interval: request counts; output tokens (floats)
    ttft: IntervalCounts
    itl: IntervalCounts | IntervalPercentiles  # kept whole, or only its percentiles (``_all_series``)
    e2e: IntervalCounts

    def histograms(self, i: int) -> IntervalHistograms:
        assert isinstance(self.itl, IntervalCounts)
        return IntervalHistograms(self.t0 + i * self.step, self.ttft.hist(i), self.itl.hist(i), self.e2e.hist(i))


def _series(table: pa.Table, interval_s: float, t0_ns: int | None) -> _Series | None:
    got = _all_series(table, (interval_s,), t0_ns, keep=True)
    return None if got is None else got[0]


def _all_series(
    table: pa.Table, intervals: tuple[float, ...], t0_ns: int | None, keep: bool = False
) -> list[_Series] | None:
    """The series at each of ``intervals`` (s), in one pass over the chunks: each chunk's gap and
    histogram counter computed once, then bucketed by every interval. The ITL counts are kept
    whole only with ``keep`` (for histograms); else an interval's ITL percentiles are taken as
    soon as no chunk still to come can fall in it (``_later_first``), and its counts let go."""
    for interval_s in intervals:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise MetricsError(f"interval must be > 0 s, got {interval_s!r}")
    c = Cols.of(table)
    if c.n == 0:
        return None
    t0 = int(c.t_sched.min()) if t0_ns is None else int(t0_ns)
    span = _span(c, t0)
    steps = [max(round(interval_s * 1e9), 1) for interval_s in intervals]
    sizes = [span // step + 1 for step in steps]
    (sent, has_sent), (first, has_first), (done, has_done) = c.t["t_sent"], c.t["t_first"], c.t["t_done"]
    m = c.ok & has_done
    ttft_ms, e2e_ms = ms(first[has_first], c.t_sched[has_first]), ms(done[m], c.t_sched[m])
    tokens = [np.zeros(nb) for nb in sizes]
    itl_at = [IntervalPercentiles(nb, _PS) for nb in sizes]
    itl = [IntervalCounter() if keep else ClosingCounter(at) for at in itl_at]
    later_first = None if keep else _later_first(c)
    every = every_chunk_has_tokens(c)
    for blk in chunk_blocks(c, size=_SERIES_BLOCK):
        at, gap, k, first_ns, first_tok = _gaps(blk, every)
        counter = us_index(gap / 1e6 / k)
        kf, ff = k.astype(np.float64), first_tok.astype(np.float64)
        spans = (int(at.min()), int(at.max()), int(counter.min()), int(counter.max())) if at.size else None
        bound = None if later_first is None else int(later_first[blk.row0 + blk.lens.size])
        for step, nb, tok, acc in zip(steps, sizes, tokens, itl, strict=True):
            arrived = _bucket(at, t0, step, nb)  # each gap's interval: its chunk's
            np.add(tok, np.bincount(_bucket(first_ns, t0, step, nb), weights=ff, minlength=nb), out=tok)
            final = 0 if bound is None else nb if bound == _NONE_LATER else min(max((bound - t0) // step, 0), nb - 1)
            if spans is None or isinstance(acc, IntervalCounter):  # (a ClosingCounter sums the gaps' tokens)
                np.add(tok, np.bincount(arrived, weights=kf, minlength=nb), out=tok)
                acc.add(arrived, counter, k, final)
            else:
                lo, hi = (min(max((t - t0) // step, 0), nb - 1) for t in spans[:2])
                acc.add(arrived, counter, kf, final, (lo, hi, spans[2], spans[3]))
    out = []
    for step, nb, tok, acc, at_pct in zip(steps, sizes, tokens, itl, itl_at, strict=True):

        def per(t: Ints, mask: Mask, step: int = step, nb: int = nb) -> NDArray[np.intp]:
            return np.bincount(_bucket(t[mask], t0, step, nb), minlength=nb)

        cols: dict[str, NDArray[np.intp] | Floats] = {
            "sent": per(sent, has_sent),
            "completed": per(done, m),
            "errors": per(np.where(has_done, done, c.t_sched), ~c.ok),
            "in_flight": np.cumsum(per(sent, has_sent)) - np.cumsum(per(done, has_sent & has_done)),
            "output_tokens": tok,
        }
        ttft = IntervalCounts.of(_bucket(first[has_first], t0, step, nb), ttft_ms)
        e2e = IntervalCounts.of(_bucket(done[m], t0, step, nb), e2e_ms)
        if isinstance(acc, IntervalCounter):  # (keep)
            out.append(_Series(t0, step, cols, ttft, acc.done(), e2e))
        else:
            acc.flush()
            cols["output_tokens"] = tok + acc.sums  # (each request's first chunk's, then the others')
            out.append(_Series(t0, step, cols, ttft, at_pct, e2e))
    return out


_PS = (50, 99)  # the time series' percentiles
_NONE_LATER = np.iinfo(np.int64).max


def _later_first(c: Cols) -> Ints:
    """Per row, then one more: the earliest chunk arrival of the rows from it on (``_NONE_LATER``
    past the last chunk), so the intervals before it are complete once the rows before it are
    walked. One pass over the arrivals, whatever their order within a request."""
    first = np.full(c.n + 1, _NONE_LATER, dtype=np.int64)
    ends = [r for r, _, _ in c.c_parts[1:]] + [c.n]
    for (r0, ns, _), r1 in zip(c.c_parts, ends, strict=True):
        lens = c.c_len[r0:r1]
        rows = np.flatnonzero(lens)
        if rows.size:
            starts = c.c_start[r0 + rows] - c.c_start[r0]
            first[r0 + rows] = np.minimum.reduceat(ns, starts)
    out: Ints = np.minimum.accumulate(first[::-1])[::-1]
    return out


def iter_interval_histograms(
    table: pa.Table, interval_s: float = 1.0, t0_ns: int | None = None
) -> Iterator[IntervalHistograms]:
    """Histograms per interval from ``t0_ns`` (default: first t_sched), built one
    interval at a time (each set holds ~0.5 MB of counters)."""
    series = _series(table, interval_s, t0_ns)
    if series is not None:
        for i in range(series.cols["sent"].size):
            yield series.histograms(i)


def chart_interval(table: pa.Table) -> float:
    """The interval (s) of report.html's time-series chart: 1 s, or longer so that the run's
    schedule spans at most ``CHART_INTERVALS`` of them."""
    t = Cols.of(table).t_sched
    return max(1.0, (int(t.max()) - int(t.min())) / 1e9 / CHART_INTERVALS) if t.size else 1.0


def timeseries(table: pa.Table, interval_s: float = 1.0) -> list[dict[str, Any]]:
    """Per-interval rows from the first t_sched: requests sent, completed ok,
    errors (by completion), in flight at the interval's end, output tok/s, and
    TTFT/ITL p50/p99 in ms (from the HdrHistograms, so within 0.1 %; None when
    no first token / chunk arrived in the interval).

    Computed once per table and interval; the first call also computes, in the same pass over
    the chunks, the rows at ``chart_interval`` (what report.html charts after summary.json's 1 s)."""
    if table.num_rows == 0:
        return []
    c = Cols.of(table)
    pending = c.memo.pop(_BESIDE, None)
    if isinstance(pending, Beside):  # computed beside (``start_timeseries``): its rows
        c.memo.update(pending.result())
    return _timeseries(table, c, interval_s)


def _timeseries(table: pa.Table, c: Cols, interval_s: float) -> list[dict[str, Any]]:
    wanted = tuple(dict.fromkeys((interval_s, chart_interval(table))))
    missing = tuple(i for i in wanted if ("timeseries", i) not in c.memo)
    if missing:
        for i, series in zip(missing, _all_series(table, missing, None) or [], strict=True):
            c.memo[("timeseries", i)] = _rows(series, i)
    rows: list[dict[str, Any]] = c.memo[("timeseries", interval_s)]
    return rows


def start_timeseries(table: pa.Table, interval_s: float = 1.0) -> None:
    """Start computing ``timeseries(table, interval_s)`` (and the chart's rows) beside the
    figures computed meanwhile, in a forked child (``forked.start_beside``: on the other core,
    the table's columns shared copy-on-write); ``timeseries`` takes its rows when asked for them,
    or raises what computing them raised."""
    if table.num_rows == 0:
        return
    c = Cols.of(table)  # (converted here, once, for both processes)
    if _BESIDE not in c.memo and ("timeseries", interval_s) not in c.memo:
        c.memo[_BESIDE] = start_beside(lambda: _computed(table, interval_s))


def drop_timeseries(table: pa.Table) -> None:
    """Wait for rows ``start_timeseries`` began and drop them (the report failed before asking
    for them): the child is reaped, not left behind, and its own error, if any, is second to the
    report's."""
    if table.num_rows == 0:
        return
    pending = Cols.of(table).memo.pop(_BESIDE, None)
    if isinstance(pending, Beside):
        pending.exception()


_BESIDE = ("timeseries", "beside")  # Cols.memo's key of the rows being computed beside


def _computed(table: pa.Table, interval_s: float) -> dict[tuple[str, float], list[dict[str, Any]]]:
    c = Cols.of(table)  # (forked before the parent's memo held _BESIDE: not among these)
    _timeseries(table, c, interval_s)
    return {k: v for k, v in c.memo.items() if isinstance(k, tuple) and k[0] == "timeseries"}


def _rows(series: _Series, interval_s: float) -> list[dict[str, Any]]:
    nb = series.cols["sent"].size
    assert isinstance(series.itl, IntervalPercentiles)
    pct = {"ttft": percentiles(series.ttft, nb, _PS), "itl": series.itl.at}
    rows = []
    for i in range(nb):
        row: dict[str, Any] = {"t_s": i * series.step / 1e9}
        row.update({k: int(v[i]) for k, v in series.cols.items() if k != "output_tokens"})
        row["output_tps"] = float(series.cols["output_tokens"][i]) / interval_s
        for name, at in pct.items():
            for p, values in at.items():
                row[f"{name}_p{p}_ms"] = None if values[i] < 0 else int(values[i]) / 1000
        rows.append(row)
    return rows
