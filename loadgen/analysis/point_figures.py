"""One load point's figures: its summary, with the intervals, costs and caveats beside it.

``points.analyze_run`` reads a run folder as load points (a single run is one); each point's
own rows become a ``PointFigures`` here (``point_figures``), judged as the run says
(``Judging``: the options given, else what run.json recorded) over the window the point's
warm-up and cool-down leave (``points.point_window``). The terminal, report.html,
summary.json and ``loadgen compare`` all show these figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from loadgen.analysis.attainment import attainment_interval
from loadgen.analysis.metrics import SLO, Summary, summarize
from loadgen.analysis.pareto import cost_per_million, per_gpu
from loadgen.analysis.pipeline import PipelineFigures
from loadgen.analysis.sessions import SessionSummary, session_summary
from loadgen.analysis.stats import rate_ci
from loadgen.analysis.validity import VALID, Caveat, Validity, cache_caveats, point_caveats
from loadgen.analysis.window import Window
from loadgen.analysis.window_tokens import throughput_ci

__all__ = ["Judging", "PointFigures", "point_figures"]


@dataclass(frozen=True)
class Judging:
    """How a run is judged: the options given, else what run.json recorded."""

    slo: SLO | None
    slo_name: str
    target_pct: float
    gpus: float | None
    prices: dict[str, float]
    lag_limit_ms: float


@dataclass
class PointFigures:
    """Every figure of one load point, with its interval where one is meaningful."""

    index: int
    label: str  # the arrival, as written
    phase: str
    rate: float | None  # target offered rate (open loop)
    concurrency: int | None  # closed loop
    summary: Summary
    output_tps_ci: tuple[float, float]
    gpus: float | None
    attainment_ci: tuple[float, float] | None  # two-sided, fraction
    goodput_ci: tuple[float, float] | None
    costs: dict[str, float]  # $ / M output tokens per price label
    caveats: list[Caveat] = field(default_factory=list)
    validity: Validity = VALID  # the point's own (its run's is RunAnalysis.validity)
    on_frontier: bool = False
    sessions: SessionSummary | None = None  # whole-session figures (analysis.sessions)
    pipeline: PipelineFigures | None = None  # a pipeline run's stage breakdown (analysis.pipeline)
    unit: str = "req/s"  # of an open-loop rate: sessions/s for sessions of several turns

    @property
    def warnings(self) -> list[str]:  # the caveats' messages, for views that show words only
        return [c.message for c in self.caveats]

    @property
    def x(self) -> float:
        """Median per-user speed (tok/s, from 1/TPOT per request): the Pareto x axis."""
        d = self.summary.per_user_tps
        return d.pct(50)[0] if d.n else math.nan

    @property
    def y(self) -> float:
        """Output tok/s, per GPU when a GPU count was given: the Pareto y axis."""
        return per_gpu(self.summary.output_tps, self.gpus)

    @property
    def y_ci(self) -> tuple[float, float]:
        return (per_gpu(self.output_tps_ci[0], self.gpus), per_gpu(self.output_tps_ci[1], self.gpus))

    @property
    def short_label(self) -> str:
        """The load alone ("8 req/s", "16 users"); the arrival kind is the same for the whole sweep."""
        if self.rate is not None:
            return f"{self.rate:g} {self.unit}"
        if self.concurrency is not None:
            return f"{self.concurrency} users"
        return self.label

    @property
    def load(self) -> float:
        """The load axis: target rate, else concurrency, else the measured offered rate."""
        if self.rate is not None:
            return self.rate
        if self.concurrency is not None:
            return float(self.concurrency)
        return self.summary.offered_rps


def point_figures(
    k: int, pm: Mapping[str, Any], table: pa.Table, how: Judging, window: Window, problem: str | None
) -> PointFigures:
    """Point ``k``'s figures from its rows (``table``), over ``window`` (``points.point_window``;
    ``problem``: why it is not the window asked for, else None); ``pm``: its entry of run.json."""
    arr = pm.get("arrival", {})
    s = summarize(table, window, how.slo)
    att = gp = None
    if how.slo is not None and s.slo_met is not None:
        att = attainment_interval(s.slo_met, s.requests, 0.975)  # two one-sided 97.5% = a 95% interval
        good = round((s.goodput_rps or 0.0) * s.window_s) if s.window_s > 0 else 0
        gp = rate_ci(good, s.window_s)
    costs = {name: cost_per_million(s.output_tps, price, how.gpus or 1.0) for name, price in how.prices.items()}
    caveats = point_caveats(pm, s, how.lag_limit_ms, more=cache_caveats(table, pm))
    caveats += [Caveat("window_fallback", problem)] if problem else []
    closed = arr.get("kind") == "closed"
    return PointFigures(
        index=k,
        label=str(arr.get("label", "")),
        phase=str(pm.get("phase", "")),
        rate=arr.get("rate") if not closed else None,
        concurrency=arr.get("concurrency") if closed else None,
        summary=s,
        output_tps_ci=throughput_ci(table, s.window),
        gpus=how.gpus,
        attainment_ci=att,
        goodput_ci=gp,
        costs=costs,
        caveats=caveats,
        validity=Validity.of(caveats),
        sessions=session_summary(table, window),
    )
