"""Percentile intervals hold for any distribution; small samples say "unbounded"."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from loadgen.analysis.stats import (
    PERCENTILES,
    binomial_min_samples,
    describe,
    mean_ci,
    min_samples_bounded,
    percentile_ci,
)

INF = math.inf


@pytest.mark.parametrize(
    "p, failures, confidence, expected",
    [
        (0.99, 0, 0.99, 459),
        (0.99, 1, 0.99, 662),
        (0.99, 2, 0.99, 838),
        (0.90, 0, 0.99, 44),
    ],
)
def test_mlperf_early_stopping_numbers(p, failures, confidence, expected) -> None:
    assert binomial_min_samples(p, failures, confidence) == expected


def test_min_samples_is_the_smallest_that_qualifies() -> None:
    from scipy.stats import binom

    for t in (0, 3, 50):
        total = binomial_min_samples(0.99, t, 0.95)
        h = total - t
        assert binom.sf(h - 1, h + t, 0.99) <= 0.05  # P[Bin(h+t, p) >= h]
        assert binom.sf(h - 2, h - 1 + t, 0.99) > 0.05


@pytest.mark.parametrize("args", [(1.0, 0, 0.99), (0.0, 0, 0.99), (0.99, -1, 0.99), (0.99, 0, 1.0), (0.99, 1.5, 0.9)])
def test_min_samples_rejects_bad_input(args) -> None:
    with pytest.raises(ValueError):
        binomial_min_samples(*args)


@pytest.mark.parametrize("p", [50, 90, 99, 99.9])
def test_point_estimate_is_nearest_rank(p: float) -> None:
    # Exact nearest rank ceil(p/100 * n). numpy's "inverted_cdf" agrees except where
    # float error bites: 99.9 % of 1000 is rank 999, numpy says 1000.
    x = np.sort(np.random.default_rng(3).lognormal(size=1001))
    for n in (1, 2, 7, 100, 1000, 1001):
        rank = max(math.ceil(Fraction(str(p)) / 100 * n), 1)
        assert percentile_ci(x[:n], p)[0] == x[rank - 1]


@pytest.mark.parametrize("p", [50, 90, 99])
def test_ci_covers_the_true_quantile_at_least_95_percent(p: float) -> None:
    rng = np.random.default_rng(20240601)
    true_q = -math.log(1 - p / 100)  # Exp(1) quantile
    trials, n, covered = 400, 500, 0
    for _ in range(trials):
        _, lo, hi = percentile_ci(np.sort(rng.exponential(size=n)), p)
        covered += lo <= true_q <= hi
    # Exact coverage is >= 95 % (conservative by discreteness); allow sampling noise.
    assert covered / trials >= 0.93


@pytest.mark.parametrize(
    "n, p, lo_inf, hi_inf",
    [
        (5, 50, True, True),
        (6, 50, False, False),
        (10, 99, False, True),
        (367, 99, False, True),
        (368, 99, False, False),
        (1000, 99.9, False, True),
    ],
)
def test_small_samples_give_unbounded_sides(n: int, p: float, lo_inf: bool, hi_inf: bool) -> None:
    est, lo, hi = percentile_ci(np.arange(n, dtype=float), p)
    assert math.isfinite(est)
    assert (lo == -INF) is lo_inf
    assert (hi == INF) is hi_inf
    if not lo_inf:
        assert lo <= est
    if not hi_inf:
        assert est <= hi


@pytest.mark.parametrize("p", PERCENTILES)
def test_min_samples_bounded_matches_percentile_ci(p: float) -> None:
    need = min_samples_bounded(p)
    below = percentile_ci(np.arange(need - 1.0), p)
    at = percentile_ci(np.arange(float(need)), p)
    assert math.isinf(below[1]) or math.isinf(below[2])
    assert all(math.isfinite(v) for v in at)


def test_empty_sample_is_nan() -> None:
    assert all(math.isnan(v) for v in percentile_ci(np.array([]), 99))
    assert all(math.isnan(v) for v in mean_ci(np.array([])))
    d = describe([])
    assert d.n == 0 and math.isnan(d.min) and math.isnan(d.pct(50)[0])


def test_mean_ci() -> None:
    m, lo, hi = mean_ci(np.array([1.0, 2.0, 3.0, 4.0]))
    assert m == 2.5
    # t(0.975, 3) = 3.182446; s = 1.290994; half = 3.182446 * 1.290994 / 2
    assert hi - m == pytest.approx(2.054275, rel=1e-5)
    assert m - lo == pytest.approx(hi - m)
    assert mean_ci(np.array([7.0]))[1:] == (-INF, INF)


def test_describe_and_strict_json() -> None:
    d = describe([5.0, 1.0, float("nan"), 3.0, 2.0, 4.0])
    assert (d.n, d.min, d.max, d.mean) == (5, 1.0, 5.0, 3.0)
    assert list(d.pcts) == ["p50", "p90", "p95", "p99", "p99.9"]
    assert d.pct(99.9)[2] == INF
    doc = json.loads(json.dumps(d.to_json(), allow_nan=False))
    assert doc["n"] == 5 and doc["mean"] == 3.0
    # unbounded at n = 5: null plus a flag, so strict JSON holds it and no reader parses "inf"
    assert doc["percentiles"]["p99"]["hi"] is None and doc["percentiles"]["p99"]["hi_unbounded"]
    assert doc["percentiles"]["p50"] == {
        "value": 3.0,
        "lower_bound": False,
        "lo": None,
        "lo_lower_bound": False,
        "hi": None,
        "lo_unbounded": True,
        "hi_unbounded": True,
    }
    assert doc["censored"] == 0 and not doc["mean_lower_bound"]
    empty = json.loads(json.dumps(describe([]).to_json(), allow_nan=False))
    assert empty["mean"] is None and empty["min"] is None
