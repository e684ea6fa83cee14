"""What a plan finds, as plain data: the search's settings and points, priced points, the ranking.

Kept apart from the search and the simulation (``plan.search``, ``plan.run``) so that the report
layer (``report.plan_view``) reads a plan's results without importing the simulated engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadgen.analysis.cost import TokenCosts
from loadgen.analysis.metrics import SLO

__all__ = ["SearchSettings", "PointFigures", "Capacity", "Priced", "PlanEntry", "AxisResult", "PlanResult", "fmt_load"]


@dataclass(frozen=True)
class SearchSettings:
    slo: SLO
    target_pct: float = 99.0
    load: str = "concurrency"  # "concurrency" | "rate"
    start: float = 4.0
    duration_s: float = 60.0
    warmup_s: float = 20.0
    drain_s: float = 30.0
    refine: int = 2
    max_points: int = 12
    seed: int = 1
    min_requests: int = 250  # a point with fewer in its window is run again, longer (up to max_duration_s)
    max_duration_s: float = 1200.0


@dataclass(frozen=True)
class PointFigures:
    """One simulated point of one unit: the load, whether it met the SLO, and its figures (per unit)."""

    load: float
    requests: int
    attainment_pct: float
    output_tps: float  # output (decode) tokens/s
    input_tps: float  # prompt (prefill) tokens/s, cached ones included
    cached_pct: float  # share of prompt tokens served from the prefix cache
    per_user_tps: float  # median of 1/TPOT
    ttft_p99_ms: float
    tpot_p99_ms: float
    e2e_p99_ms: float
    misses: dict[str, int]  # requests over each bound (and unanswered)
    preemptions: int
    wall_s: float
    duration_s: float = 0.0  # the measured window (longer than asked where it held too few requests)

    def met(self, target_pct: float) -> bool:
        return self.attainment_pct >= target_pct


@dataclass
class Capacity:
    """The search's answer for one deployment: every point it measured, and the highest that met the SLO."""

    points: list[PointFigures] = field(default_factory=list)
    capacity: PointFigures | None = None  # None: not even the lowest load met it
    note: str = ""


@dataclass(frozen=True)
class Priced:
    """A point's figures for the whole deployment: throughput, per GPU, $/M, tokens per MW."""

    point: PointFigures
    gpus: int
    replicas: int
    usd_per_gpu_hour: float
    costs: TokenCosts
    output_tps: float  # the deployment's: the unit's x replicas
    input_tps: float
    output_tps_per_gpu: float
    input_tps_per_gpu: float
    tokens_per_mw: float  # output tokens/s per MW of power
    capacity: float  # the load the deployment carries: the unit's x replicas


@dataclass
class PlanEntry:
    """One deployment's result: what it is (``label``, ``gpus``, ``describe``), its search, its priced points."""

    label: str
    gpus: int
    describe: dict[str, Any]
    search: Capacity
    priced: list[Priced]  # every point, priced
    at_slo: Priced | None  # the operating point: capacity at SLO

    @property
    def cost(self) -> float:
        return self.at_slo.costs.blended if self.at_slo else float("inf")


@dataclass
class AxisResult:
    axis: str
    value: float
    entries: list[PlanEntry]


@dataclass
class PlanResult:
    entries: list[PlanEntry]  # ranked: cheapest at SLO first, then those that never met it
    axes: list[AxisResult] = field(default_factory=list)
    wall_s: float = 0.0
    points: int = 0


def fmt_load(load: float, kind: str) -> str:
    return f"{load:g} concurrent" if kind == "concurrency" else f"{load:.3g}/s"
