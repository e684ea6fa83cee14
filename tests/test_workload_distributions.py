"""Length distributions: clipping, integer counts, means, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.workload.distributions import Distribution, Empirical, Fixed, LogNormal, Normal, Uniform
from loadgen.workload.text import rng

bounds = st.tuples(st.none() | st.integers(1, 500), st.none() | st.integers(1, 5000))


def dists(lo: int | None, hi: int | None) -> list[Distribution]:
    return [
        Fixed(value=100, min=lo, max=hi),
        Uniform(low=1, high=3000, min=lo, max=hi),
        Normal(mu=50, std=400, min=lo, max=hi),
        LogNormal.from_mean(300, 1.5, min=lo, max=hi),
        Empirical(values=np.asarray([0.0, 2.0, 7.0, 1e6]), min=lo, max=hi),
    ]


@settings(max_examples=40, deadline=None)
@given(bounds, st.integers(0, 2**63))
def test_token_counts_are_whole_at_least_one_and_clipped(b: tuple[int | None, int | None], seed: int) -> None:
    lo, hi = b
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    for d in dists(lo, hi):
        x = d.sample(rng(seed, 1), 300)
        assert x.dtype == np.int64
        assert x.min() >= max(lo or 1, 1)
        if hi is not None:
            assert x.max() <= hi


@settings(max_examples=25, deadline=None)
@given(st.floats(5, 5000), st.floats(0, 1.0), st.integers(0, 2**32))
def test_lognormal_by_mean_and_by_median(mean: float, sigma: float, seed: int) -> None:
    x = LogNormal.from_mean(mean, sigma, integer=False).sample(rng(seed, 2), 40_000)
    assert x.mean() == pytest.approx(mean, rel=0.05)
    m = LogNormal.from_median(mean, sigma, integer=False).sample(rng(seed, 3), 40_000)
    assert float(np.median(m)) == pytest.approx(mean, rel=0.05)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 1000), st.integers(0, 50), st.integers(0, 2**32))
def test_uniform_hits_both_ends_and_normal_mean(low: int, width: int, seed: int) -> None:
    x = Uniform(low=low, high=low + width).sample(rng(seed, 4), 4000)
    assert x.min() == low and x.max() == low + width
    y = Normal(mu=low + 500, std=width, integer=False).sample(rng(seed, 5), 20_000)
    assert y.mean() == pytest.approx(low + 500, abs=max(1.0, width * 0.05))


def test_seconds_are_floats_at_least_zero() -> None:
    x = Normal(mu=0.5, std=2.0, integer=False, max=3.0).sample(rng(0, 6), 1000)
    assert x.dtype == np.float64 and x.min() == 0.0 and x.max() == 3.0
    assert Fixed(value=0.25, integer=False).one(rng(0, 7)) == 0.25


def test_sampling_is_a_pure_function_of_the_generator_seed() -> None:
    d = LogNormal.from_median(100, 0.7, min=5, max=900)
    a, b = d.sample(rng(9, 1, 2), 50), d.sample(rng(9, 1, 2), 50)
    assert (a == b).all()
    assert not (a == d.sample(rng(9, 1, 3), 50)).all()
    assert math.isclose(d.mean(), 100 * math.exp(0.7**2 / 2))
    assert d.describe()["min"] == 5 and d.describe()["type"] == "lognormal"


def test_rng_keys_of_different_length_do_not_collide() -> None:
    # numpy's SeedSequence pads with zeros: [1, 2] and [1, 2, 0] would be the same stream
    assert rng(1, 2).random() != rng(1, 2, 0).random()
    assert rng(2**40, 1).random() != rng(0, 1).random()
