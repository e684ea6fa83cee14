"""Capacity at SLO of one deployment, found in virtual time: a ramp, then a bisection.

Each point simulates one serving unit (``Deployment.engine``) for ``duration_s`` of virtual time at
one load, judges the requests scheduled after ``warmup_s`` by the SLO's per-request bounds
(``analysis.metrics.summarize``: a request cancelled at the drain's end, or never answered, is a
miss), and keeps the figures a plan shows. The load is a closed-loop concurrency (sessions in
flight per unit: what an agentic workload is sized by) or an open-loop rate (requests or sessions
per second per unit). The search doubles the load from ``start`` while attainment meets the
target, then bisects between the last load that met it and the first that did not, ``refine``
times; capacity is the highest load that met it. A pure function of its inputs (the simulation
is deterministic for a seed), so a plan is reproducible to the byte.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from loadgen.analysis.columns import Cols
from loadgen.analysis.latencies import Latencies
from loadgen.analysis.metrics import SLO, Summary, summarize
from loadgen.analysis.window import Window
from loadgen.plan.config import Deployment
from loadgen.plan.figures import Capacity, PointFigures, SearchSettings, fmt_load
from loadgen.schedule import Arrival
from loadgen.sim.virtual import simulate_point
from loadgen.sim.virtual.run import ORIGIN_NS  # virtual instants start here
from loadgen.workload.base import Workload

__all__ = ["measure", "find_capacity"]


def _pct(d: object, p: float) -> float:
    pct = getattr(d, "pct", None)
    if pct is None or not getattr(d, "n", 0):
        return math.nan
    return float(pct(p)[0])


def _misses(table: pa.Table, s: Summary, slo: SLO) -> dict[str, int]:
    """Requests scheduled in the window over each bound (censored ones count where they are over
    it already), and those never answered: why a point missed."""
    c = Cols.of(table)
    rows = s.window.contains(c.t_sched)
    lat = Latencies.of(c)
    out: dict[str, int] = {}
    for name, bound in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2e", slo.e2e_ms)):
        if bound is not None:
            exact = getattr(lat, name)[rows]
            cens = getattr(lat, f"{name}_c", None)
            over = int(np.count_nonzero(exact > bound))
            if cens is not None:
                over += int(np.count_nonzero(cens[rows] > bound))
            out[name] = over
    out["unanswered"] = s.failed + s.cancelled + s.not_sent
    return out


def measure(d: Deployment, workload: Workload, load: float, cfg: SearchSettings) -> PointFigures:
    """Simulate one unit of ``d`` at ``load`` (module doc) and judge it. A point whose window holds
    fewer than ``min_requests`` requests is run again over a window long enough to (at most
    ``max_duration_s``): at a 99 % target, 30 requests cannot tell 97 % from 100 %."""
    p = _measure(d, workload, load, cfg, cfg.duration_s)
    if 0 < p.requests < cfg.min_requests and cfg.duration_s < cfg.max_duration_s:
        longer = min(cfg.max_duration_s, cfg.duration_s * cfg.min_requests / p.requests * 1.1)
        p = _measure(d, workload, load, cfg, longer)
    return p


def _measure(d: Deployment, workload: Workload, load: float, cfg: SearchSettings, duration_s: float) -> PointFigures:
    if cfg.load == "concurrency":
        arrival = Arrival(kind="closed", concurrency=max(1, int(round(load))))
    else:
        arrival = Arrival(kind="poisson", rate=load)
    run = simulate_point(
        workload,
        arrival,
        d.engine(),
        run_id=f"plan-{d.label}",
        seed=cfg.seed,
        duration_s=cfg.warmup_s + duration_s,
        drain_s=cfg.drain_s,
    )
    start = ORIGIN_NS + int(cfg.warmup_s * 1e9)  # the point's own window: after warm-up, before the drain
    window = Window(start, start + int(duration_s * 1e9), ORIGIN_NS, cfg.warmup_s, how="warm-up to duration")
    s = summarize(run.records, window, cfg.slo)
    w = s.window_s if s.window_s > 0 else math.nan
    prompt = s.prompt_tokens_in_window
    return PointFigures(
        load=float(arrival.concurrency or 1) if arrival.kind == "closed" else load,
        requests=s.requests,
        attainment_pct=float(s.slo_attainment_pct if s.slo_attainment_pct is not None else 0.0),
        output_tps=s.output_tps,
        input_tps=prompt / w,
        cached_pct=100.0 * (s.cached_prompt_fraction or 0.0),
        per_user_tps=_pct(s.per_user_tps, 50),
        ttft_p99_ms=_pct(s.ttft, 99),
        tpot_p99_ms=_pct(s.tpot, 99),
        e2e_p99_ms=_pct(s.e2e, 99),
        misses=_misses(run.records, s, cfg.slo),
        preemptions=int(run.stats.get("num_preemptions_total", 0)),
        wall_s=run.wall_s,
        duration_s=duration_s,
    )


def _next(load: float, integer: bool, factor: float = 2.0) -> float:
    return float(max(load + 1, round(load * factor))) if integer else load * factor


def find_capacity(
    d: Deployment, workload: Workload, cfg: SearchSettings, *, on_point: Callable[[PointFigures], None] | None = None
) -> Capacity:
    """The ramp and bisection of the module doc; every point measured is kept, in order."""
    integer = cfg.load == "concurrency"
    out = Capacity()

    def probe(load: float) -> PointFigures:
        p = measure(d, workload, load, cfg)
        out.points.append(p)
        if on_point:
            on_point(p)
        return p

    good: PointFigures | None = None
    bad: PointFigures | None = None
    load = cfg.start
    while len(out.points) < cfg.max_points:
        p = probe(load)
        if p.met(cfg.target_pct):
            good = p
            load = _next(load, integer)
        else:
            bad = p
            break
    if good is None and bad is not None:  # the start was too much: try the floor, then bisect up from it
        floor = 1.0 if integer else bad.load / 16
        if floor < bad.load:
            p = probe(floor)
            if p.met(cfg.target_pct):
                good = p
    for _ in range(cfg.refine):
        if good is None or bad is None or len(out.points) >= cfg.max_points:
            break
        mid = math.sqrt(good.load * bad.load)
        mid = float(round(mid)) if integer else mid
        if (integer and not good.load < mid < bad.load) or (not integer and bad.load / good.load < 1.15):
            break
        p = probe(mid)
        if p.met(cfg.target_pct):
            good = p
        else:
            bad = p
    out.capacity = good
    if good is None:
        out.note = f"not met at the lowest load tried ({fmt_load(out.points[-1].load, cfg.load)})"
    elif bad is None:
        out.note = f"met at every load tried, up to {fmt_load(good.load, cfg.load)}: a lower bound"
    else:
        out.note = f"met at {fmt_load(good.load, cfg.load)}, missed at {fmt_load(bad.load, cfg.load)}"
    return out
