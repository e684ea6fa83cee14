"""The quantile and distribution functions loadgen's intervals rest on, from ``scipy.special``.

Why not ``scipy.stats``: importing it costs about a second (it builds every distribution's
docstring), and every loadgen command that prints a figure would pay it, while these few
functions are the same special functions ``scipy.stats`` itself calls: each returns exactly
what its ``scipy.stats`` counterpart returns (``tests/test_distributions.py`` compares them).
The binomial's two come from ``scipy.special._ufuncs`` (Boost's, private, as ``scipy.stats``
uses them; in every scipy of the pinned range), with ``rv_discrete``'s handling of the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

from scipy import special as _sc
from scipy.special import _ufuncs

__all__ = ["beta_ppf", "binom_cdf", "binom_ppf", "chi2_ppf", "norm_ppf", "t_ppf"]

_binom_cdf = cast(Callable[[float, float, float], float], getattr(_ufuncs, "_binom_cdf"))  # noqa: B009
_binom_ppf = cast(Callable[[float, float, float], float], getattr(_ufuncs, "_binom_ppf"))  # noqa: B009


def beta_ppf(q: float, a: float, b: float) -> float:
    """``scipy.stats.beta.ppf(q, a, b)``."""
    return float(_sc.betaincinv(a, b, q))


def t_ppf(q: float, df: float) -> float:
    """``scipy.stats.t.ppf(q, df)``: Student's t."""
    return float(_sc.stdtrit(df, q))


def chi2_ppf(q: float, df: float) -> float:
    """``scipy.stats.chi2.ppf(q, df)``."""
    return float(2.0 * _sc.gammaincinv(df / 2.0, q))


def norm_ppf(q: float) -> float:
    """``scipy.stats.norm.ppf(q)``: the standard normal's."""
    return float(_sc.ndtri(q))


def binom_cdf(k: float, n: int, p: float) -> float:
    """``scipy.stats.binom.cdf(k, n, p)``: P(K <= k) for K ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(_binom_cdf(math.floor(k), n, p))


def binom_ppf(q: float, n: int, p: float) -> float:
    """``scipy.stats.binom.ppf(q, n, p)``: the smallest k with P(K <= k) >= q (-1 at q = 0)."""
    if q <= 0:
        return -1.0 if q == 0 else math.nan
    if q >= 1:
        return float(n) if q == 1 else math.nan
    return float(_binom_ppf(q, n, p))
