"""Latency samples counted per interval as HdrHistogram counters, and their percentiles.

The time series (``timeseries``) holds one HdrHistogram per interval; at a million requests its
ITL has ~15 M (interval, counter) pairs at 1 s. They are counted block by block, and either
kept (``IntervalCounter``, then ``IntervalCounts``, whose ``hist`` builds an interval's
histogram) or counted only while an interval is open and its percentiles taken as it closes
(``ClosingCounter``, ``IntervalPercentiles``): a series walked in time order then holds a few
intervals' counts, not the run's. A percentile is what ``hist_percentile`` of the interval's
histogram gives.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
from hdrh.histogram import HdrHistogram
from numpy.typing import NDArray

from loadgen.analysis.columns import Floats, Ints, Tokens

__all__ = [
    "HIST_HIGHEST_US",
    "HIST_DIGITS",
    "hist_percentile",
    "us_index",
    "IntervalCounts",
    "IntervalCounter",
    "IntervalPercentiles",
    "ClosingCounter",
    "percentiles",
    "fill_histogram",
]

# HdrHistogram range: 1 us .. 1 hour, 3 significant digits (0.1 % relative error).
HIST_HIGHEST_US = 3_600_000_000
HIST_DIGITS = 3


def hist_percentile(h: HdrHistogram, p: float) -> int:
    """``h.get_value_at_percentile(p)`` computed with numpy (the library walks
    every counter in Python, ~2 ms a call)."""
    counts = np.ctypeslib.as_array(h.counts)
    idx = int(np.searchsorted(np.cumsum(counts), h.get_target_count_at_percentile(p)))
    if idx >= counts.size:
        return 0
    return int(h.get_highest_equivalent_value(h.get_value_from_index(idx)))


_TEMPLATE = HdrHistogram(1, HIST_HIGHEST_US, HIST_DIGITS)
_BINS = int(_TEMPLATE.counts_len)  # counters of one histogram
# a block's (interval, counter) pairs are counted densely when they number at most 4 per sample
# (or 64 Ki), else by sorting the samples' keys
_DENSE_PER_SAMPLE, _DENSE_MIN = 4, 1 << 16
_MERGE_PAIRS = 1 << 20  # pairs counted by blocks before they are merged (``IntervalCounter``): 50 MB to sort
Spans: TypeAlias = tuple[int, int, int, int]  # a block's least interval, greatest, least counter, greatest


def _counter_index(v: Ints) -> Ints:
    """The HdrHistogram counter of each value (us), as the library computes it (``fill_histogram``); a
    value and its bin's lowest equivalent value (``_quantised``) have the same counter."""
    h = _TEMPLATE
    # bit length, as frexp's exponent: that of the value as a float (exact below 2**53)
    bits = ((v | h.sub_bucket_mask).astype(np.float64).view(np.int64) >> 52) - 1022
    bucket = bits - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    sub = v >> (bucket + h.unit_magnitude)
    idx: Ints = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub - h.sub_bucket_half_count
    return idx


_LOWEST = np.array([_TEMPLATE.get_value_from_index(i) for i in range(_BINS)], dtype=np.int64)  # per counter
assert _BINS < 2**15  # (a counter fits an int16: IntervalCounts)


def us_index(value_ms: Floats) -> Ints:
    """The HdrHistogram counter of each value in ms (rounded to us, clipped to the range); looked
    up in a table of the counters of the values below ``_LOOKED_UP`` us when they all are (and
    there are ``_LOOKUP_MIN`` of them at least)."""
    us = value_ms * 1000.0
    np.rint(us, out=us)
    np.clip(us, 0, HIST_HIGHEST_US, out=us)
    v = us.astype(np.int64)
    if v.size >= _LOOKUP_MIN and int(v.max()) < _LOOKED_UP:
        return _small_counters()[v]
    return _counter_index(v)


_LOOKED_UP = 1 << 21  # values (us, ~2.1 s) whose counters ``us_index`` looks up (16 MB)
_LOOKUP_MIN = 1 << 19  # values at least, to take the table (it costs the formula on 2M values, and stays)


@functools.cache
def _small_counters() -> Ints:  # built 256 Ki values at a time: the formula's temporaries stay small
    step = 1 << 18
    return np.concatenate([_counter_index(np.arange(lo, lo + step)) for lo in range(0, _LOOKED_UP, step)])


@dataclass
class IntervalCounts:
    """Samples already quantised to HdrHistogram counters, grouped by interval, so a histogram
    is filled with one ``record_value`` per distinct counter. Ten bytes a pair of a 1 s series
    (its ITL pairs at a million requests: ~15 M): the interval as int32 where it fits, the
    counter as int16 (``_BINS`` of them; its lowest equivalent value is ``_LOWEST[counter]``)."""

    bucket: NDArray[np.signedinteger[Any]]  # sorted
    counter: NDArray[np.int16]
    count: Ints

    @classmethod
    def of(cls, bucket: Ints, ms: Floats, counts: Tokens | None = None) -> IntervalCounts:
        acc = IntervalCounter()
        acc.add(bucket, us_index(ms), counts)
        return acc.done()

    def hist(self, i: int) -> HdrHistogram:
        h = HdrHistogram(1, HIST_HIGHEST_US, HIST_DIGITS)
        lo, hi = np.searchsorted(self.bucket, [i, i + 1])
        fill_histogram(h, _LOWEST[self.counter[lo:hi]], self.count[lo:hi])
        return h


def _block_pairs(bucket: Ints, counter: Ints, counts: Tokens | Floats | None) -> tuple[Ints, Ints]:
    """A block's samples as (interval, counter) pairs: keys ``interval * counters + counter``,
    ascending, and their totals; counted densely over the intervals and counters the block spans
    when they are few beside its samples, else by sorting the samples' keys."""
    w = None if counts is None else counts.astype(np.float64)
    b0, c0 = int(bucket.min()), int(counter.min())
    width = int(counter.max()) - c0 + 1
    size = (int(bucket.max()) - b0 + 1) * width
    if size <= max(_DENSE_PER_SAMPLE * bucket.size, _DENSE_MIN):
        got = np.bincount((bucket - b0) * width + (counter - c0), weights=w, minlength=size)
        (at,) = np.nonzero(got)
        b, c = np.divmod(at, width)
        return (b + b0) * _BINS + (c + c0), (got[at] if w is None else np.rint(got[at]).astype(np.int64))
    key = bucket.astype(np.int64) * _BINS + counter
    uniq, inv = np.unique(key, return_inverse=True)
    return uniq, np.rint(np.bincount(inv.ravel(), weights=w, minlength=uniq.size)).astype(np.int64)


class IntervalCounter:
    """A ``IntervalCounts`` counted block by block: each block by (interval, counter) pairs, densely
    over the intervals and counters it spans when they are few beside its samples (a block of
    ITL gaps spans a few intervals and a few thousand counters), else by sorting; merged every
    ``_MERGE_PAIRS`` pairs into the sorted, disjoint parts counted so far (``_merge``), and at
    the end (``done``): every interval kept whole (``ClosingCounter`` keeps only percentiles)."""

    def __init__(self) -> None:
        self.keys: list[Ints] = []  # the blocks' pairs not yet merged, each block's sorted
        self.totals: list[Ints] = []
        self.pending = 0
        self.merged: list[tuple[Ints, Ints]] = []  # (keys, totals): ascending, each part's keys below the next's

    def add(self, bucket: Ints, counter: Ints, counts: Tokens | None, final: int = 0) -> None:
        """Samples by interval and HdrHistogram counter (``us_index``), ``counts`` of each (None:
        one); ``final`` (where every sample added later falls) is ``ClosingCounter``'s."""
        if bucket.size == 0:
            return
        keys, totals = _block_pairs(bucket, counter, counts)
        self.keys.append(keys)
        self.totals.append(totals)
        self.pending += keys.size
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

    def done(self) -> IntervalCounts:
        self._merge()
        parts, self.merged = self.merged, []
        n = sum(k.size for k, _ in parts)
        wide = bool(parts) and int(parts[-1][0][-1]) // _BINS >= 2**31
        out = IntervalCounts(
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


def fill_histogram(h: HdrHistogram, values: Ints, counts: Ints) -> None:
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


class IntervalPercentiles:
    """Per interval, ``hist_percentile(h, p)`` of its histogram h for each of ``ps`` (us; -1 where
    the interval holds no sample), from its (counter, count) pairs without building a histogram:
    the target count as the library computes it, then the first counter whose running count
    reaches it. Intervals come whole, in any number at a time (``add``, ``feed``)."""

    def __init__(self, nb: int, ps: tuple[int, ...]) -> None:
        self.at = {p: np.full(nb, -1, dtype=np.int64) for p in ps}

    def feed(self, keys: Ints, totals: Ints) -> None:
        """The pairs of ``IntervalCounter``'s sink: keys ``interval * counters + counter``, sorted."""
        bucket, counter = np.divmod(keys, _BINS)
        self.add(bucket, counter, totals)

    def add_pairs(self, keys: Ints, totals: Ints) -> None:
        """Every pair of the intervals it holds, keys ``interval * counters + counter`` in any
        order (a key may come more than once: its totals add up)."""
        bucket, counter = np.divmod(keys, _BINS)
        cells = (int(bucket.max()) - int(bucket.min()) + 1) * (int(counter.max()) - int(counter.min()) + 1)
        if cells <= _DENSE_CELLS:
            _pair_percentiles(self.at, keys, totals)
            return
        uniq, inv = np.unique(keys, return_inverse=True)
        self.feed(uniq, np.bincount(inv.ravel(), weights=totals, minlength=uniq.size).astype(np.int64))

    def add(self, bucket: NDArray[np.signedinteger[Any]], counter: NDArray[np.signedinteger[Any]], count: Ints) -> None:
        """Every pair of the intervals it holds, sorted by interval."""
        if count.size == 0:
            return
        start = np.flatnonzero(np.concatenate([[True], bucket[1:] != bucket[:-1]]))  # each interval's first
        running = np.cumsum(count)
        total = np.add.reduceat(count, start)
        before = running[start] - count[start]  # samples of the earlier intervals fed with it
        for p, out in self.at.items():
            target = np.maximum(np.floor(min(p, 100.0) * total / 100 + 0.5).astype(np.int64), 1)
            out[bucket[start]] = _highest()[counter[np.searchsorted(running, before + target)]]


class ClosingCounter:
    """Samples by interval and HdrHistogram counter fed block by block in about time order, each
    interval's percentiles (``IntervalPercentiles``) taken as soon as no sample to come can fall in
    it (``add``'s ``final``). The intervals still open are counted in a dense table (interval by
    counter), each block added to its own corner of it, and a closing interval's percentiles read
    from its row's running sums: nothing sorted, nothing merged. Where the table would pass
    ``_DENSE_CELLS`` (intervals held open long, counters far apart) the open intervals go over to
    (interval, counter) pairs (``_block_pairs``), kept per block until their intervals close."""

    def __init__(self, at: IntervalPercentiles) -> None:
        self.at = at
        self.closed = 0  # the intervals below it are closed
        self.table: Floats | None = np.zeros((0, 0))  # from interval ``closed``, counters from ``c_lo``; None: pairs
        self.c_lo = 0
        self.open: list[tuple[Ints, Ints]] = []  # (once the table is let go) the blocks' pairs of open intervals
        self.sums = np.zeros(next(iter(at.at.values())).size)  # per interval: its samples (their counts)

    def add(
        self, bucket: Ints, counter: Ints, counts: Tokens | Floats | None, final: int = 0, spans: Spans | None = None
    ) -> None:
        """As ``IntervalCounter.add``; the intervals below ``final`` are closed. ``spans``: the block's
        (least interval, greatest, least counter, greatest) where known (the time series' are)."""
        if bucket.size and not self._counted(bucket, counter, counts, spans):
            self.open.append(_block_pairs(bucket, counter, counts))
            np.add.at(self.sums, self.open[-1][0] // _BINS, self.open[-1][1])
        if final > self.closed:
            self._close(final)

    def flush(self) -> None:
        """Every interval closed (the walk is over)."""
        self._close(None)

    def _counted(self, bucket: Ints, counter: Ints, counts: Tokens | Floats | None, spans: Spans | None) -> bool:
        """The block counted into the table (False: no table, or it would grow too large)."""
        t = self.table
        if t is None:
            return False
        if spans is None:
            spans = (int(bucket.min()), int(bucket.max()), int(counter.min()), int(counter.max()))
        b_lo, b_hi, c_min, c_max = spans[0] - self.closed, spans[1] - self.closed, spans[2], spans[3]
        if b_lo < 0:
            raise ValueError(f"a sample in interval {b_lo + self.closed}, closed already")
        c_lo = c_min if t.size == 0 else min(self.c_lo, c_min)
        width = max(c_max + 1, self.c_lo + t.shape[1] if t.size else 0) - c_lo
        if b_hi >= t.shape[0] or width != t.shape[1]:
            rows = max(b_hi + 1, t.shape[0])
            rows = 2 * rows if 2 * rows * width <= _DENSE_CELLS else rows  # (room to grow into)
            if rows * width > _DENSE_CELLS:
                self._to_pairs()
                return False
            grown = np.zeros((rows, width))
            grown[: t.shape[0], self.c_lo - c_lo : self.c_lo - c_lo + t.shape[1]] = t
            self.table, self.c_lo, t = grown, c_lo, grown
        w = c_max - c_min + 1
        cell = bucket - (b_lo + self.closed)
        cell *= w
        cell += counter
        cell -= c_min
        weights = None if counts is None else np.asarray(counts, dtype=np.float64)
        got = np.bincount(cell, weights=weights, minlength=(b_hi - b_lo + 1) * w)
        cells = got.reshape(b_hi - b_lo + 1, w)
        t[b_lo : b_hi + 1, c_min - c_lo : c_max - c_lo + 1] += cells
        self.sums[self.closed + b_lo : self.closed + b_hi + 1] += cells.sum(axis=1)
        return True

    def _to_pairs(self) -> None:
        """The table's counts as pairs of the open intervals, the table let go."""
        assert self.table is not None
        r, col = np.nonzero(self.table)  # (row-major: the keys ascending)
        if r.size:
            keys = (r + self.closed) * _BINS + (col + self.c_lo)
            self.open.append((keys, np.rint(self.table[r, col]).astype(np.int64)))
        self.table = None

    def _close(self, upto: int | None) -> None:
        if self.table is not None:
            k = self.table.shape[0] if upto is None else min(upto - self.closed, self.table.shape[0])
            if k > 0 and self.table.size:
                _table_percentiles(self.at.at, self.closed, self.c_lo, self.table[:k])
            self.table = self.table[k:]
            self.closed = self.closed + k if upto is None else upto
            return
        below = None if upto is None else upto * _BINS
        keys: list[Ints] = []
        totals: list[Ints] = []
        still = []
        for key, tot in self.open:
            i = key.size if below is None else int(np.searchsorted(key, below))
            if i:
                keys.append(key[:i])
                totals.append(tot[:i])
            if i < key.size:
                still.append((key[i:], tot[i:]))
        self.open = still
        self.closed = self.closed if upto is None else upto
        if keys:
            self.at.add_pairs(np.concatenate(keys), np.concatenate(totals))


_DENSE_CELLS = 1 << 21  # (interval, counter) cells of a dense table at most (16 MB; beyond: pairs, by sorting)


def _pair_percentiles(at: dict[int, Ints], keys: Ints, totals: Ints) -> None:
    """``IntervalPercentiles.add_pairs``: a dense table of the pairs' intervals by counters."""
    bucket, counter = np.divmod(keys, _BINS)
    b0, c0 = int(bucket.min()), int(counter.min())
    rows, width = int(bucket.max()) - b0 + 1, int(counter.max()) - c0 + 1
    table = np.bincount((bucket - b0) * width + (counter - c0), weights=totals, minlength=rows * width)
    _table_percentiles(at, b0, c0, table.reshape(rows, width))


def _table_percentiles(at: dict[int, Ints], b0: int, c0: int, table: NDArray[Any]) -> None:
    """The percentiles of each interval from ``b0`` on whose counts (by counter from ``c0``) are
    a row of ``table`` (an interval without samples is left as it was)."""
    running = np.cumsum(table, axis=1)  # (float sums of counts: exact below 2**53)
    total = running[:, -1].astype(np.int64)
    has = np.flatnonzero(total)
    running = running[has]
    for p, out in at.items():
        target = np.maximum(np.floor(min(p, 100.0) * total[has] / 100 + 0.5).astype(np.int64), 1)
        first = (running < target[:, None]).sum(axis=1)  # the first counter whose running count reaches it
        out[b0 + has] = _highest()[c0 + first]


def percentiles(sp: IntervalCounts, nb: int, ps: tuple[int, ...]) -> dict[int, Ints]:
    """``IntervalPercentiles`` of the ``nb`` intervals of ``sp``."""
    acc = IntervalPercentiles(nb, ps)
    acc.add(sp.bucket, sp.counter, sp.count)
    return acc.at


@functools.cache
def _highest() -> Ints:
    """The highest value equivalent to each counter's (``get_highest_equivalent_value``)."""
    last = _TEMPLATE.get_highest_equivalent_value(int(_LOWEST[-1]))  # (each counter's range ends below the next's)
    return np.concatenate([_LOWEST[1:] - 1, [last]]).astype(np.int64)
