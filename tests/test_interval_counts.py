"""HdrHistogram counters computed with numpy agree with the library, and the time series' counter
of open intervals keeps each interval's total however it holds its counts."""

from __future__ import annotations

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from loadgen.analysis import interval_counts
from loadgen.analysis.interval_counts import (
    HIST_DIGITS,
    HIST_HIGHEST_US,
    ClosingCounter,
    IntervalPercentiles,
    us_index,
)


def _library_lowest(values_us: list[int]) -> list[int]:
    h = HdrHistogram(1, HIST_HIGHEST_US, HIST_DIGITS)
    return [int(h.get_lowest_equivalent_value(v)) for v in values_us]


@pytest.mark.parametrize(
    "values_us",
    [
        [0, 1, 2047, 2048, 2049, 18_000, 18_017, (1 << 21) - 1],  # all looked up
        [5, 18_000, (1 << 21) - 1, 1 << 21, (1 << 21) + 1, 3_599_999_999],  # some past the table
    ],
)
@pytest.mark.parametrize("lookup_min", [0, 1 << 19], ids=["table", "formula"])
def test_a_values_counter_is_the_librarys_looked_up_or_not(
    values_us: list[int], lookup_min: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interval_counts, "_LOOKUP_MIN", lookup_min)  # a few values take the table too
    got = us_index(np.array(values_us, dtype=np.float64) / 1000.0)
    assert interval_counts._LOWEST[got].tolist() == _library_lowest(values_us)


def test_values_are_rounded_to_us_and_clipped_to_the_range() -> None:
    got = us_index(np.array([-3.0, 0.0004, 0.0006, 18.0004, 9e9]))
    assert interval_counts._LOWEST[got].tolist() == _library_lowest([0, 0, 1, 18_000, HIST_HIGHEST_US])


def test_each_counters_highest_value_is_the_librarys() -> None:
    h = HdrHistogram(1, HIST_HIGHEST_US, HIST_DIGITS)
    every = [int(h.get_highest_equivalent_value(int(v))) for v in interval_counts._LOWEST]
    assert interval_counts._highest().tolist() == every


@pytest.mark.parametrize("dense_cells", [1 << 21, 16])  # a dense table of open intervals; pairs
def test_the_open_intervals_counter_sums_each_intervals_counts(
    monkeypatch: pytest.MonkeyPatch, dense_cells: int
) -> None:
    monkeypatch.setattr(interval_counts, "_DENSE_CELLS", dense_cells)
    rng = np.random.default_rng(7)
    acc = ClosingCounter(IntervalPercentiles(6, (50, 99)))
    want = np.zeros(6)
    for first in range(4):  # blocks in time order, each spanning three intervals
        bucket = rng.integers(first, first + 3, 500)
        counter = us_index(rng.lognormal(np.log(18.0), 0.5, 500))
        counts = rng.integers(1, 4, 500)
        np.add.at(want, bucket, counts)
        acc.add(bucket, counter, counts.astype(np.float64), final=first)
    acc.flush()
    assert acc.sums.tolist() == want.tolist()
