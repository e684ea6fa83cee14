"""A run folder as load points: per-point figures, the Pareto frontier, capacity at SLO.

``analyze_run`` is the one path from a run folder (a sweep, or a single run as a
one-point sweep) to the figures that the terminal, report.html, summary.json and
``loadgen compare`` show, so every view of a run agrees and any of them can be
re-rendered later from the records.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.compute as pc

from loadgen.analysis.attainment import Capacity, capacity_at_slo
from loadgen.analysis.metrics import SLO
from loadgen.analysis.pareto import frontier
from loadgen.analysis.pipeline import pipeline_figures, pipeline_view
from loadgen.analysis.point_figures import Judging, PointFigures, point_figures
from loadgen.analysis.saturation import first_saturated, observe
from loadgen.analysis.sessions import load_unit
from loadgen.analysis.validity import VALID, Caveat, Validity, interruption, run_caveats
from loadgen.analysis.window import MetricsError, Window, choose_window
from loadgen.records import read_records
from loadgen.run_folder import read_run_meta

__all__ = [
    "RunAnalysis",
    "analyze_run",
    "ArrivalJson",
    "PointJson",
    "SLOJson",
    "slo_from_json",
    "slo_to_json",
    "point_window",
]


@dataclass
class RunAnalysis:
    """A run folder judged as load points: each point's figures, the frontier, capacity, run warnings."""

    run_dir: Path
    meta: dict[str, Any]
    points: list[PointFigures]
    frontier: list[int]  # positions in ``points``
    slo: SLO | None
    slo_name: str
    target_pct: float
    gpus: float | None
    prices: dict[str, float]
    capacity: Capacity | None
    saturation: str | None
    caveats: list[Caveat]  # the run's own (each point's are on the point)
    table: pa.Table  # what the views chart: one row per request (a pipeline's: per user request)
    point_salt: bool | None
    search_end: str | None = None
    validity: Validity = VALID  # the run's own: its state, the simulator, carried caches
    records: pa.Table | None = None  # the records as written, where they differ from ``table`` (a pipeline's)

    @property
    def warnings(self) -> list[str]:  # the run's caveats' messages, for views that show words only
        return [c.message for c in self.caveats]

    @property
    def interruption(self) -> str | None:
        """The line to show first when the run, or a point of it, was interrupted (else None)."""
        return interruption(self.meta)

    def point_validity(self, p: PointFigures) -> Validity:
        """A point's validity together with its run's."""
        return p.validity.merged(self.validity)

    @property
    def trusted(self) -> list[PointFigures]:
        """The points a verdict may rest on: neither they nor their run are suspect (``few_samples``
        aside, which each verdict's own sample rule judges)."""
        return [p for p in self.points if not self.point_validity(p).withholding.suspect]

    @property
    def is_sweep(self) -> bool:
        return "points" in self.meta

    @property
    def load_unit(self) -> str:
        closed = all(p.concurrency is not None for p in self.points) and self.points
        return "concurrency" if closed else "offered req/s"

    def point_at(self, capacity_rate: float | None) -> PointFigures | None:
        return next((p for p in self.points if p.rate == capacity_rate), None) if capacity_rate else None


class SLOJson(TypedDict):
    """An SLO as run.json and summary.json hold it (bounds in ms; None: not checked)."""

    name: str
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    target_pct: float


class ArrivalJson(TypedDict, total=False):
    """A point's arrival in run.json: ``Arrival``'s fields and its label."""

    kind: str  # "constant" | "poisson" | "gamma" | "closed"
    rate: float | None
    cv: float | None
    concurrency: int | None
    label: str


class PointJson(TypedDict, total=False):
    """One entry of run.json's "points" (a sweep writes one per point; a single run is read as one)."""

    index: int
    phase: str  # "list" | "ramp" | "spread" | "bisect"; "run" for a single run
    why: str
    duration_s: float
    arrival: ArrivalJson
    warmup_s: float
    cooldown_s: float
    lag_limit_ms: float
    salt: str
    client: dict[str, Any]  # the client's own health figures (see validity.client_caveats)
    state: str  # "running" | "complete" | "interrupted" (run_folder.read_run_state's keys, per point)
    interrupted_reason: str
    prefix_reuse: dict[str, Any]  # what the workload's own reuse lets a cache serve (workload.reuse)


def slo_to_json(slo: SLO | None, name: str = "", target_pct: float = 99.0) -> SLOJson | None:
    if slo is None:
        return None
    return {
        "name": name,
        "ttft_ms": slo.ttft_ms,
        "tpot_ms": slo.tpot_ms,
        "e2e_ms": slo.e2e_ms,
        "target_pct": target_pct,
    }


def slo_from_json(d: SLOJson | None) -> tuple[SLO | None, str, float]:
    """(SLO, name, target %) from ``slo_to_json``'s shape; no SLO recorded gives (None, "", 99)."""
    if not d:
        return None, "", 99.0
    return (
        SLO(d.get("ttft_ms"), d.get("tpot_ms"), d.get("e2e_ms")),
        str(d.get("name") or ""),
        float(d.get("target_pct") or 99.0),
    )


def point_window(
    table: pa.Table, warmup_s: float = 0.0, cooldown_s: float = 0.0, verb: str = "measured"
) -> tuple[Window, str | None]:
    """The point's measurement window; when warm-up leaves none (too few requests), the whole
    span, with a warning that says so (``verb``: what was done with it; the gate "judged" it),
    rather than no figures at all. The reports, the sweep and the gate all choose windows here."""
    try:
        return choose_window(table, warmup_s=warmup_s, cooldown_s=cooldown_s), None
    except MetricsError as e:
        return choose_window(table), f"{e}; {verb} the whole point, warm-up included"


def _judging(
    meta: dict[str, Any],
    slo: SLO | None,
    slo_name: str | None,
    target_pct: float | None,
    gpus: float | None,
    prices: dict[str, float] | None,
    lag_limit_ms: float | None,
) -> Judging:
    sw = meta.get("sweep") or {}
    saved_slo, saved_name, saved_target = slo_from_json(sw.get("slo") or meta.get("slo"))
    return Judging(
        slo=slo if slo is not None else saved_slo,
        slo_name=slo_name if slo_name is not None else saved_name,
        target_pct=target_pct if target_pct is not None else saved_target,
        gpus=gpus if gpus is not None else sw.get("gpus"),
        prices=prices if prices is not None else dict(sw.get("prices") or {}),
        lag_limit_ms=lag_limit_ms if lag_limit_ms is not None else meta.get("settings", {}).get("lag_limit_ms", 10.0),
    )


def _point_meta(meta: dict[str, Any]) -> list[PointJson]:
    """run.json's points; a single run is one point over the whole table, with the run's settings."""
    if "points" in meta:
        return list(meta["points"])
    s = meta.get("settings", {})
    return [
        {
            "index": 0,
            "arrival": s.get("arrival", {}),
            "phase": "run",
            "warmup_s": s.get("warmup_s", 0.0),
            "cooldown_s": s.get("cooldown_s", 0.0),
            "client": meta.get("client", {}),
            "salt": meta.get("salt") or "",
            "prefix_reuse": meta.get("prefix_reuse") or {},
        }
    ]  # a single run's state is the run's: RunAnalysis.validity carries it


def analyze_run(
    run_dir: Path,
    *,
    slo: SLO | None = None,
    slo_name: str | None = None,
    target_pct: float | None = None,
    gpus: float | None = None,
    prices: dict[str, float] | None = None,
    lag_limit_ms: float | None = None,
    table: pa.Table | None = None,
) -> RunAnalysis:
    """Every point's figures from the records; options default to what run.json recorded."""
    run_dir = Path(run_dir)
    meta = read_run_meta(run_dir)
    how = _judging(meta, slo, slo_name, target_pct, gpus, prices, lag_limit_ms)
    records = table if table is not None else read_records(run_dir)
    points = _all_figures(meta, records, how)
    table = pipeline_view(records)  # what the views chart: a pipeline's user requests (analysis.pipeline)
    caveats = run_caveats(meta)
    sw = meta.get("sweep") or {}
    a = RunAnalysis(
        run_dir,
        meta,
        points,
        [],
        how.slo,
        how.slo_name,
        how.target_pct,
        how.gpus,
        how.prices,
        None,
        None,
        caveats,
        table,
        sw.get("point_salt") if sw else None,
        sw.get("search_end"),
        Validity.of(caveats),
        records if table is not records else None,
    )
    # the frontier, capacity and the saturation call rest on trusted points only; the suspect stay, marked
    trusted = a.trusted
    front = [trusted[i] for i in frontier([p.x for p in trusted], [p.y for p in trusted])]
    for p in front:
        p.on_frontier = True
    a.frontier = [next(i for i, q in enumerate(points) if q is p) for p in front]
    a.capacity = _capacity(a, how)
    a.saturation = _saturation([p for p in trusted if p.rate is not None], a)
    return a


def _all_figures(meta: dict[str, Any], table: pa.Table, how: Judging) -> list[PointFigures]:
    """Each point's figures from its own rows (a sweep's ``point`` column says whose)."""
    sweep = "points" in meta
    out = []
    for pm in _point_meta(meta):
        k = int(pm["index"])
        rows = table.filter(pc.equal(table.column("point"), pa.scalar(k))) if sweep else table
        view = pipeline_view(rows)
        window, problem = point_window(view, float(pm.get("warmup_s", 0.0)), float(pm.get("cooldown_s", 0.0)))
        p = point_figures(k, pm, view, how, window, problem)
        out.append(
            replace(p, unit=load_unit(meta.get("workload") or {}), pipeline=pipeline_figures(rows, p.summary.window))
        )
    return out


def _capacity(a: RunAnalysis, how: Judging) -> Capacity | None:
    """Capacity at SLO over the trusted open-loop points (None without an SLO or any open-loop
    point); the suspect points left out are named in its note."""
    open_pts = [p for p in a.points if p.rate is not None]
    if how.slo is None or not open_pts:
        return None
    used = [p for p in a.trusted if p.rate is not None]
    cap = capacity_at_slo([(p.load, p.summary.slo_met or 0, p.summary.requests) for p in used], how.target_pct)
    left = [p for p in open_pts if not any(p is q for q in used)]
    if not left:
        return cap
    why = "; ".join(f"{p.short_label}: {a.point_validity(p).withholding.why()}" for p in left)
    s = "s" if len(left) > 1 else ""
    return replace(
        cap, note=f"{cap.note}; left out {len(left)} suspect point{s} ({why})" if used else f"no trusted point ({why})"
    )


def _saturation(points: list[PointFigures], a: RunAnalysis) -> str | None:
    """The first point, by rising rate, where throughput stopped following the load; each point
    judged by its own validity (with the run's lag limit), as the sweep judged it while it ran."""
    obs = [
        observe(p.summary, p.rate, validity=a.point_validity(p))
        for p in sorted(points, key=lambda p: p.load)
        if p.rate is not None
    ]
    found = first_saturated(obs)
    return found[1] if found else None
