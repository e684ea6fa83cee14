"""The throughput-versus-interactivity Pareto frontier, per-GPU figures and cost.

Convention (InferenceX, ENDPOINTS.md): x = interactivity, the median per-user
speed 1000 / TPOT(ms) in tokens/s, measured per request (never throughput
divided by concurrency); y = output tokens/s, per GPU when the GPU count is
given. A point is on the frontier when no other point is at least as good on
both axes and better on one: the frontier is every operating point worth
choosing, and the rest are dominated.

Cost per million output tokens = price per GPU-hour x GPUs / (output tok/s x 3600) x 1e6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadgen.errors import ConfigError

__all__ = ["frontier", "per_gpu", "cost_per_million", "parse_prices", "dominates"]


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """a is at least as good as b on both axes and strictly better on one."""
    return a[0] >= b[0] and a[1] >= b[1] and (a[0] > b[0] or a[1] > b[1])


def frontier(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the non-dominated points, by rising x (falling y).

    Points with a NaN coordinate are left out; of exact duplicates the first is kept.
    Sort by x descending (y descending to break ties), then sweep keeping every
    point whose y beats the best y seen: O(n log n).
    """
    if len(xs) != len(ys):
        raise ValueError("xs and ys differ in length")
    idx = [i for i in range(len(xs)) if _finite(xs[i]) and _finite(ys[i])]
    idx.sort(key=lambda i: (-xs[i], -ys[i], i))
    out: list[int] = []
    best = -math.inf
    for i in idx:
        if ys[i] > best:
            out.append(i)
            best = ys[i]
    return sorted(out, key=lambda i: (xs[i], -ys[i]))


def _finite(v: float) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def per_gpu(value: float, gpus: float | None) -> float:
    """``value`` per GPU (unchanged without a GPU count)."""
    if gpus is None:
        return value
    if not gpus > 0:
        raise ConfigError(f"--gpus {gpus}: must be > 0")
    return value / gpus


def cost_per_million(output_tps: float, price_per_gpu_hour: float, gpus: float = 1.0) -> float:
    """$ per million output tokens at this throughput; inf when nothing was produced."""
    if not (price_per_gpu_hour >= 0 and gpus > 0):
        raise ConfigError("prices must be >= 0 and --gpus > 0")
    if not (output_tps > 0 and math.isfinite(output_tps)):
        return math.inf
    return price_per_gpu_hour * gpus / (output_tps * 3600.0) * 1e6


def parse_prices(values: Sequence[str] | None) -> dict[str, float]:
    """``["2.5", "spot=1.1"]`` -> {"$2.5/GPU-h": 2.5, "spot": 1.1}: labelled GPU-hour prices."""
    out: dict[str, float] = {}
    for v in values or ():
        label, sep, num = v.rpartition("=")
        try:
            price = float(num)
        except ValueError:
            raise ConfigError(f"--price-per-gpu-hour {v!r}: expected a number or LABEL=NUMBER") from None
        if not (price >= 0 and math.isfinite(price)):
            raise ConfigError(f"--price-per-gpu-hour {v!r}: must be a finite price >= 0")
        name = label.strip() if sep and label.strip() else f"${price:g}/GPU-h"
        if name in out:
            raise ConfigError(f"--price-per-gpu-hour {v!r}: label {name!r} given twice")
        out[name] = price
    return out
