"""Exact order statistics of a sample too large to hold, fed block by block.

A run of a million requests has a hundred million inter-token gaps; their percentiles (and
the order-statistic intervals of ``stats``) are a few order statistics, found here without
holding, expanding or sorting the sample, in two passes over its blocks: the first counts the
samples per narrow value bucket (``value_buckets.FirstPass``: the top bits of each float's
order-preserving bits) and sums count, mean and squared deviations (Chan's combination); the
second gathers only the few buckets that hold the wanted ranks and selects each rank there
(``np.partition``). A block is (values, weights): weight k stands for k samples of the value
(ITL: a chunk of k tokens is k samples of g/k), None for one each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeAlias

import numpy as np
from numpy.typing import NDArray

from loadgen.analysis.distributions import t_ppf
from loadgen.analysis.stats import PERCENTILES, Dist, Floats, ci_ranks, describe, dist_from_ranks, pct_key
from loadgen.analysis.value_buckets import FINE_SHIFT, KEY_SHIFT, KEYS, FirstPass, clean_weighted, ordered, value_of

__all__ = [
    "Blocks",
    "describe_blocks",
    "describe_many",
    "describe_many_at",
    "first_passes",
    "order_statistics",
    "sample_size",
]

_INF = float("inf")

# a weighted sample fed in blocks: (values, how many samples each value is; None: one)
Blocks: TypeAlias = Callable[[], Iterable[tuple[Floats, NDArray[np.integer[Any]] | None]]]


_STEP = 12  # bits a refining pass adds to a bucket's key (4,096 sub-buckets each)
_REFINE = 1024  # buckets refined in one pass at most (their sub-bucket counts: 4 Mi)


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
    firsts: list[FirstPass] | None = None,
) -> list[Dist]:
    """``describe_blocks`` of ``count`` samples fed together: each block of ``blocks()`` is a
    sequence of ``count`` (values, weights), one per sample (two passes over the blocks in all,
    more only where many samples share a narrow bucket). ``firsts``: ``first_passes`` of these
    very blocks, taken before (a figure that needs the same sample again shares them)."""
    return describe_many_at(blocks, count, [[] for _ in range(count)], confidence, percentiles, firsts)[0]


def describe_many_at(
    blocks: Callable[[], Iterable[Sequence[tuple[Floats, NDArray[np.integer[Any]] | None]]]],
    count: int,
    ranks: Sequence[Sequence[int]],
    confidence: float = 0.95,
    percentiles: tuple[float, ...] = PERCENTILES,
    firsts: list[FirstPass] | None = None,
) -> tuple[list[Dist], list[dict[int, float]]]:
    """``describe_many``, and per sample the values at its 0-based ``ranks`` (as
    ``order_statistics`` gives them), found in the same passes over the blocks."""
    firsts = firsts if firsts is not None else first_passes(blocks, count)
    for a, more in zip(firsts, ranks, strict=True):
        if more and not (0 <= min(more) and max(more) < a.n):
            raise IndexError(f"ranks {min(more)}..{max(more)} outside a sample of {a.n}")
    cis = [{pct_key(p): ci_ranks(a.n, p, confidence) for p in percentiles} if a.n else {} for a in firsts]
    wanted = [
        sorted({r for rs in rk.values() for r in rs if 0 < r < a.n - 1} | {r for r in more if 0 < r < a.n - 1})
        for a, rk, more in zip(firsts, cis, ranks, strict=True)
    ]
    at = _order_statistics(blocks, firsts, wanted)
    out = []
    for a, rk, got in zip(firsts, cis, at, strict=True):
        if a.n == 0:
            out.append(describe([], confidence, percentiles))
            continue
        got |= {0: a.lo, a.n - 1: a.hi}
        out.append(dist_from_ranks(a.n, _mean_ci(a.n, a.mean, a.m2, confidence), rk, got, confidence))
    return out, [{r: got[r] for r in more} for got, more in zip(at, ranks, strict=True)]


def first_passes(
    blocks: Callable[[], Iterable[Sequence[tuple[Floats, NDArray[np.integer[Any]] | None]]]],
    count: int,
    finely: Sequence[bool] | None = None,
) -> list[FirstPass]:
    """The first pass of ``describe_many`` over ``count`` samples fed together (one walk);
    ``finely``: per sample, whether to count its fine buckets too (``FirstPass``: for many ranks)."""
    firsts = [FirstPass(f) for f in (finely if finely is not None else [True] * count)]
    for block in blocks():
        for acc, (v, w) in zip(firsts, block, strict=True):
            acc.add(*clean_weighted(v, w))
    return firsts


def sample_size(blocks: Blocks) -> int:
    """How many samples the weighted sample ``blocks()`` holds (NaNs and weights <= 0 left out)."""
    return sum(_size(*clean_weighted(v, w)[:2]) for v, w in blocks())


def _size(v: Floats, k: NDArray[np.integer[Any]] | None) -> int:
    return v.size if k is None else int(k.sum())


def order_statistics(
    blocks: Blocks, ranks: Sequence[int] | NDArray[np.integer[Any]], first: FirstPass | None = None
) -> Floats:
    """The values at the 0-based ``ranks`` of the weighted sample ``blocks()`` sorted ascending
    (each as ``np.sort`` of the expanded sample would hold it; nothing expanded, nothing sorted
    whole). ``first``: the sample's ``first_passes``, taken before (else one more pass). A rank
    outside the sample is an IndexError."""
    if first is None:
        first = first_passes(lambda: ([b] for b in blocks()), 1)[0]
    want = sorted({int(r) for r in ranks})
    if want and not (0 <= want[0] and want[-1] < first.n):
        raise IndexError(f"ranks {want[0]}..{want[-1]} outside a sample of {first.n}")
    inner = [r for r in want if 0 < r < first.n - 1]
    at = _order_statistics(lambda: ([b] for b in blocks()), [first], [inner])[0]
    at |= {0: first.lo, first.n - 1: first.hi} if first.n else {}
    return np.array([at[int(r)] for r in ranks], dtype=np.float64)


_GATHER = 1 << 20  # samples gathered in one pass at most (beyond: their buckets refined first)


class _Target(NamedTuple):
    """A wanted rank on its way down: the bucket that holds it (its ordered bits >> ``shift``),
    its rank within that bucket, and the bucket's samples."""

    rank: int
    shift: int
    key: int
    within: int
    size: int


def _order_statistics(
    blocks: Callable[[], Iterable[Sequence[tuple[Floats, NDArray[np.integer[Any]] | None]]]],
    firsts: list[FirstPass],
    wanted: list[list[int]],
) -> list[dict[int, float]]:
    """Per sample, the values at its 0-based ranks ``wanted``, from its counts per bucket
    (``FirstPass``: a rank whose bucket was counted finely starts in its fine bucket). Each
    further pass over the blocks either gathers the samples of the buckets that hold the ranks,
    when they are few (``_GATHER`` at most), and selects each rank there (``np.partition``), or
    counts those buckets' samples by 12 more bits (``_STEP``), so the next pass looks into
    narrower buckets; a bucket 0 bits wide is one value. A CDF's 400 ranks of a hundred million
    samples take one pass after the first where their buckets were counted finely, two where
    not, never a gather of the whole sample."""
    out: list[dict[int, float]] = [{} for _ in firsts]
    todo = {i: _first_targets(a, want) for i, (a, want) in enumerate(zip(firsts, wanted, strict=True)) if want}
    while todo:
        jobs: dict[tuple[int, int], _Job] = {}  # by (sample, shift): a sample's targets may lie at several
        for i, targets in list(todo.items()):
            exact = [t for t in targets if t.shift == 0]  # a bucket of one value: no pass needed
            out[i] |= {t.rank: value_of(t.key) for t in exact}
            targets = [t for t in targets if t.shift > 0]
            if not targets:
                del todo[i]
                continue
            todo[i] = targets
            for shift in sorted({t.shift for t in targets}, reverse=True):
                sizes = {t.key: t.size for t in targets if t.shift == shift}
                keys = sorted(sizes)
                gather = sum(sizes.values()) <= _GATHER
                jobs[i, shift] = _Job(shift, np.asarray(keys if gather else keys[:_REFINE], dtype=np.int64), gather)
        if not jobs:
            break
        found = _one_pass(blocks, jobs)
        for (i, shift), job in jobs.items():
            todo[i] = _next_targets(todo[i], job, found[i, shift], out[i])
    return out


class _Job(NamedTuple):
    """One sample's share of a pass: gather (or refine) the buckets ``keys`` at ``shift``."""

    shift: int
    keys: NDArray[np.int64]
    gather: bool


def _first_targets(a: FirstPass, want: list[int]) -> list[_Target]:
    ends = np.cumsum(a.counts)
    where = np.searchsorted(ends, np.asarray(want, dtype=np.int64), side="right").tolist()
    counts = a.counts.tolist()
    out = []
    for r, b in zip(want, where, strict=True):
        key, within = b - KEYS // 2, r - int(ends[b] - counts[b])
        fine = a.fine_counts(key)
        if fine is None:
            out.append(_Target(r, KEY_SHIFT, key, within, counts[b]))
            continue
        cum = np.cumsum(fine)
        c = int(np.searchsorted(cum, within, side="right"))
        bits = KEY_SHIFT - FINE_SHIFT
        out.append(_Target(r, FINE_SHIFT, key << bits | c, within - int(cum[c] - fine[c]), int(fine[c])))
    return out


def _slots(o: NDArray[np.int64], job: _Job, maps: tuple[Any, Any]) -> tuple[NDArray[np.int64], Any]:
    """(each sample's place among the job's buckets, which samples: those in one of them)."""
    local, fine = maps
    at = local[(o >> KEY_SHIFT) + (KEYS // 2)]  # the first-pass bucket's place, -1: none wanted
    if job.shift == KEY_SHIFT:
        sel = at >= 0
        return at[sel].astype(np.int64), sel
    pre = np.flatnonzero(at >= 0)
    if fine is not None:  # at most a step below the first pass: a table per first-pass bucket
        bits = KEY_SHIFT - job.shift
        sub = (o[pre] >> job.shift) & ((1 << bits) - 1)
        place = fine[at[pre].astype(np.int64) << bits | sub]
        hit = place >= 0
        return place[hit].astype(np.int64), pre[hit]
    key = o[pre] >> job.shift
    idx = np.minimum(np.searchsorted(job.keys, key), job.keys.size - 1)
    hit = job.keys[idx] == key
    return idx[hit], pre[hit]


def _maps(job: _Job) -> tuple[Any, Any]:
    """(first-pass bucket -> its place among those holding the job's buckets, -1 elsewhere;
    at most a step below: (that place, sub-bucket) -> the job's bucket's place, else None)."""
    bits = KEY_SHIFT - job.shift
    coarse = job.keys >> bits
    parents = np.unique(coarse)
    local = np.full(KEYS, -1, dtype=np.int32)
    local[parents + KEYS // 2] = np.arange(parents.size, dtype=np.int32)
    if not 0 < bits <= _STEP:
        return local, None
    fine = np.full(parents.size << bits, -1, dtype=np.int32)
    fine[np.searchsorted(parents, coarse) << bits | (job.keys & ((1 << bits) - 1))] = np.arange(
        job.keys.size, dtype=np.int32
    )
    return local, fine


def _one_pass(
    blocks: Callable[[], Iterable[Sequence[tuple[Floats, NDArray[np.integer[Any]] | None]]]],
    jobs: dict[tuple[int, int], _Job],
) -> dict[tuple[int, int], Any]:
    """One walk of the blocks doing every job (by sample and shift): the gathered (values,
    weights, bucket place) pieces, or the refined counts (per bucket place, 2**bits sub-buckets)."""
    maps = {j: _maps(job) for j, job in jobs.items()}
    pieces: dict[tuple[int, int], list[tuple[Floats, NDArray[np.int64], NDArray[np.integer[Any]]]]] = {
        j: [] for j in jobs
    }
    counts = {
        j: np.zeros(job.keys.size << min(_STEP, job.shift), dtype=np.int64) for j, job in jobs.items() if not job.gather
    }
    for block in blocks():
        samples: dict[int, tuple[Floats, NDArray[np.integer[Any]] | None, NDArray[np.int64]]] = {}
        for j, job in jobs.items():
            if j[0] not in samples:
                v, k, least = clean_weighted(*block[j[0]])
                samples[j[0]] = (v, k, ordered(v, least))
            v, k, o = samples[j[0]]
            slot, sel = _slots(o, job, maps[j])
            if job.gather:
                w = k[sel] if k is not None else np.ones(slot.size, dtype=np.int64)
                pieces[j].append((v[sel], w, slot.astype(np.int16) if job.keys.size < 1 << 15 else slot))
                continue
            bits = min(_STEP, job.shift)
            sub = slot << bits | ((o[sel] >> (job.shift - bits)) & ((1 << bits) - 1))
            got = np.bincount(sub, weights=None if k is None else k[sel], minlength=counts[j].size)
            counts[j] += got.astype(np.int64) if k is not None else got
    return {j: (pieces[j] if job.gather else counts[j]) for j, job in jobs.items()}


def _next_targets(targets: list[_Target], job: _Job, found: Any, out: dict[int, float]) -> list[_Target]:
    """The targets after a pass: a gathered one's value put in ``out``; a refined one in its
    sub-bucket; the others as they were."""
    place = {k: j for j, k in enumerate(job.keys.tolist())}
    mine = [t for t in targets if t.shift == job.shift and t.key in place]
    rest = [t for t in targets if not (t.shift == job.shift and t.key in place)]
    if job.gather:
        out |= _select(found, mine, place)
        return rest
    bits = min(_STEP, job.shift)
    for t in mine:
        row = found[place[t.key] << bits : (place[t.key] + 1) << bits]
        cum = np.cumsum(row)
        c = int(np.searchsorted(cum, t.within, side="right"))
        rest.append(_Target(t.rank, t.shift - bits, t.key << bits | c, t.within - int(cum[c] - row[c]), int(row[c])))
    return rest


def _select(
    got: list[tuple[Floats, NDArray[np.int64], NDArray[np.integer[Any]]]], targets: list[_Target], place: dict[int, int]
) -> dict[int, float]:
    """The targets' values from the gathered samples of their buckets."""
    if not got:
        return {}
    v = np.concatenate([g[0] for g in got])
    k = np.concatenate([g[1] for g in got])
    at = np.concatenate([g[2] for g in got])
    order = np.argsort(at, kind="stable")  # the buckets apart (a radix sort of small ints)
    v, k = v[order], k[order]
    edges = np.searchsorted(at[order], np.arange(len(place) + 1))
    by_bucket: dict[int, list[_Target]] = {}
    for t in targets:
        by_bucket.setdefault(place[t.key], []).append(t)
    found: dict[int, float] = {}
    for j, ts in by_bucket.items():
        vb, kb = v[edges[j] : edges[j + 1]], k[edges[j] : edges[j + 1]]
        sample = vb if (kb == 1).all() else np.repeat(vb, kb)  # the bucket's samples, expanded
        inside = [t.within for t in ts]
        found.update(zip([t.rank for t in ts], np.partition(sample, inside)[inside].tolist(), strict=True))
    return found


def _mean_ci(n: int, mean: float, m2: float, confidence: float) -> tuple[float, float, float]:
    """``mean_ci`` from a sample's count, mean and sum of squared deviations."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if n == 1:
        return (mean, -_INF, _INF)
    half = float(t_ppf(0.5 + confidence / 2.0, n - 1)) * math.sqrt(m2 / (n - 1)) / math.sqrt(n)
    return (mean, mean - half, mean + half)
