"""Figures over time: one HdrHistogram per interval, so intervals (and worker shards) merge exactly."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from hdrh.histogram import HdrHistogram
from numpy.typing import NDArray

from loadgen.analysis.columns import Cols, Floats, Ints, Mask, Tokens, chunk_blocks, gaps, ms
from loadgen.analysis.window import MetricsError

__all__ = [
    "IntervalHistograms",
    "timeseries",
    "iter_interval_histograms",
    "hist_percentile",
    "chart_interval",
    "CHART_INTERVALS",
    "HIST_HIGHEST_US",
]

# HdrHistogram range: 1 us .. 1 hour, 3 significant digits (0.1 % relative error).
HIST_HIGHEST_US = 3_600_000_000
_HIST_DIGITS = 3


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


def hist_percentile(h: HdrHistogram, p: float) -> int:
    """``h.get_value_at_percentile(p)`` computed with numpy (the library walks
    every counter in Python, ~2 ms a call)."""
    counts = np.ctypeslib.as_array(h.counts)
    idx = int(np.searchsorted(np.cumsum(counts), h.get_target_count_at_percentile(p)))
    if idx >= counts.size:
        return 0
    return int(h.get_highest_equivalent_value(h.get_value_from_index(idx)))


_TEMPLATE = HdrHistogram(1, HIST_HIGHEST_US, _HIST_DIGITS)
_BINS = int(_TEMPLATE.counts_len)  # counters of one histogram
# a block's (interval, counter) pairs are counted densely when they number at most 4 per sample
# (or 64 Ki), else by sorting the samples' keys
_DENSE_PER_SAMPLE, _DENSE_MIN = 4, 1 << 16
_MERGE_PAIRS = 1 << 20  # pairs counted by blocks before they are merged (``_SparseCounts``): 50 MB to sort
CHART_INTERVALS = 300  # the time-series chart's intervals at most (``chart_interval``)
# chunks per block of the series' walk: its figures are counts (any blocks give the same), and a
# quarter of a million keeps a block's dozen temporaries in cache (twice as fast as 4 Mi)
_SERIES_BLOCK = 1 << 18


def _counter_index(v: Ints) -> Ints:
    """The HdrHistogram counter of each value (us), as the library computes it (``_fill``); a
    value and its bin's lowest equivalent value (``_quantised``) have the same counter."""
    h = _TEMPLATE
    # bit length, as frexp's exponent: that of the value as a float (exact below 2**53)
    bits = ((v | h.sub_bucket_mask).astype(np.float64).view(np.int64) >> 52) - 1022
    bucket = bits - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    sub = v >> (bucket + h.unit_magnitude)
    idx: Ints = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub - h.sub_bucket_half_count
    return idx


_LOWEST = np.array([_TEMPLATE.get_value_from_index(i) for i in range(_BINS)], dtype=np.int64)  # per counter
assert _BINS < 2**15  # (a counter fits an int16: _Sparse)


def _us_index(value_ms: Floats) -> Ints:
    """The HdrHistogram counter of each value in ms (rounded to us, clipped to the range)."""
    return _counter_index(np.clip(np.rint(value_ms * 1000.0), 0, HIST_HIGHEST_US).astype(np.int64))


@dataclass
class _Sparse:
    """Samples already quantised to HdrHistogram counters, grouped by interval, so a histogram
    is filled with one ``record_value`` per distinct counter. Ten bytes a pair of a 1 s series
    (its ITL pairs at a million requests: ~15 M): the interval as int32 where it fits, the
    counter as int16 (``_BINS`` of them; its lowest equivalent value is ``_LOWEST[counter]``)."""

    bucket: NDArray[np.signedinteger[Any]]  # sorted
    counter: NDArray[np.int16]
    count: Ints

    @classmethod
    def of(cls, bucket: Ints, ms: Floats, counts: Tokens | None = None) -> _Sparse:
        acc = _SparseCounts()
        acc.add(bucket, _us_index(ms), counts)
        return acc.done()

    def hist(self, i: int) -> HdrHistogram:
        h = HdrHistogram(1, HIST_HIGHEST_US, _HIST_DIGITS)
        lo, hi = np.searchsorted(self.bucket, [i, i + 1])
        _fill(h, _LOWEST[self.counter[lo:hi]], self.count[lo:hi])
        return h


class _SparseCounts:
    """A ``_Sparse`` counted block by block: each block by (interval, counter) pairs, densely
    over the intervals and counters it spans when they are few beside its samples (a block of
    ITL gaps spans a few intervals and a few thousand counters), else by sorting; merged every
    ``_MERGE_PAIRS`` pairs into the sorted, disjoint parts counted so far (``_merge``), and at
    the end (``done``)."""

    def __init__(self) -> None:
        self.keys: list[Ints] = []  # the blocks' pairs not yet merged, each block's sorted
        self.totals: list[Ints] = []
        self.pending = 0
        self.merged: list[tuple[Ints, Ints]] = []  # (keys, totals): ascending, each part's keys below the next's

    def add(self, bucket: Ints, counter: Ints, counts: Tokens | None) -> None:
        """Samples by interval and HdrHistogram counter (``_us_index``), ``counts`` of each (None: one)."""
        if bucket.size == 0:
            return
        w = None if counts is None else counts.astype(np.float64)
        b0, c0 = int(bucket.min()), int(counter.min())
        width = int(counter.max()) - c0 + 1
        size = (int(bucket.max()) - b0 + 1) * width
        if size <= max(_DENSE_PER_SAMPLE * bucket.size, _DENSE_MIN):
            got = np.bincount((bucket - b0) * width + (counter - c0), weights=w, minlength=size)
            (at,) = np.nonzero(got)
            b, c = np.divmod(at, width)
            self.keys.append((b + b0) * _BINS + (c + c0))
            self.totals.append(got[at] if w is None else np.rint(got[at]).astype(np.int64))
        else:
            key = bucket.astype(np.int64) * _BINS + counter
            uniq, inv = np.unique(key, return_inverse=True)
            self.keys.append(uniq)
            self.totals.append(np.rint(np.bincount(inv.ravel(), weights=w, minlength=uniq.size)).astype(np.int64))
        self.pending += self.keys[-1].size
        if self.pending >= _MERGE_PAIRS:
            self._merge()

    def _merge(self) -> None:
        """The pending pairs merged into ``merged``: only its pairs from the least pending key on
        are merged again (blocks come in row order, so those are a few intervals' worth)."""
        if not self.keys:
            return
        keys, totals = np.concatenate(self.keys), np.concatenate(self.totals)
        self.keys, self.totals, self.pending = [], [], 0
        lo = int(keys.min())
        again: list[tuple[Ints, Ints]] = []
        while self.merged and int(self.merged[-1][0][-1]) >= lo:
            k, t = self.merged.pop()
            i = int(np.searchsorted(k, lo))
            again.append((k[i:], t[i:]))
            if i:
                self.merged.append((k[:i], t[:i]))
                break
        uniq, inv = np.unique(np.concatenate([*(k for k, _ in again), keys]), return_inverse=True)
        weights = np.concatenate([*(t for _, t in again), totals])
        self.merged.append(
            (uniq, np.rint(np.bincount(inv.ravel(), weights=weights, minlength=uniq.size)).astype(np.int64))
        )

    def done(self) -> _Sparse:
        self._merge()
        parts, self.merged = self.merged, []
        n = sum(k.size for k, _ in parts)
        wide = bool(parts) and int(parts[-1][0][-1]) // _BINS >= 2**31
        out = _Sparse(
            np.empty(n, dtype=np.int64 if wide else np.int32), np.empty(n, dtype=np.int16), np.empty(n, dtype=np.int64)
        )
        at = 0
        parts.reverse()
        while parts:  # each part let go once copied: the pairs are held once, not twice
            k, t = parts.pop()
            bucket, counter = np.divmod(k, _BINS)
            out.bucket[at : at + k.size] = bucket
            out.counter[at : at + k.size] = counter
            out.count[at : at + k.size] = t
            at += k.size
        return out


def _fill(h: HdrHistogram, values: Ints, counts: Ints) -> None:
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


def _bucket(t_ns: Ints, t0: int, step: int, nb: int) -> Ints:
    return np.asarray(np.clip((t_ns - t0) // step, 0, nb - 1), dtype=np.int64)


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
    ttft: _Sparse
    itl: _Sparse
    e2e: _Sparse

    def histograms(self, i: int) -> IntervalHistograms:
        return IntervalHistograms(self.t0 + i * self.step, self.ttft.hist(i), self.itl.hist(i), self.e2e.hist(i))


def _series(table: pa.Table, interval_s: float, t0_ns: int | None) -> _Series | None:
    got = _all_series(table, (interval_s,), t0_ns)
    return None if got is None else got[0]


def _all_series(table: pa.Table, intervals: tuple[float, ...], t0_ns: int | None) -> list[_Series] | None:
    """The series at each of ``intervals`` (s), in one pass over the chunks: each chunk's gap and
    histogram counter computed once, then bucketed by every interval."""
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
    itl = [_SparseCounts() for _ in steps]
    for blk in chunk_blocks(c, size=_SERIES_BLOCK):
        sel = blk.tok > 0
        ns = blk.ns[sel]
        gap, has_prev = gaps(blk.owner[sel], ns)
        k = blk.tok[sel][has_prev]
        counter = _us_index(gap[has_prev] / 1e6 / k)
        at = ns[has_prev]
        for step, nb, tok, acc in zip(steps, sizes, tokens, itl, strict=True):
            np.add(tok, np.bincount(_bucket(blk.ns, t0, step, nb), weights=blk.tok, minlength=nb), out=tok)
            acc.add(_bucket(at, t0, step, nb), counter, k)
    out = []
    for step, nb, tok, acc in zip(steps, sizes, tokens, itl, strict=True):

        def per(t: Ints, mask: Mask, step: int = step, nb: int = nb) -> NDArray[np.intp]:
            return np.bincount(_bucket(t[mask], t0, step, nb), minlength=nb)

        cols: dict[str, NDArray[np.intp] | Floats] = {
            "sent": per(sent, has_sent),
            "completed": per(done, m),
            "errors": per(np.where(has_done, done, c.t_sched), ~c.ok),
            "in_flight": np.cumsum(per(sent, has_sent)) - np.cumsum(per(done, has_sent & has_done)),
            "output_tokens": tok,
        }
        ttft = _Sparse.of(_bucket(first[has_first], t0, step, nb), ttft_ms)
        e2e = _Sparse.of(_bucket(done[m], t0, step, nb), e2e_ms)
        out.append(_Series(t0, step, cols, ttft, acc.done(), e2e))
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
    wanted = tuple(dict.fromkeys((interval_s, chart_interval(table))))
    missing = tuple(i for i in wanted if ("timeseries", i) not in c.memo)
    if missing:
        for i, series in zip(missing, _all_series(table, missing, None) or [], strict=True):
            c.memo[("timeseries", i)] = _rows(series, i)
    rows: list[dict[str, Any]] = c.memo[("timeseries", interval_s)]
    return rows


def _rows(series: _Series, interval_s: float) -> list[dict[str, Any]]:
    nb = series.cols["sent"].size
    pct = {name: _percentiles(sp, nb, (50, 99)) for name, sp in (("ttft", series.ttft), ("itl", series.itl))}
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


def _percentiles(sp: _Sparse, nb: int, ps: tuple[int, ...]) -> dict[int, Ints]:
    """Per interval, ``hist_percentile(sp.hist(i), p)`` for each p (us; -1 where the interval
    holds no sample), from the sparse counts without building a histogram: the target count
    as the library computes it, then the first bin whose running count reaches it."""
    total = np.bincount(sp.bucket, weights=sp.count, minlength=nb).astype(np.int64)
    before = np.cumsum(total) - total  # samples of the intervals before each
    running = np.cumsum(sp.count)
    out = {}
    for p in ps:
        target = np.maximum(np.floor(min(p, 100.0) * total / 100 + 0.5).astype(np.int64), 1)
        at = np.minimum(np.searchsorted(running, before + target), max(sp.count.size - 1, 0))
        got = _highest()[sp.counter[at]] if sp.count.size else np.zeros(nb, dtype=np.int64)
        out[p] = np.where(total > 0, got, -1)
    return out


@functools.cache
def _highest() -> Ints:
    """The highest value equivalent to each counter's (``get_highest_equivalent_value``)."""
    h = _TEMPLATE
    return np.array([h.get_highest_equivalent_value(int(v)) for v in _LOWEST], dtype=np.int64)
