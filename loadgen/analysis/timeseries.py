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

from loadgen.analysis.columns import Cols, Floats, Ints, Mask, gaps, ms
from loadgen.analysis.window import MetricsError

__all__ = [
    "IntervalHistograms",
    "timeseries",
    "iter_interval_histograms",
    "hist_percentile",
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


@dataclass
class _Sparse:
    """Values already quantised to HdrHistogram bins, grouped by interval, so a
    histogram is filled with one ``record_value`` per distinct bin."""

    bucket: Ints  # sorted
    value: Ints  # lowest equivalent value, us
    count: Ints

    @classmethod
    def of(cls, bucket: Ints, ms: Floats, counts: Ints | None = None) -> _Sparse:
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
    if c.c_ns.size:
        ends.append(int(c.c_ns.max()))
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
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise MetricsError(f"interval must be > 0 s, got {interval_s!r}")
    c = Cols.of(table)
    if c.n == 0:
        return None
    t0 = int(c.t_sched.min()) if t0_ns is None else int(t0_ns)
    step = max(round(interval_s * 1e9), 1)
    nb = _span(c, t0) // step + 1
    (sent, has_sent), (first, has_first), (done, has_done) = c.t["t_sent"], c.t["t_first"], c.t["t_done"]

    def per(t: Ints, mask: Mask) -> NDArray[np.intp]:
        return np.bincount(_bucket(t[mask], t0, step, nb), minlength=nb)

    ttft = _Sparse.of(_bucket(first[has_first], t0, step, nb), ms(first[has_first], c.t_sched[has_first]))
    m = c.ok & has_done
    e2e = _Sparse.of(_bucket(done[m], t0, step, nb), ms(done[m], c.t_sched[m]))
    sel = c.c_tok > 0
    gap, has_prev = gaps(c.c_owner[sel], c.c_ns[sel])
    k = c.c_tok[sel][has_prev]
    itl = _Sparse.of(_bucket(c.c_ns[sel][has_prev], t0, step, nb), gap[has_prev] / 1e6 / k, k)
    cols: dict[str, NDArray[np.intp] | Floats] = {
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
