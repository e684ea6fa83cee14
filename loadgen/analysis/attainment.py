"""SLO attainment statistics: how sure a measured point's attainment is, and capacity at SLO.

Plain statistics over (rate, met, n) counts, so they live in the analysis layer: the
automatic search (``sweep.search``) sizes its bisection points with them and every view of
a finished run (``analysis.points``) states capacity with them. One-sided Clopper-Pearson
bounds of an attainment fraction, the samples a clean pass needs, and the highest rate
whose attainment meets a target, with how far that is confirmed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadgen.analysis.distributions import beta_ppf

__all__ = ["Capacity", "attainment_interval", "samples_to_confirm", "capacity_at_slo"]


def attainment_interval(met: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """One-sided Clopper-Pearson bounds (lower, upper) of the attainment fraction.

    Each bound alone holds with ``confidence``: lower >= target confirms a pass,
    upper < target confirms a miss; anything else is inconclusive at this n.
    """
    if n <= 0:
        return (0.0, 1.0)
    alpha = 1.0 - confidence
    lo = float(beta_ppf(alpha, met, n - met + 1)) if met > 0 else 0.0
    hi = float(beta_ppf(1 - alpha, met + 1, n - met)) if met < n else 1.0
    return (lo, hi)


def samples_to_confirm(target_pct: float, confidence: float = 0.95) -> int:
    """Requests needed, with no miss, for the lower bound to reach the target (299 for 99% at 95%)."""
    return int(math.ceil(math.log(1 - confidence) / math.log(target_pct / 100.0)))


@dataclass(frozen=True)
class Capacity:
    """Capacity at SLO: the highest offered rate whose attainment meets the target.

    ``rate`` uses point estimates; ``lower``/``upper`` bracket it with confidence:
    ``lower`` is the highest rate with a confirmed pass, ``upper`` the lowest rate
    with a confirmed miss (inf when none was seen).
    """

    rate: float | None
    lower: float
    upper: float
    confirmed: bool
    target_pct: float
    note: str


def capacity_at_slo(points: list[tuple[float, int, int]], target_pct: float, confidence: float = 0.95) -> Capacity:
    """From (rate, met, n) per point; assumes attainment falls as the rate rises."""
    pts = sorted((r, m, n) for r, m, n in points if n > 0)
    target = target_pct / 100.0
    if not pts:
        return Capacity(None, 0.0, math.inf, False, target_pct, "no point had requests in its window")
    first_miss = next((r for r, m, n in pts if m / n < target), math.inf)
    passing = [r for r, m, n in pts if m / n >= target and r < first_miss]
    rate = max(passing) if passing else None
    confirmed_miss = [r for r, m, n in pts if attainment_interval(m, n, confidence)[1] < target]
    upper = min(confirmed_miss, default=math.inf)
    confirmed_pass = [r for r, m, n in pts if attainment_interval(m, n, confidence)[0] >= target and r < upper]
    lower = max(confirmed_pass, default=0.0)
    confirmed = rate is not None and lower >= rate
    need = samples_to_confirm(target_pct, confidence)
    if rate is None:
        note = f"no point met {target_pct:g}% attainment (lowest rate {pts[0][0]:g} req/s)"
    elif confirmed:
        note = f"{rate:g} req/s met {target_pct:g}% with {confidence:.0%} confidence"
    else:
        note = (
            f"{rate:g} req/s met {target_pct:g}% on the point estimate, not confirmed: "
            f"a clean confirmation needs >= {need} requests in the window"
        )
    if first_miss == math.inf and rate is not None:
        note += "; no point missed the SLO, so capacity may be higher"
    return Capacity(rate, lower, upper, confirmed, target_pct, note)
