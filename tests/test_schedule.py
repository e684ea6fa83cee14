"""Schedules are pure functions of (arrival, seed): same inputs, same array, anywhere."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.errors import LoadgenError
from loadgen.schedule import Arrival, ScheduleError, offsets_ns, parse_arrival, shard_indices

POISSON = Arrival("poisson", rate=50.0)
GAMMA = Arrival("gamma", rate=20.0, cv=2.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="uniform", rate=1.0), "unknown"),
        (dict(kind="poisson"), "need a rate"),
        (dict(kind="poisson", rate=0.0), "rate must be"),
        (dict(kind="constant", rate=-3.0), "rate must be"),
        (dict(kind="constant", rate=float("inf")), "rate must be"),
        (dict(kind="poisson", rate=5.0, concurrency=4), "either a rate or a concurrency"),
        (dict(kind="poisson", rate=5.0, cv=2.0), "only to gamma"),
        (dict(kind="gamma", rate=5.0), "cv > 0"),
        (dict(kind="gamma", rate=5.0, cv=0.0), "cv > 0"),
        (dict(kind="closed"), "concurrency >= 1"),
        (dict(kind="closed", concurrency=0), "concurrency >= 1"),
        (dict(kind="closed", concurrency=2.5), "concurrency >= 1"),
        (dict(kind="closed", concurrency=True), "concurrency >= 1"),
        (dict(kind="closed", concurrency=4, rate=3.0), "not a rate"),
    ],
)
def test_arrival_rejects_bad_specs(kwargs: dict, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        Arrival(**kwargs)


@pytest.mark.parametrize(
    "text, rate, concurrency, expected, shown",
    [
        ("constant", 10, None, Arrival("constant", rate=10), "constant @ 10 req/s"),
        (" Poisson ", 10.0, None, Arrival("poisson", rate=10.0), "poisson @ 10 req/s"),
        ("gamma:2.0", 5, None, Arrival("gamma", rate=5, cv=2.0), "gamma(cv=2) @ 5 req/s"),
        ("gamma:0.5", 2.5, None, Arrival("gamma", rate=2.5, cv=0.5), "gamma(cv=0.5) @ 2.5 req/s"),
        ("closed", None, 8, Arrival("closed", concurrency=8), "closed loop, concurrency 8"),
        ("closed:4", None, None, Arrival("closed", concurrency=4), "closed loop, concurrency 4"),
    ],
)
def test_parse_arrival(text: str, rate, concurrency, expected: Arrival, shown: str) -> None:
    got = parse_arrival(text, rate=rate, concurrency=concurrency)
    assert got == expected
    assert str(got) == shown


@pytest.mark.parametrize(
    "text, rate, concurrency, message",
    [
        ("gamma", 5.0, None, "gamma:2.0"),
        ("gamma:x", 5.0, None, "not a number"),
        ("poisson:3", 5.0, None, "takes no"),
        ("closed:2.5", None, None, "integer"),
        ("closed:4", None, 8, "contradicts"),
        ("poisson", None, None, "need a rate"),
        ("closed", 5.0, 8, "not a rate"),
    ],
)
def test_parse_arrival_errors(text: str, rate, concurrency, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        parse_arrival(text, rate=rate, concurrency=concurrency)


def test_a_schedule_error_is_a_user_error() -> None:
    """The command line prints a LoadgenError as one line with exit code 2, never a traceback."""
    assert issubclass(ScheduleError, LoadgenError)


def test_closed_loop_has_no_schedule() -> None:
    with pytest.raises(ScheduleError, match="closed loop has no schedule"):
        offsets_ns(Arrival("closed", concurrency=2), 0, count=10)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(), "duration, a request count"),
        (dict(count=-1), "count must be"),
        (dict(count=2.5), "count must be"),
        (dict(duration_s=-1.0), "duration must be"),
        (dict(duration_s=float("nan")), "duration must be"),
        (dict(duration_s=float("inf")), "duration must be"),
        (dict(duration_s=1e308), "duration must be"),  # finite, but no int64 of nanoseconds holds it
        (dict(duration_s=1e7), "check the rate"),  # 50 req/s for 1e7 s: 5e8 requests
    ],
)
def test_offsets_rejects_bad_bounds(kwargs: dict, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        offsets_ns(POISSON, 0, **kwargs)


@pytest.mark.parametrize("arrival", [Arrival("constant", rate=7.0), POISSON, GAMMA])
def test_same_seed_same_array_and_seed_matters(arrival: Arrival) -> None:
    a = offsets_ns(arrival, 42, count=5000)
    b = offsets_ns(arrival, 42, count=5000)
    assert a.dtype == np.int64 and a.shape == (5000,)
    assert np.array_equal(a, b)
    assert np.all(np.diff(a) >= 0)
    if arrival.kind != "constant":
        assert not np.array_equal(a, offsets_ns(arrival, 43, count=5000))


def test_same_array_in_another_process() -> None:
    code = (
        "import sys, numpy as np\n"
        "from loadgen.schedule import Arrival, offsets_ns\n"
        "a = offsets_ns(Arrival('gamma', rate=20.0, cv=2.0), 7, count=20000)\n"
        "sys.stdout.write(a.tobytes().hex())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    here = offsets_ns(GAMMA, 7, count=20000)
    assert bytes.fromhex(out) == here.tobytes()


def test_duration_schedule_is_a_prefix_of_the_longer_one() -> None:
    # Draws are cut into blocks of 65536; 3 s at 50k req/s crosses several blocks.
    arrival = Arrival("poisson", rate=50_000.0)
    long = offsets_ns(arrival, 3, count=200_000)
    short = offsets_ns(arrival, 3, duration_s=3.0)
    assert short.size > 65_536 * 2
    assert np.all(short < 3_000_000_000)
    assert np.array_equal(short, long[: short.size])
    assert long[short.size] >= 3_000_000_000


@pytest.mark.parametrize("arrival", [Arrival("constant", rate=3.0), POISSON, GAMMA])
@pytest.mark.parametrize("duration_s, count", [(2.0, None), (2.0, 10), (2.0, 10**6), (0.0, None)])
def test_whichever_bound_ends_first(arrival: Arrival, duration_s: float, count: int | None) -> None:
    got = offsets_ns(arrival, 11, duration_s=duration_s, count=count)
    assert np.all(got < round(duration_s * 1e9))
    if count is not None:
        assert got.size <= count
        longer = offsets_ns(arrival, 11, count=count)
        assert np.array_equal(got, longer[: got.size])


def test_constant_starts_at_zero_and_has_no_drift() -> None:
    for rate in (3.0, 7.0, 1234.5):
        got = offsets_ns(Arrival("constant", rate=rate), 0, count=10**6 + 1)
        assert got[0] == 0
        exact = Fraction(10**9) / Fraction(rate)
        for k in (1, 2, 999_999, 10**6):
            assert got[k] == round(k * exact)


def test_constant_duration_count() -> None:
    got = offsets_ns(Arrival("constant", rate=10.0), 0, duration_s=1.0)
    assert got.tolist() == [k * 100_000_000 for k in range(10)]


def test_a_million_random_arrivals_come_in_blocks_that_join_exactly() -> None:
    """Past one draw block (65,536 gaps) the schedule is still one non-decreasing stream: a count
    gives exactly that many, a duration about rate x duration. (How fast: benchmarks/schedule.py.)"""
    a = offsets_ns(GAMMA, 1, count=10**6)
    b = offsets_ns(POISSON, 1, duration_s=20_000.0)
    assert a.size == 10**6 and np.all(np.diff(a) >= 0)
    assert b.size == pytest.approx(50.0 * 20_000, rel=0.01) and np.all(b < 20_000 * 10**9)
    assert np.array_equal(offsets_ns(GAMMA, 1, count=70_000), a[:70_000])  # a prefix, across the block edge


@settings(max_examples=25, deadline=None)
@given(
    rate=st.floats(0.5, 5000.0),
    seed=st.integers(0, 2**32),
)
def test_poisson_mean_rate_and_cv(rate: float, seed: int) -> None:
    gaps = np.diff(offsets_ns(Arrival("poisson", rate=rate), seed, count=50_001)) / 1e9
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@settings(max_examples=25, deadline=None)
@given(
    rate=st.floats(0.5, 5000.0),
    cv=st.floats(0.3, 2.0),
    seed=st.integers(0, 2**32),
)
def test_gamma_mean_rate_and_cv(rate: float, cv: float, seed: int) -> None:
    gaps = np.diff(offsets_ns(Arrival("gamma", rate=rate, cv=cv), seed, count=100_001)) / 1e9
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 500), shards=st.integers(1, 12))
def test_shards_partition_the_indices(n: int, shards: int) -> None:
    parts = [shard_indices(n, s, shards) for s in range(shards)]
    everything = np.sort(np.concatenate(parts))
    assert np.array_equal(everything, np.arange(n))
    for s, p in enumerate(parts):
        assert np.all(p % shards == s)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    "n, shard, shards, message",
    [
        (10, 0, 0, "shards must be"),
        (10, 3, 3, r"\[0, 3\)"),
        (-1, 0, 1, "n must"),
        (10, -1, 2, r"\[0, 2\)"),
        (10, 0.5, 2, "integer"),
    ],
)
def test_shard_indices_validated(n, shard, shards, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        shard_indices(n, shard, shards)
