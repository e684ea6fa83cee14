"""The samples behind a window's latency figures, for CDF charts, and the walk ITL and ICL share.

``latency_samples`` gives the very samples ``metrics.summarize`` folds into its percentiles:
TTFT per request (exact, and censored), and ITL per token, which at a million requests is a
sample per token of the run: its CDF takes its steps as order statistics (``selection``) from
the summary's own first pass over the chunks (``itl_icl_first``), never a sorted array of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loadgen.analysis.chunk_walk import itl_icl, itl_icl_blocks
from loadgen.analysis.columns import Cols, Floats, Mask, Tokens
from loadgen.analysis.latencies import Latencies
from loadgen.analysis.selection import describe_many_at, first_passes, order_statistics
from loadgen.analysis.stats import Dist
from loadgen.analysis.value_buckets import FirstPass
from loadgen.analysis.window import Window

__all__ = [
    "CDF_STEPS",
    "LatencySamples",
    "cdf_ranks",
    "latency_samples",
    "itl_icl_walk",
    "itl_icl_first",
    "itl_icl_dists",
]

CDF_STEPS = 400  # the steps of a drawn CDF at most (``cdf_ranks``)


def cdf_ranks(n: int) -> NDArray[np.int64]:
    """The 0-based ranks of the at most ``CDF_STEPS`` steps drawn of ``n`` sorted values: every one
    up to ``CDF_STEPS``, else quantiles on a fixed grid, the upper tail finer."""
    if n <= CDF_STEPS:
        return np.arange(n, dtype=np.int64)
    q = np.unique(np.concatenate([np.linspace(0, 1, CDF_STEPS - 20), 1 - np.logspace(-4, -1, 20)]))
    ranks: NDArray[np.int64] = np.clip(np.ceil(q * n).astype(np.int64) - 1, 0, n - 1)
    return ranks


class LatencySamples(Mapping[str, Floats]):
    """``latency_samples``: each kind sorted when it is first asked for (a CDF of TTFT needs no
    ITL, which is a sample per token of the run)."""

    KINDS = ("ttft", "ttft_censored", "itl")

    def __init__(self, c: Cols, window: Window) -> None:
        self._c, self._window, self._rows = c, window, window.contains(c.t_sched)
        self._got: dict[str, Floats] = {}

    def __getitem__(self, kind: str) -> Floats:
        if kind not in self._got:
            self._got[kind] = self._sample(kind)
        return self._got[kind]

    def _sample(self, kind: str) -> Floats:
        lat = Latencies.of(self._c)
        if kind == "ttft":
            return _sorted(lat.ttft[self._rows])
        if kind == "ttft_censored":
            return _sorted(lat.ttft_c[self._rows])
        if kind == "itl":
            out: Floats = np.sort(itl_icl(self._c, self._rows)[0])
            return out
        raise KeyError(kind)

    def positive_count(self, kind: str) -> int:
        """How many samples of ``kind`` are finite and > 0 (what a CDF on a log axis draws)."""
        if kind != "itl":
            return int(np.count_nonzero(np.isfinite(self[kind]) & (self[kind] > 0)))
        first = itl_icl_first(self._c, self._window)[0]
        return first.n - first.not_positive

    def positive_at(self, kind: str, ranks: Sequence[int] | NDArray[np.integer[Any]]) -> Floats:
        """The finite, > 0 samples of ``kind`` at the 0-based ``ranks`` of their ascending order:
        a CDF's steps without sorting (nor holding) a sample per token of the run."""
        if kind != "itl":
            x = self[kind]
            return np.asarray(x[np.isfinite(x) & (x > 0)][np.asarray(ranks, dtype=np.int64)], dtype=np.float64)
        first = itl_icl_first(self._c, self._window)[0]  # the summary's first pass: ITL has no NaN nor inf
        at = np.asarray(ranks, dtype=np.int64) + first.not_positive  # the positive samples come last
        found: dict[int, float] = self._c.memo.get(("itl_cdf", self._window), {})  # (``itl_icl_dists``)
        if all(r in found for r in at.tolist()):
            return np.array([found[r] for r in at.tolist()], dtype=np.float64)
        return order_statistics(self._itl, at, first)

    def _itl(self) -> Iterator[tuple[Floats, Tokens]]:
        for itl, _ in itl_icl_blocks(self._c, self._rows):
            yield itl

    def __iter__(self) -> Iterator[str]:
        return iter(self.KINDS)

    def __len__(self) -> int:
        return len(self.KINDS)


def latency_samples(table: pa.Table, window: Window) -> LatencySamples:
    """Sorted samples in ms of the requests scheduled in ``window``, exactly what ``summarize``
    folds into its percentiles (for CDF charts): ``ttft`` (exact, per request), ``ttft_censored``
    (requests without a first token: at least this long) and ``itl`` (per token), each computed
    when first read."""
    return LatencySamples(Cols.of(table), window)


def _sorted(x: Floats) -> Floats:
    return np.sort(x[~np.isnan(x)])


def itl_icl_walk(c: Cols, rows: Mask) -> Callable[[], Iterator[tuple[tuple[Floats, Tokens], tuple[Floats, None]]]]:
    """The blocks of ``selection.describe_many`` for ITL (g/k, k samples each) and ICL of ``rows``."""
    return lambda: (((v, k), (gap, None)) for (v, k), gap in itl_icl_blocks(c, rows))


def itl_icl_first(c: Cols, w: Window) -> list[FirstPass]:
    """ITL's and ICL's first pass over the window's chunks, once per table and window: the
    summary's Dists and a CDF's steps (``LatencySamples``) both start from it."""
    # (ITL's fine buckets counted too: its CDF wants 400 ranks of it, ICL only its percentiles')
    walk = itl_icl_walk(c, w.contains(c.t_sched))
    return c.once(("itl_icl_first", w), lambda: first_passes(walk, 2, finely=(True, False)))


def itl_icl_dists(c: Cols, w: Window) -> tuple[Dist, Dist]:
    """ITL's (g/k, k samples each) and ICL's Dists over the requests scheduled in ``w``, and in the
    same passes over the chunks the steps of ITL's CDF (``cdf_ranks`` of its positive samples,
    which ``LatencySamples.positive_at`` then finds computed), once per table and window."""

    def compute() -> tuple[Dist, Dist]:
        firsts = itl_icl_first(c, w)
        n_pos = firsts[0].n - firsts[0].not_positive
        steps = (cdf_ranks(n_pos) + firsts[0].not_positive).tolist()  # the positive samples come last
        walk = itl_icl_walk(c, w.contains(c.t_sched))
        (itl, icl), (at, _) = describe_many_at(walk, 2, [steps, []], firsts=firsts)
        c.memo[("itl_cdf", w)] = at
        return itl, icl

    return c.once(("itl_icl_dists", w), compute)
