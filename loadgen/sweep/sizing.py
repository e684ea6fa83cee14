"""How long each load point runs: until its window holds the samples its p99 verdicts need, within caps.

A p99 whose confidence interval has two finite ends needs a minimum number of samples
(``stats.min_samples_bounded``: 368 at 95 %); below it the point is ``few_samples``
(``analysis.validity``) and its p99 is an open interval. With an SLO, a clean pass of the
attainment target needs ``attainment.samples_to_confirm`` requests too (299 for 99 % at
95 %). ``samples_needed`` is the larger of these, from that code, not a copied number.

A point's requests arrive at random, so a window sized at ``needed / rate`` would hold too
few half of the time: it is sized for the expected count at which holding fewer than
``needed`` is a one-in-a-hundred event (``expected_for``; about 416 for 368 at Poisson
arrivals). Its measured length is then ``max(min_s, expected / rate)``, capped per point
(``max_point_s``) and for the whole sweep (``max_total_s`` of measured windows); a capped
point is marked so the terminal and run.json can say which. A closed-loop point has no
rate to size by before it runs: ``Sizing.sized`` gets the best estimate its caller has
(the previous point's completed rate), else the point runs its cap.

Pure functions of their inputs: a sized sweep plans the same durations on every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from loadgen.errors import ConfigError

__all__ = [
    "Sizing",
    "Sized",
    "samples_needed",
    "expected_for",
    "nice_rate_at_least",
    "MIN_POINT_S",
    "MAX_POINT_S",
    "MAX_TOTAL_S",
]

MIN_POINT_S = 6.0  # the shortest measured window: shorter ones are mostly ramp-up and bursts
MAX_POINT_S = 30.0  # the cap per point: a light point that needs longer runs this long and is marked
MAX_TOTAL_S = 150.0  # the cap on all measured windows together (warm-ups and drains come on top)
_Z = 2.326  # one-sided 99 % normal quantile: a window holding fewer than needed is a 1-in-100 event
_NICE = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def samples_needed(confidence: float = 0.95, target_pct: float | None = None) -> int:
    """In-window requests a point needs for bounded p99 verdicts at ``confidence``.

    Both ends of the p99 interval finite (the ``few_samples`` rule), the gate's one-sided
    p99 bound with no sample over it, and with an SLO ``target_pct`` a clean attainment pass
    that can be confirmed: 368 at 95 % (299 for the other two)."""
    # imported when called: ``loadgen sweep --help`` reads this module's defaults without scipy
    from loadgen.analysis.attainment import samples_to_confirm
    from loadgen.analysis.stats import binomial_min_samples, min_samples_bounded

    n = max(min_samples_bounded(99, confidence), binomial_min_samples(0.99, 0, confidence))
    if target_pct is not None:
        n = max(n, samples_to_confirm(target_pct, confidence))
    return n


def expected_for(needed: int, cv: float = 1.0) -> float:
    """Expected arrivals at which a window holds at least ``needed`` with ~99 % probability.

    The count of a renewal process with gap CV ``cv`` has a standard deviation of about
    ``cv * sqrt(mean)`` (Poisson: ``cv`` 1; constant: 0, no margin): the mean solving
    ``mean - z * cv * sqrt(mean) = needed``, rounded up, plus one for where the window's
    edges fall between arrivals."""
    s = _Z * max(cv, 0.0)
    root = (s + math.sqrt(s * s + 4.0 * needed)) / 2.0
    return float(math.ceil(root * root - 1e-9) + 1)


def nice_rate_at_least(rate: float) -> float:
    """The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 (times a power of ten) >= ``rate``."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"rate {rate}: must be a finite number > 0")
    scale = 10.0 ** math.floor(math.log10(rate))
    return next(round(n * scale, 12) for n in _NICE if n * scale >= rate * (1 - 1e-12))


class Sized(NamedTuple):
    """A point's measured length: ``duration_s``; ``needed_s`` the length its samples need
    (inf when unknown: a closed loop with no estimate); ``capped`` "" or which cap shortened it
    ("point": ``max_point_s``; "sweep": what was left of ``max_total_s``)."""

    duration_s: float
    needed_s: float
    capped: str


@dataclass(frozen=True)
class Sizing:
    """Point sizing: ``samples`` in-window requests per point, between ``min_s`` and
    ``max_point_s`` of window each, at most ``max_total_s`` of windows in all."""

    samples: int = field(default_factory=samples_needed)
    min_s: float = MIN_POINT_S
    max_point_s: float = MAX_POINT_S
    max_total_s: float = MAX_TOTAL_S

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ConfigError(f"point sizing: {self.samples} samples; at least 1 is needed")
        if not 0 < self.min_s <= self.max_point_s:
            raise ConfigError(
                f"--min-point-duration {self.min_s:g} and --max-point-duration {self.max_point_s:g}: "
                "need 0 < min <= max seconds"
            )
        if not self.max_total_s >= self.min_s:
            raise ConfigError(
                f"--max-sweep-duration {self.max_total_s:g}: must be at least one point's "
                f"--min-point-duration ({self.min_s:g} s)"
            )

    def expected(self, cv: float = 1.0) -> float:
        """Expected in-window arrivals a point is sized for (see ``expected_for``)."""
        return expected_for(self.samples, cv)

    def lowest_rate(self, cv: float = 1.0) -> float:
        """The lowest rate whose point holds its samples within ``max_point_s``."""
        return self.expected(cv) / self.max_point_s

    def left_s(self, spent_s: float) -> float:
        """Measured seconds left in the sweep after ``spent_s``."""
        return self.max_total_s - spent_s

    def exhausted(self, spent_s: float) -> bool:
        """Too little of the sweep's budget is left for one more point of ``min_s``."""
        return self.left_s(spent_s) < self.min_s - 1e-9

    def sized(self, rate: float | None, spent_s: float = 0.0, cv: float = 1.0) -> Sized:
        """The window of a point at ``rate`` req/s (None: unknown) after ``spent_s`` of windows."""
        needed = self.expected(cv) / rate if rate is not None and rate > 0 else math.inf
        duration, capped = max(self.min_s, needed), ""
        if duration > self.max_point_s:
            duration, capped = self.max_point_s, "point"
        left = max(self.left_s(spent_s), self.min_s)  # a listed point still runs its shortest window
        if duration > left:
            duration, capped = left, "sweep"
        return Sized(round(duration, 3), round(needed, 3) if math.isfinite(needed) else math.inf, capped)

    def describe(self, cv: float = 1.0) -> str:
        """One clause for the plan: how points are sized."""
        return (
            f"a window sized to hold >= {self.samples} requests for bounded p99s ({self.expected(cv):.0f} "
            f"expected; {self.min_s:g}-{self.max_point_s:g} s, <= {self.max_total_s:g} s of windows in all)"
        )

    def to_json(self, cv: float = 1.0) -> dict[str, float | int]:
        """run.json's ``sweep.sizing``."""
        return {
            "samples": self.samples,
            "expected_samples": round(self.expected(cv), 1),
            "min_point_s": self.min_s,
            "max_point_s": self.max_point_s,
            "max_total_s": self.max_total_s,
        }
