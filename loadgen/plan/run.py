"""A plan: every deployment's capacity at the SLO in virtual time, priced, ranked, and along the axes.

``run_plan`` searches each deployment's capacity (``plan.search``), prices its operating point
with the pricing model (``analysis.cost``: $/GPU-hour x GPUs over the unit's input and output
tokens, times the replicas), and ranks the deployments that meet the SLO by cost per million
tokens there; those that never meet it follow, with the bound that failed. With axes
(``--input-tokens``, ``--output-tokens``, ``--prefix-reuse``) it runs the same search for each
value of each axis, the others left as the workload has them, so the length where capacity
collapses is visible. Sessions are built once and shared by every point (``SessionCache``): the
same traffic, byte for byte, for every deployment.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from loadgen.analysis.cost import token_costs, tokens_per_mw
from loadgen.plan.config import Deployment
from loadgen.plan.figures import AxisResult, PlanEntry, PlanResult, PointFigures, Priced, SearchSettings
from loadgen.plan.prices import PricingModel
from loadgen.plan.search import find_capacity
from loadgen.sim.profiles import gpu as load_gpu
from loadgen.workload.base import Workload
from loadgen.workload.session import Session

__all__ = ["SessionCache", "run_plan", "price_point", "rank", "AXES"]

AXES = ("input_tokens", "output_tokens", "prefix_reuse")


class SessionCache:
    """A workload whose sessions are built once (they are pure functions of spec, seed and index)."""

    def __init__(self, inner: Workload) -> None:
        self.inner = inner
        self._sessions: dict[int, Session] = {}

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def size(self) -> int | None:
        return self.inner.size

    def session(self, i: int) -> Session:
        s = self._sessions.get(i)
        if s is None:
            s = self._sessions[i] = self.inner.session(i)
        return s

    def offsets_ns(self) -> npt.NDArray[np.int64] | None:
        return self.inner.offsets_ns()

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


def price_point(d: Deployment, p: PointFigures, pricing: PricingModel, price_ratio: float) -> Priced:
    cm = pricing.for_gpu(d.gpu)
    usd = cm.gpu_hour_usd()
    out, inp = p.output_tps * d.replicas, p.input_tps * d.replicas
    kw = cm.facility_kw_per_gpu()
    if kw is None:  # rental: the GPU's board power, no PUE (said in the report)
        tdp = load_gpu(d.gpu).tdp_w
        kw = tdp / 1000.0 if tdp else None
    mw = tokens_per_mw(out, d.gpus, kw) if kw else float("nan")
    return Priced(
        p,
        d.gpus,
        d.replicas,
        usd,
        token_costs(usd, d.gpus, inp, out, price_ratio),
        out,
        inp,
        out / d.gpus,
        inp / d.gpus,
        mw,
        p.load * d.replicas,
    )


def _plan_one(
    d: Deployment,
    workload: Workload,
    cfg: SearchSettings,
    pricing: PricingModel,
    price_ratio: float,
    on_point: Callable[[Deployment, PointFigures], None] | None,
) -> PlanEntry:
    found = find_capacity(d, workload, cfg, on_point=(lambda p: on_point(d, p)) if on_point else None)
    priced = [price_point(d, p, pricing, price_ratio) for p in found.points]
    at = next((q for q in priced if found.capacity is not None and q.point is found.capacity), None)
    return PlanEntry(d.label, d.gpus, d.describe(), found, priced, at)


def rank(entries: list[PlanEntry], by: str = "blended") -> list[PlanEntry]:
    def key(e: PlanEntry) -> tuple[int, float, str]:
        if e.at_slo is None:
            return (1, 0.0, e.label)
        return (0, getattr(e.at_slo.costs, by), e.label)

    return sorted(entries, key=key)


def run_plan(
    deployments: list[Deployment],
    make_workload: Callable[[dict[str, Any]], Workload],
    cfg: SearchSettings,
    pricing: PricingModel,
    *,
    price_ratio: float = 4.0,
    rank_by: str = "blended",
    axes: dict[str, list[float]] | None = None,
    on_point: Callable[[Deployment, PointFigures], None] | None = None,
) -> PlanResult:
    """Search, price and rank every deployment on the workload (``make_workload({})``) and, per axis
    value, on the workload with that override (``make_workload({"input_tokens": 8192})``)."""
    t0 = time.perf_counter()
    for d in deployments:
        pricing.for_gpu(d.gpu)  # a missing price fails before anything is simulated
    base = SessionCache(make_workload({}))
    entries = rank([_plan_one(d, base, cfg, pricing, price_ratio, on_point) for d in deployments], rank_by)
    out = PlanResult(entries)
    for axis, values in (axes or {}).items():
        for v in values:
            w = SessionCache(make_workload({axis: v}))
            res = [_plan_one(d, w, cfg, pricing, price_ratio, on_point) for d in deployments]
            out.axes.append(AxisResult(axis, v, res))
    out.wall_s = time.perf_counter() - t0
    out.points = sum(len(e.search.points) for e in entries) + sum(
        len(e.search.points) for a in out.axes for e in a.entries
    )
    return out
