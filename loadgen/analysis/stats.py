"""Distribution-free summary statistics with honest confidence intervals.

Latency distributions are skewed and heavy-tailed, so percentile intervals come
from order statistics and the binomial distribution, which hold for any
continuous distribution (and are conservative for discrete ones). A p99 from 50
samples has no upper bound at 95 %: we say so (``inf``) rather than print a
number that looks precise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeAlias, TypedDict

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as _sps

__all__ = [
    "PERCENTILES",
    "Dist",
    "DistJson",
    "PercentileJson",
    "describe",
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


def percentile_ci(sorted_values: ArrayLike, p: float, confidence: float = 0.95) -> tuple[float, float, float]:
    """(estimate, lower, upper) of the p-th percentile of sorted data.

    The estimate is the nearest-rank order statistic (numpy's "inverted_cdf"):
    always an observed value. The interval [X_(l), X_(u)] is equal-tailed: with
    K ~ Binomial(n, p/100) the number of samples below the true quantile, l is
    the largest rank with P(K < l) <= alpha/2 and u the smallest with
    P(K < u) >= 1 - alpha/2, so coverage is >= confidence. A side whose rank
    falls outside 1..n is unbounded (-inf / +inf); n = 0 gives all NaN.
    """
    if not 0 < p < 100:
        raise ValueError(f"percentile must be strictly between 0 and 100, got {p!r}")
    _check_prob("confidence", confidence)
    x = np.asarray(sorted_values, dtype=np.float64)
    n = x.size
    if n == 0:
        return (_NAN, _NAN, _NAN)
    q = p / 100.0
    tail = (1.0 - confidence) / 2.0
    est = float(x[_nearest_rank(n, q)])
    # Lower: largest k (= l - 1) with cdf(k) <= tail; ppf gives the smallest with cdf >= tail.
    k = int(_sps.binom.ppf(tail, n, q))
    if _sps.binom.cdf(k, n, q) > tail:
        k -= 1
    lo = float(x[k]) if k >= 0 else -_INF
    # Upper: smallest k (= u - 1) with cdf(k) >= 1 - tail; rank u = k + 1 -> index k.
    ku = int(_sps.binom.ppf(1.0 - tail, n, q))
    hi = float(x[ku]) if ku < n else _INF
    return (est, lo, hi)


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
    half = float(_sps.t.ppf(0.5 + confidence / 2.0, n - 1)) * float(np.std(x, ddof=1)) / math.sqrt(n)
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
        return float(_sps.binom.cdf(t, h + t, 1.0 - p)) <= alpha

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
    lo = float(_sps.chi2.ppf(a / 2, 2 * count)) / 2 if count > 0 else 0.0
    hi = float(_sps.chi2.ppf(1 - a / 2, 2 * count + 2)) / 2
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


class PercentileJson(TypedDict):
    value: JsonNumber
    lo: JsonNumber
    hi: JsonNumber


class DistJson(TypedDict):
    """``Dist.to_json``: numbers as ``json_number`` writes them (NaN -> null, inf -> "inf")."""

    n: int
    mean: JsonNumber
    mean_ci: list[JsonNumber]
    min: JsonNumber
    max: JsonNumber
    confidence: float
    percentiles: dict[str, PercentileJson]


@dataclass(frozen=True)
class Dist:
    """One metric's distribution: count, mean with CI, percentiles with CI, extremes.

    ``pcts`` maps "p50" .. "p99.9" to (estimate, lower, upper); an infinite bound
    means "unbounded at this sample size".
    """

    n: int
    mean: float
    mean_lo: float
    mean_hi: float
    pcts: dict[str, tuple[float, float, float]]
    min: float
    max: float
    confidence: float = 0.95

    def pct(self, p: float) -> tuple[float, float, float]:
        """(estimate, lower, upper) for percentile p, e.g. ``d.pct(99)``."""
        return self.pcts[pct_key(p)]

    def to_json(self) -> DistJson:
        return {
            "n": int(self.n),
            "mean": json_number(self.mean),
            "mean_ci": [json_number(self.mean_lo), json_number(self.mean_hi)],
            "min": json_number(self.min),
            "max": json_number(self.max),
            "confidence": self.confidence,
            "percentiles": {
                k: PercentileJson(value=json_number(v), lo=json_number(lo), hi=json_number(hi))
                for k, (v, lo, hi) in self.pcts.items()
            },
        }


def describe(
    values: ArrayLike,
    confidence: float = 0.95,
    percentiles: tuple[float, ...] = PERCENTILES,
) -> Dist:
    """Summarise a sample (NaNs dropped) into a Dist."""
    x = np.asarray(values, dtype=np.float64).ravel()
    x = np.sort(x[~np.isnan(x)])
    m, lo, hi = mean_ci(x, confidence)
    pcts = {pct_key(p): percentile_ci(x, p, confidence) for p in percentiles}
    if x.size == 0:
        return Dist(0, m, lo, hi, pcts, _NAN, _NAN, confidence)
    return Dist(int(x.size), m, lo, hi, pcts, float(x[0]), float(x[-1]), confidence)
