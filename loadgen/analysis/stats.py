"""Distribution-free summary statistics with honest confidence intervals.

Latency distributions are skewed and heavy-tailed, so percentile intervals come
from order statistics and the binomial distribution, which hold for any
continuous distribution (and are conservative for discrete ones). A p99 from 50
samples has no upper bound at 95 %: we say so (``inf``) rather than print a
number that looks precise.

Right-censored samples (``describe(..., censored=...)``): a request that never got
its first token (or never finished) is known only to take *at least* its elapsed
time. It joins the sample at that value, ranked after an exact sample of the same
value. Each true order statistic is then >= the observed one, and <= the same
rank among the exact samples alone (every censored sample taken as infinitely
late), so: an estimate whose rank reaches a censored sample is a lower bound
(``PctFlags.value``); the interval's lower end stays a valid confidence bound (a
censored sample can only push it up); its upper end is taken over the exact
samples at the same rank, and is unbounded when they run out.

Selection, not sorting: a percentile and its interval are three order statistics, so
``describe`` finds them with ``np.partition`` (the same values a full sort gives);
``selection`` finds them in a sample too large to hold at once (a hundred million
inter-token gaps) fed block by block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias, TypedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray

from loadgen.analysis.distributions import binom_cdf, binom_ppf, chi2_ppf, t_ppf

__all__ = [
    "PERCENTILES",
    "nearest_rank",
    "Dist",
    "PctFlags",
    "ci_ranks",
    "DistJson",
    "PercentileJson",
    "IntervalJson",
    "describe",
    "dist_from_ranks",
    "percentile_ci",
    "mean_ci",
    "binomial_min_samples",
    "min_samples_bounded",
    "rate_ci",
    "pct_key",
    "json_number",
    "JsonNumber",
]

PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)

JsonNumber: TypeAlias = float | int | str | None  # what ``json_number`` writes

Floats: TypeAlias = NDArray[np.float64]

_NAN = float("nan")
_INF = float("inf")


def pct_key(p: float) -> str:
    """The dict key for percentile ``p``: 50 -> "p50", 99.9 -> "p99.9"."""
    return f"p{p:g}"


def _check_prob(name: str, value: float) -> None:
    if not 0 < value < 1:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")


def _nearest_rank(n: int, q: float) -> int:
    """0-based index of the nearest-rank q-quantile: rank ceil(q*n), at least 1.

    Rounding before ceil stops 99.9/100*1000 = 999.0000000000001 from skipping a rank.
    """
    return max(math.ceil(round(q * n, 9)), 1) - 1


def nearest_rank(sorted_values: ArrayLike, p: float) -> float:
    """The nearest-rank p-th percentile of non-empty sorted data (``percentile_ci``'s estimate,
    without its interval)."""
    x = np.asarray(sorted_values, dtype=np.float64)
    return float(x[_nearest_rank(x.size, p / 100)])


def ci_ranks(n: int, p: float, confidence: float = 0.95) -> tuple[int, int, int]:
    """0-based ranks (estimate, lower, upper) of ``percentile_ci`` for n samples.

    The estimate is the nearest-rank order statistic. With K ~ Binomial(n, p/100)
    the number of samples below the true quantile, the lower rank l is the largest
    with P(K < l) <= alpha/2 and the upper u the smallest with P(K < u) >= 1 - alpha/2,
    so coverage is >= confidence. A lower index of -1, or an upper one of n, is
    unbounded on that side.
    """
    if not 0 < p < 100:
        raise ValueError(f"percentile must be strictly between 0 and 100, got {p!r}")
    _check_prob("confidence", confidence)
    q = p / 100.0
    tail = (1.0 - confidence) / 2.0
    # Lower: largest k (= l - 1) with cdf(k) <= tail; ppf gives the smallest with cdf >= tail.
    k = int(binom_ppf(tail, n, q))
    if binom_cdf(k, n, q) > tail:
        k -= 1
    # Upper: smallest k (= u - 1) with cdf(k) >= 1 - tail; rank u = k + 1 -> index k.
    ku = int(binom_ppf(1.0 - tail, n, q))
    return _nearest_rank(n, q), max(k, -1), min(ku, n)


def percentile_ci(sorted_values: ArrayLike, p: float, confidence: float = 0.95) -> tuple[float, float, float]:
    """(estimate, lower, upper) of the p-th percentile of sorted data.

    The estimate is the nearest-rank order statistic (numpy's "inverted_cdf"):
    always an observed value. The interval [X_(l), X_(u)] is equal-tailed
    (``ci_ranks``); a side whose rank falls outside 1..n is unbounded
    (-inf / +inf); n = 0 gives all NaN.
    """
    x = np.asarray(sorted_values, dtype=np.float64)
    n = x.size
    if n == 0:
        ci_ranks(1, p, confidence)  # the same checks of p and confidence
        return (_NAN, _NAN, _NAN)
    k, lo, hi = ci_ranks(n, p, confidence)
    return (float(x[k]), float(x[lo]) if lo >= 0 else -_INF, float(x[hi]) if hi < n else _INF)


def mean_ci(values: ArrayLike, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, lower, upper) by Student's t interval.

    Fine for means of many samples (CLT); for a single sample the interval is
    unbounded, for none all NaN.
    """
    _check_prob("confidence", confidence)
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0:
        return (_NAN, _NAN, _NAN)
    m = float(np.mean(x))
    if n == 1:
        return (m, -_INF, _INF)
    half = float(t_ppf(0.5 + confidence / 2.0, n - 1)) * float(np.std(x, ddof=1)) / math.sqrt(n)
    return (m, m - half, m + half)


def binomial_min_samples(p: float, failures: int, confidence: float) -> int:
    """Samples needed to claim the p-quantile is under a bound, with ``failures`` over it.

    MLPerf's early-stopping rule: h is the smallest with
    P[Binomial(h + t, p) >= h] <= 1 - confidence, t = failures; returns h + t.
    P[Binomial(h + t, p) >= h] = P[at most t of h + t samples exceed the bound],
    which falls as h grows, so a doubling then bisection search finds h.
    Reproduces p=0.99, c=0.99 -> 459 / 662 / 838 for t = 0 / 1 / 2.
    """
    _check_prob("p", p)
    _check_prob("confidence", confidence)
    if isinstance(failures, bool) or not isinstance(failures, (int, np.integer)) or failures < 0:
        raise ValueError(f"failures must be an integer >= 0, got {failures!r}")
    t = int(failures)
    alpha = 1.0 - confidence

    def ok(h: int) -> bool:
        return float(binom_cdf(t, h + t, 1.0 - p)) <= alpha

    lo, hi = 0, 1  # h = 0 never qualifies (the probability is 1)
    while not ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # invariant: not ok(lo), ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi + t


def min_samples_bounded(p: float, confidence: float = 0.95) -> int:
    """Smallest n for which ``percentile_ci`` gives both bounds finite."""
    q, tail = p / 100.0, (1.0 - confidence) / 2.0
    # Upper exists when P(K = n) = q**n <= tail; lower when P(K = 0) = (1-q)**n <= tail.
    n_hi = math.ceil(math.log(tail) / math.log(q))
    n_lo = math.ceil(math.log(tail) / math.log(1.0 - q))
    return max(n_hi, n_lo, 1)


def rate_ci(count: int, seconds: float, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) Poisson interval of a rate from a count in a window."""
    if not seconds > 0:
        return (math.nan, math.nan)
    a = 1 - confidence
    lo = float(chi2_ppf(a / 2, 2 * count)) / 2 if count > 0 else 0.0
    hi = float(chi2_ppf(1 - a / 2, 2 * count + 2)) / 2
    return (lo / seconds, hi / seconds)


def json_number(x: float | np.integer[Any] | np.floating[Any] | None) -> JsonNumber:
    """A JSON-safe number: NaN -> None, +-inf -> "inf"/"-inf" (strict JSON has neither)."""
    if x is None:
        return None
    if isinstance(x, bool):  # an int to Python, but a flag: written as 1.0 / 0.0
        return float(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    f = float(x)
    if math.isnan(f):
        return None
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f


def _finite(x: float) -> float | None:
    """A number for JSON, None where NaN or infinite (an infinite bound says so in a flag)."""
    return float(x) if math.isfinite(x) else None


class PctFlags(NamedTuple):
    """Which figures of a percentile are only lower bounds, because of censored samples.

    ``value``: a censored sample ranks at or below the estimate, so the true
    percentile may be higher (shown ``>= x``). ``lo``: the same for the interval's
    lower end, which stays a valid lower confidence bound. The upper end needs no
    flag: it is over exact samples only, or unbounded.
    """

    value: bool = False
    lo: bool = False


_EXACT = PctFlags()


class IntervalJson(TypedDict):
    lo: float | None  # null where unbounded (see the flag) or undefined (n = 0)
    hi: float | None
    lo_unbounded: bool
    hi_unbounded: bool


class PercentileJson(TypedDict):
    value: float | None
    lower_bound: bool  # the true percentile may be higher (censored samples): ">= value"
    lo: float | None
    lo_lower_bound: bool
    hi: float | None
    lo_unbounded: bool
    hi_unbounded: bool


class DistJson(TypedDict):
    """``Dist.to_json``: strict JSON (no NaN, no "inf"): null plus an explicit flag."""

    n: int
    censored: int
    mean: float | None
    mean_lower_bound: bool
    mean_ci: IntervalJson
    min: float | None
    min_lower_bound: bool
    max: float | None
    max_lower_bound: bool
    confidence: float
    percentiles: dict[str, PercentileJson]


def _interval_json(lo: float, hi: float) -> IntervalJson:
    return IntervalJson(lo=_finite(lo), hi=_finite(hi), lo_unbounded=lo == -_INF, hi_unbounded=hi == _INF)


@dataclass(frozen=True)
class Dist:
    """One metric's distribution: count, mean with CI, percentiles with CI, extremes.

    ``pcts`` maps "p50" .. "p99.9" to (estimate, lower, upper); an infinite bound
    means "unbounded at this sample size". ``n`` counts every sample, the
    ``censored`` ones (known only to be at least their value) included; ``flags``
    says which percentile figures are lower bounds (none when nothing is censored).
    With censored samples the mean is a lower bound and its upper end unbounded.
    """

    n: int
    mean: float
    mean_lo: float
    mean_hi: float
    pcts: dict[str, tuple[float, float, float]]
    min: float
    max: float
    confidence: float = 0.95
    censored: int = 0
    flags: dict[str, PctFlags] = field(default_factory=dict)
    min_lower_bound: bool = False

    def pct(self, p: float) -> tuple[float, float, float]:
        """(estimate, lower, upper) for percentile p, e.g. ``d.pct(99)``."""
        return self.pcts[pct_key(p)]

    def pct_flags(self, p: float) -> PctFlags:
        """Which of percentile p's figures are lower bounds (``flags``)."""
        return self.flags.get(pct_key(p), _EXACT)

    def lower_bound(self, p: float) -> bool:
        """True when percentile p's estimate is only a lower bound (render it ``>= x``)."""
        return self.pct_flags(p).value

    @property
    def mean_lower_bound(self) -> bool:
        return self.censored > 0

    @property
    def max_lower_bound(self) -> bool:
        return self.censored > 0

    def to_json(self) -> DistJson:
        pcts: dict[str, PercentileJson] = {}
        for k, (v, lo, hi) in self.pcts.items():
            f = self.flags.get(k, _EXACT)
            pcts[k] = PercentileJson(
                value=_finite(v),
                lower_bound=f.value,
                lo=_finite(lo),
                lo_lower_bound=f.lo,
                hi=_finite(hi),
                lo_unbounded=lo == -_INF,
                hi_unbounded=hi == _INF,
            )
        return {
            "n": int(self.n),
            "censored": int(self.censored),
            "mean": _finite(self.mean),
            "mean_lower_bound": self.mean_lower_bound,
            "mean_ci": _interval_json(self.mean_lo, self.mean_hi),
            "min": _finite(self.min),
            "min_lower_bound": self.min_lower_bound,
            "max": _finite(self.max),
            "max_lower_bound": self.max_lower_bound,
            "confidence": self.confidence,
            "percentiles": pcts,
        }


def _clean(values: ArrayLike | None) -> Floats:
    if values is None:
        return np.empty(0)
    x = np.asarray(values, dtype=np.float64).ravel()
    return x[~np.isnan(x)]


def describe(
    values: ArrayLike,
    confidence: float = 0.95,
    percentiles: tuple[float, ...] = PERCENTILES,
    censored: ArrayLike | None = None,
) -> Dist:
    """Summarise a sample (NaNs dropped) into a Dist; ``censored`` are right-censored
    samples: each true value is at least the one given (see the module's docstring)."""
    c = _clean(censored)
    if c.size:
        return _describe_censored(np.sort(_clean(values)), c, confidence, percentiles)
    x = _clean(values)
    n = x.size
    m, lo, hi = mean_ci(x, confidence)
    if n == 0:
        pcts = {pct_key(p): percentile_ci(x, p, confidence) for p in percentiles}
        return Dist(0, m, lo, hi, pcts, _NAN, _NAN, confidence)
    ranks = {pct_key(p): ci_ranks(n, p, confidence) for p in percentiles}
    wanted = sorted({0, n - 1} | {r for rs in ranks.values() for r in rs if 0 <= r < n})
    y = np.partition(x, wanted)  # each wanted rank holds what it holds in the sorted sample
    return dist_from_ranks(n, (m, lo, hi), ranks, dict(zip(wanted, y[wanted].tolist(), strict=True)), confidence)


def dist_from_ranks(
    n: int,
    mean: tuple[float, float, float],
    ranks: dict[str, tuple[int, int, int]],
    at: dict[int, float],
    confidence: float,
) -> Dist:
    """A Dist of ``n`` exact samples from the order statistics ``at`` (rank -> value) its
    percentiles' ``ranks`` (``ci_ranks``) name, and the extremes (ranks 0 and n - 1)."""
    pcts = {
        key: (at[k], at[lo] if lo >= 0 else -_INF, at[hi] if hi < n else _INF) for key, (k, lo, hi) in ranks.items()
    }
    return Dist(n, *mean, pcts, at[0], at[n - 1], confidence)


def _describe_censored(x: Floats, c: Floats, confidence: float, percentiles: tuple[float, ...]) -> Dist:
    """``describe`` with censored samples ``c`` beside the exact, sorted ``x``."""
    y = np.concatenate([x, c])
    cens = np.concatenate([np.zeros(x.size, dtype=bool), np.ones(c.size, dtype=bool)])
    order = np.lexsort((cens, y))  # by value; at a tie the exact sample first
    y, cens = y[order], cens[order]
    n, first = y.size, int(np.argmax(cens))  # the lowest rank a censored sample holds
    pcts, flags = {}, {}
    for p in percentiles:
        k, lo, hi = ci_ranks(n, p, confidence)
        key = pct_key(p)
        pcts[key] = (
            float(y[k]),
            float(y[lo]) if lo >= 0 else -_INF,
            float(x[hi]) if hi < x.size else _INF,  # every censored sample taken as infinitely late
        )
        flags[key] = PctFlags(value=first <= k, lo=0 <= lo and first <= lo)
    m, m_lo, _ = mean_ci(y, confidence)
    return Dist(n, m, m_lo, _INF, pcts, float(y[0]), float(y[-1]), confidence, int(c.size), flags, bool(cens[0]))
