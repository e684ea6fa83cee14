"""Exact order statistics of a sample too large to hold, fed block by block.

A run of a million requests has a hundred million inter-token gaps; their percentiles (and
the order-statistic intervals of ``stats``) are a few order statistics, found here without
holding, expanding or sorting the sample, in two passes over its blocks: the first counts the
samples per narrow value bucket (the top 20 bits of each float's order-preserving bits, 2**-8
of a value wide) and sums count, mean and squared deviations (Chan's combination); the second
gathers only the few buckets that hold the wanted ranks and selects each rank there
(``np.partition``). A block is (values, weights): weight k stands for k samples of the value
(ITL: a chunk of k tokens is k samples of g/k), None for one each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray
from scipy import stats as _sps

from loadgen.analysis.stats import PERCENTILES, Dist, Floats, ci_ranks, describe, dist_from_ranks, pct_key

__all__ = ["Blocks", "describe_blocks", "describe_many", "order_statistics", "sample_size"]

_INF = float("inf")

# a weighted sample fed in blocks: (values, how many samples each value is; None: one)
Blocks: TypeAlias = Callable[[], Iterable[tuple[Floats, NDArray[np.integer[Any]] | None]]]


_KEY_SHIFT = 44  # value buckets of describe_blocks: the top 20 bits of a float's ordered bits
_KEYS = 1 << (64 - _KEY_SHIFT)


def _bucket_keys(v: Floats) -> NDArray[np.int64]:
    """Per value, its bucket: the float's bits made order-preserving as an int64, top bits
    kept (2**-8 of a value wide), shifted to 0.."""
    i = v.view(np.int64)
    if i.size and i.min() < 0:  # a negative value (a chunk out of order): its bits count down
        i = np.where(i < 0, i ^ np.int64(0x7FFFFFFFFFFFFFFF), i)
    out: NDArray[np.int64] = (i >> _KEY_SHIFT) + (_KEYS // 2)
    return out


def _weights(v: Floats, w: NDArray[np.integer[Any]] | None) -> NDArray[np.int64]:
    return np.ones(v.size, dtype=np.int64) if w is None else np.asarray(w, dtype=np.int64)


def describe_blocks(blocks: Blocks, confidence: float = 0.95, percentiles: tuple[float, ...] = PERCENTILES) -> Dist:
    """``describe`` of the weighted sample ``blocks()`` yields (value v with weight k: k samples
    of v; NaNs dropped), without holding it: ``blocks`` is called twice. The percentiles,
    their intervals and the extremes are the very order statistics ``describe`` of the
    expanded sample gives; the mean and its interval are summed block by block (Chan's
    combination), so they agree with it to rounding (~1e-15 relative)."""
    return describe_many(lambda: ([b] for b in blocks()), 1, confidence, percentiles)[0]


def describe_many(
    blocks: Callable[[], Iterable[Sequence[tuple[Floats, NDArray[np.integer[Any]] | None]]]],
    count: int,
    confidence: float = 0.95,
    percentiles: tuple[float, ...] = PERCENTILES,
) -> list[Dist]:
    """``describe_blocks`` of ``count`` samples fed together: each block of ``blocks()`` is a
    sequence of ``count`` (values, weights), one per sample (two passes over the blocks in all)."""
    firsts = [_FirstPass() for _ in range(count)]
    for block in blocks():
        for acc, (v, w) in zip(firsts, block, strict=True):
            acc.add(*_clean_weighted(v, w))
    ranks = [{pct_key(p): ci_ranks(a.n, p, confidence) for p in percentiles} if a.n else {} for a in firsts]
    wanted = [
        sorted({r for rs in rk.values() for r in rs if 0 < r < a.n - 1}) for a, rk in zip(firsts, ranks, strict=True)
    ]
    at = _order_statistics(blocks, firsts, wanted)
    out = []
    for a, rk, got in zip(firsts, ranks, at, strict=True):
        if a.n == 0:
            out.append(describe([], confidence, percentiles))
            continue
        got |= {0: a.lo, a.n - 1: a.hi}
        out.append(dist_from_ranks(a.n, _mean_ci(a.n, a.mean, a.m2, confidence), rk, got, confidence))
    return out


def sample_size(blocks: Blocks) -> int:
    """How many samples the weighted sample ``blocks()`` holds (NaNs and weights <= 0 left out)."""
    return sum(_size(*_clean_weighted(v, w)) for v, w in blocks())


def _size(v: Floats, k: NDArray[np.int64] | None) -> int:
    return v.size if k is None else int(k.sum())


def order_statistics(blocks: Blocks, ranks: Sequence[int] | NDArray[np.integer[Any]]) -> Floats:
    """The values at the 0-based ``ranks`` of the weighted sample ``blocks()`` sorted ascending
    (each as ``np.sort`` of the expanded sample would hold it; two passes, nothing expanded).
    A rank outside the sample is an IndexError."""
    first = _FirstPass()
    for v, w in blocks():
        first.add(*_clean_weighted(v, w))
    want = sorted({int(r) for r in ranks})
    if want and not (0 <= want[0] and want[-1] < first.n):
        raise IndexError(f"ranks {want[0]}..{want[-1]} outside a sample of {first.n}")
    inner = [r for r in want if 0 < r < first.n - 1]
    at = _order_statistics(lambda: ([b] for b in blocks()), [first], [inner])[0]
    at |= {0: first.lo, first.n - 1: first.hi} if first.n else {}
    return np.array([at[int(r)] for r in ranks], dtype=np.float64)


def _clean_weighted(v: Floats, w: NDArray[np.integer[Any]] | None) -> tuple[Floats, NDArray[np.int64] | None]:
    """The (value, weight) pairs that are samples: no NaN, weight > 0 (None: each weighs 1)."""
    if w is None:
        nan = np.isnan(v)
        return (v[~nan], None) if nan.any() else (v, None)
    k = np.asarray(w, dtype=np.int64)
    keep = ~np.isnan(v) & (k > 0)
    return (v, k) if keep.all() else (v[keep], k[keep])


class _FirstPass:
    """Counts per value bucket, and the count, mean, squared deviations and extremes, of a
    weighted sample fed block by block."""

    def __init__(self) -> None:
        self.counts = np.zeros(_KEYS, dtype=np.int64)
        self.n, self.mean, self.m2, self.lo, self.hi = 0, 0.0, 0.0, _INF, -_INF

    def add(self, v: Floats, k: NDArray[np.int64] | None) -> None:
        if v.size == 0:
            return
        if k is None:
            self.counts += np.bincount(_bucket_keys(v), minlength=_KEYS)
            bn = v.size
            bmean = float(v.sum() / bn)
            bm2 = float(np.square(v - bmean).sum())
        else:
            self.counts += np.bincount(_bucket_keys(v), weights=k, minlength=_KEYS).astype(np.int64)
            bn = int(k.sum())
            bmean = float(np.dot(v, k) / bn)
            bm2 = float(np.dot(k, (v - bmean) ** 2))
        total = self.n + bn
        delta = bmean - self.mean
        self.mean += delta * bn / total
        self.m2 += bm2 + delta * delta * self.n * bn / total
        self.n = total
        self.lo, self.hi = min(self.lo, float(v.min())), max(self.hi, float(v.max()))


_GATHER = 1 << 23  # samples gathered in one pass at most (beyond: the buckets in several passes)


def _order_statistics(
    blocks: Callable[[], Iterable[Sequence[tuple[Floats, NDArray[np.integer[Any]] | None]]]],
    firsts: list[_FirstPass],
    wanted: list[list[int]],
) -> list[dict[int, float]]:
    """Per sample, the values at its 0-based ranks ``wanted``, from its counts per bucket
    (``_bucket_keys``): another pass gathers the few buckets that hold them (a pass per
    ``_GATHER`` samples of them, so many ranks, a CDF's, never gather the whole sample), and
    each rank is selected (``np.partition``) within its bucket's samples."""
    plans = [_plan(a, want) for a, want in zip(firsts, wanted, strict=True)]
    out: list[dict[int, float]] = [{} for _ in firsts]
    for step in range(max((len(p[2]) for p in plans), default=0)):
        todo = [(i, p[2][step]) for i, p in enumerate(plans) if step < len(p[2])]
        got: dict[int, list[tuple[Floats, NDArray[np.int64], NDArray[np.int16]]]] = {i: [] for i, _ in todo}
        for block in blocks():
            for i, (_, local) in todo:
                v, k = _clean_weighted(*block[i])
                at = local[_bucket_keys(v)]
                hit = at >= 0
                got[i].append((v[hit], k[hit] if k is not None else np.ones(int(hit.sum()), np.int64), at[hit]))
        for i, (need, _) in todo:
            out[i] |= _select(got[i], need, firsts[i].counts, plans[i][0], plans[i][1])
    return out


def _plan(
    a: _FirstPass, want: list[int]
) -> tuple[NDArray[np.int64], dict[int, list[int]], list[tuple[NDArray[np.int64], NDArray[np.int16]]]]:
    """(each bucket's cumulative count, the wanted ranks by bucket, the passes: per pass its
    buckets and the map bucket -> place among them, -1 elsewhere)."""
    ends = np.cumsum(a.counts)
    where = np.searchsorted(ends, np.asarray(want, dtype=np.int64), side="right")  # the bucket of each rank
    by_bucket: dict[int, list[int]] = {}
    for r, b in zip(want, where.tolist(), strict=True):
        by_bucket.setdefault(b, []).append(r)
    need = np.unique(where).astype(np.int64)
    passes, start, held = [], 0, 0
    for j, size in enumerate(a.counts[need].tolist() + [0]):
        if j == need.size or (held + size > _GATHER and j > start) or j - start >= 30000:
            if j > start:
                part = need[start:j]
                local = np.full(_KEYS, -1, dtype=np.int16)  # bucket -> its place among this pass's
                local[part] = np.arange(part.size, dtype=np.int16)
                passes.append((part, local))
            start, held = j, 0
        held += size
    return ends, by_bucket, passes


def _select(
    got: list[tuple[Floats, NDArray[np.int64], NDArray[np.int16]]],
    need: NDArray[np.int64],
    counts: NDArray[np.int64],
    ends: NDArray[np.int64],
    by_bucket: dict[int, list[int]],
) -> dict[int, float]:
    """The wanted ranks' values from the gathered samples of the buckets ``need``."""
    v = np.concatenate([g[0] for g in got])
    k = np.concatenate([g[1] for g in got])
    at = np.concatenate([g[2] for g in got])
    order = np.argsort(at, kind="stable")  # a radix sort of small ints: the buckets apart
    v, k = v[order], k[order]
    edges = np.searchsorted(at[order], np.arange(need.size + 1))
    found: dict[int, float] = {}
    for j, b in enumerate(need.tolist()):
        rs = by_bucket[b]
        vb, kb = v[edges[j] : edges[j + 1]], k[edges[j] : edges[j + 1]]
        sample = vb if (kb == 1).all() else np.repeat(vb, kb)  # the bucket's samples, expanded
        inside = [r - int(ends[b] - counts[b]) for r in rs]  # ranks within the bucket
        found.update(zip(rs, np.partition(sample, inside)[inside].tolist(), strict=True))
    return found


def _mean_ci(n: int, mean: float, m2: float, confidence: float) -> tuple[float, float, float]:
    """``mean_ci`` from a sample's count, mean and sum of squared deviations."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if n == 1:
        return (mean, -_INF, _INF)
    half = float(_sps.t.ppf(0.5 + confidence / 2.0, n - 1)) * math.sqrt(m2 / (n - 1)) / math.sqrt(n)
    return (mean, mean - half, mean + half)
