"""Pareto frontier, per-GPU figures and cost per million tokens: table-driven."""

from __future__ import annotations

import math

import pytest

from loadgen.analysis.pareto import cost_per_million, dominates, frontier, parse_prices, per_gpu
from loadgen.errors import ConfigError

NAN = float("nan")


@pytest.mark.parametrize(
    ("xs", "ys", "expected"),
    [
        ([], [], []),
        ([1.0], [5.0], [0]),
        # the classic trade-off: faster users, less aggregate throughput; all on the frontier
        ([150, 120, 80, 40], [100, 900, 1800, 2100], [3, 2, 1, 0]),
        # a point worse on both axes than another is dominated
        ([150, 100, 120], [100, 500, 900], [2, 0]),
        # equal x: only the higher y survives
        ([100, 100], [10, 20], [1]),
        # exact duplicates: the first is kept
        ([100, 100], [20, 20], [0]),
        # equal y: only the higher x survives
        ([50, 90], [300, 300], [1]),
        # NaN coordinates (no TPOT measured) are left out
        ([NAN, 10, 20], [1000, 5, NAN], [1]),
        # overload points (slower and no more throughput) fall off the frontier
        ([140, 110, 60, 30, 20], [500, 1500, 2500, 2600, 2550], [3, 2, 1, 0]),
    ],
)
def test_frontier(xs: list[float], ys: list[float], expected: list[int]) -> None:
    got = frontier(xs, ys)
    assert got == sorted(expected, key=lambda i: xs[i])
    for i in got:  # nothing dominates a frontier point
        assert not any(
            dominates((xs[j], ys[j]), (xs[i], ys[i]))
            for j in range(len(xs))
            if j != i and not (math.isnan(xs[j]) or math.isnan(ys[j]))
        )


def test_frontier_rejects_ragged_input() -> None:
    with pytest.raises(ValueError):
        frontier([1.0, 2.0], [1.0])


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [((2, 2), (1, 1), True), ((2, 1), (1, 1), True), ((1, 1), (1, 1), False), ((2, 0), (1, 1), False)],
)
def test_dominates(a: tuple[float, float], b: tuple[float, float], expected: bool) -> None:
    assert dominates(a, b) is expected


@pytest.mark.parametrize(
    ("tps", "price", "gpus", "expected"),
    [
        # ENDPOINTS.md: $/M = price per GPU-hour / (tok/s per GPU x 3600 / 1e6)
        (1000.0, 2.0, 1.0, 2.0 / (1000 * 3600 / 1e6)),
        (3600.0, 3.6, 1.0, 3.6 / 3600 / 3600 * 1e6),
        # 8 GPUs at 8000 tok/s aggregate cost the same per token as 1 GPU at 1000
        (8000.0, 2.0, 8.0, 2.0 / (1000 * 3600 / 1e6)),
        (1000.0, 0.0, 1.0, 0.0),
        (0.0, 2.0, 1.0, math.inf),
        (NAN, 2.0, 1.0, math.inf),
    ],
)
def test_cost_per_million(tps: float, price: float, gpus: float, expected: float) -> None:
    assert cost_per_million(tps, price, gpus) == pytest.approx(expected)


def test_cost_rejects_bad_inputs() -> None:
    with pytest.raises(ConfigError):
        cost_per_million(100.0, -1.0)
    with pytest.raises(ConfigError):
        cost_per_million(100.0, 1.0, gpus=0)


@pytest.mark.parametrize(("value", "gpus", "expected"), [(800.0, None, 800.0), (800.0, 8, 100.0), (1.0, 0.5, 2.0)])
def test_per_gpu(value: float, gpus: float | None, expected: float) -> None:
    assert per_gpu(value, gpus) == expected


def test_per_gpu_rejects_zero() -> None:
    with pytest.raises(ConfigError):
        per_gpu(1.0, 0)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (None, {}),
        (["2.5"], {"$2.5/GPU-h": 2.5}),
        (["spot=1.2", "on-demand=4"], {"spot": 1.2, "on-demand": 4.0}),
        (["=3"], {"$3/GPU-h": 3.0}),
    ],
)
def test_parse_prices(values: list[str] | None, expected: dict[str, float]) -> None:
    assert parse_prices(values) == expected


@pytest.mark.parametrize("bad", [["abc"], ["x=-1"], ["x=inf"], ["a=1", "a=2"]])
def test_parse_prices_rejects(bad: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_prices(bad)
