"""A sweep's views: the terminal tables, summary.json and report.html, from one analysis.

``render_sweep(run_dir)`` is what ``loadgen sweep`` calls at the end and what
``loadgen report`` calls for a run folder whose run.json has ``points``; both
give the same files from the same records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from loadgen.analysis.annotate import annotate_run
from loadgen.analysis.metrics import SLO, Summary, summary_to_json
from loadgen.analysis.pareto import cost_per_million, per_gpu
from loadgen.analysis.point_figures import PointFigures
from loadgen.analysis.points import RunAnalysis, analyze_run, slo_to_json
from loadgen.analysis.run_summary import SUMMARY_SCHEMA_VERSION
from loadgen.analysis.stats import Dist
from loadgen.analysis.validity import validity_json
from loadgen.report.html import report_banner, saturation_words, write_report
from loadgen.report.markup import fmt, fmt_bound
from loadgen.run_folder import write_json

__all__ = [
    "SweepReport",
    "render_sweep",
    "point_columns",
    "point_cells",
    "frontier_table",
    "points_table",
    "analysis_json",
]


def point_columns(gpus: float | None, prices: dict[str, float], slo: SLO | None) -> list[str]:
    cols = ["#", "load", "offered/s", "done/s", "out tok/s"]
    cols += ["/GPU"] if gpus else []
    cols += ["user tok/s p50", "p10", "TTFT p50", "TTFT p99", "TPOT p50", "E2E p99"]
    cols += ["goodput/s", "SLO %"] if slo else []
    cols += ["errors"] + [f"$/M {n}" for n in prices]
    return cols


def _p(d: Dist, p: float) -> str:
    """A percentile, ``≥ x`` where censored samples make it a lower bound."""
    return fmt_bound(d.pct(p)[0], d.lower_bound(p)) if d.n else "-"


def point_cells(
    index: int,
    label: str,
    s: Summary,
    gpus: float | None,
    prices: dict[str, float],
    slo: SLO | None,
    frontier: bool = False,
) -> list[str]:
    """One terminal row of a point, in the order of ``point_columns`` (ms for latencies; the
    HTML report has every percentile with its interval)."""
    cells = [f"{index}{' *' if frontier else ''}", label, fmt(s.offered_rps), fmt(s.completed_rps), fmt(s.output_tps)]
    cells += [fmt(per_gpu(s.output_tps, gpus))] if gpus else []
    cells += [_p(s.per_user_tps, 50), _p(s.per_user_tps, 10), _p(s.ttft, 50), _p(s.ttft, 99), _p(s.tpot, 50)]
    cells += [_p(s.e2e, 99)]
    cells += [fmt(s.goodput_rps), fmt(s.slo_attainment_pct)] if slo else []
    cells += [str(s.failed + s.cancelled)]
    cells += [fmt(cost_per_million(s.output_tps, price, gpus or 1.0)) for price in prices.values()]
    return cells


def points_table(
    a: RunAnalysis, title: str = "load points (* = Pareto frontier; latencies in ms; >= x: a lower bound)"
) -> Table:
    t = Table(title=title, show_edge=False)
    for c in point_columns(a.gpus, a.prices, a.slo):
        t.add_column(c, justify="left" if c == "load" else "right")
    for p in a.points:
        t.add_row(*point_cells(p.index, p.short_label, p.summary, a.gpus, a.prices, a.slo, p.on_frontier))
    return t


def frontier_table(a: RunAnalysis) -> Table:
    unit = "output tok/s per GPU" if a.gpus else "output tok/s"
    t = Table(title="Pareto frontier (x: per-user tok/s, median of 1/TPOT; y: " + unit + ")", show_edge=False)
    for c in ("point", "load", "per-user tok/s", unit, "95% CI", *[f"$/M {n}" for n in a.prices]):
        t.add_column(c, justify="left" if c == "load" else "right")
    for i in a.frontier:
        p = a.points[i]
        lo, hi = p.y_ci
        t.add_row(
            str(p.index),
            p.short_label,
            fmt(p.x),
            fmt(p.y),
            f"[{fmt(lo)}, {fmt(hi)}]",
            *[fmt(p.costs[n]) for n in a.prices],
        )
    return t


@dataclass
class SweepReport:
    analysis: RunAnalysis
    html: Path | None  # None: no report.html written (--no-report)

    def print(self, console: Console | None = None) -> None:
        console = console or Console()
        a = self.analysis
        for line in report_banner(a):  # first: an interrupted sweep or a suspect point is said before any figure
            console.print(Text(line, style="bold red"))
        console.print(points_table(a))
        console.print(frontier_table(a))
        for line in headline(a):
            console.print(line)
        for w in a.warnings + [f"{p.short_label}: {w}" for p in a.points for w in p.warnings]:
            console.print(Text("warning: " + w, style="yellow"))
        if self.html is not None:
            console.print(f"report: {self.html}")


def headline(a: RunAnalysis) -> list[str]:
    """The sweep's answer in a few lines: saturation, capacity at SLO, cost there."""
    value, why = saturation_words(a)
    out = [f"saturation: {why}" if a.saturation else f"saturation: {value} ({why})"]
    if a.slo is not None:
        c = a.capacity
        if c is None or c.rate is None:
            out.append(f"capacity at SLO ({a.slo}; {a.target_pct:g}%): none: {c.note if c else 'no open-loop point'}")
        else:
            upper = "" if math.isinf(c.upper) else f", confirmed miss at {fmt(c.upper)}"
            out.append(
                f"capacity at SLO ({a.slo}; {a.target_pct:g}% attainment): {fmt(c.rate)} req/s "
                f"({'confirmed' if c.confirmed else 'not confirmed'}{upper}): {c.note}"
            )
            at = a.point_at(c.rate)
            if at is not None:
                costs = ", ".join(f"{n} ${fmt(v)}/M" for n, v in at.costs.items())
                out.append(
                    f"goodput there: {fmt(at.summary.goodput_rps)} req/s, {fmt(at.y)} "
                    f"output tok/s{' per GPU' if a.gpus else ''}" + (f"; cost {costs}" if costs else "")
                )
    return out


def _num(v: float | None) -> float | int | None:
    """A number for JSON: null where NaN, infinite or missing (an infinite bound has its own flag)."""
    if v is None or isinstance(v, bool) or not math.isfinite(v):
        return None
    return v


def _interval(ci: tuple[float, float] | None, scale: float = 1.0) -> dict[str, Any] | None:
    """An interval as {lo, hi, lo_unbounded, hi_unbounded} (strict JSON: no "inf")."""
    if ci is None:
        return None
    lo, hi = ci
    return {
        "lo": _num(lo * scale),
        "hi": _num(hi * scale),
        "lo_unbounded": lo == -math.inf,
        "hi_unbounded": hi == math.inf,
    }


def _point_json(a: RunAnalysis, p: PointFigures) -> dict[str, Any]:
    s = p.summary
    slow10, slow1 = s.per_user_slow
    return {
        "index": p.index,
        "label": p.label,
        "phase": p.phase,
        "rate": p.rate,
        "concurrency": p.concurrency,
        "per_user_tps_p50": _num(p.x),
        "per_user_tps_p10": _num(slow10),
        "per_user_tps_p1": _num(slow1),
        "output_tps_ci": _interval(p.output_tps_ci),
        "output_tps_per_gpu": _num(p.y) if p.gpus else None,
        "attainment_pct_ci": _interval(p.attainment_ci, 100.0),
        "goodput_rps_ci": _interval(p.goodput_ci),
        "cost_per_million_output": {k: _num(v) for k, v in p.costs.items()},
        "on_frontier": p.on_frontier,
        "validity": validity_json(p.caveats, a.validity),
        "summary": summary_to_json(s),
    }


def analysis_json(a: RunAnalysis) -> dict[str, Any]:
    """A sweep's summary.json: strict JSON, units in the key names, every warning as {code, message}."""
    c = a.capacity
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "run_id": a.meta.get("run_id"),
        "endpoint": a.meta.get("endpoint"),
        "model": a.meta.get("model"),
        "sweep": True,
        "interruption": a.interruption,
        "validity": validity_json(a.caveats),
        "slo": slo_to_json(a.slo, a.slo_name, a.target_pct),
        "gpus": a.gpus,
        "prices": a.prices,
        "saturation": a.saturation,
        "frontier": [a.points[i].index for i in a.frontier],
        "capacity_at_slo": None
        if c is None
        else {
            "rate": c.rate,
            "lower": _num(c.lower),
            "upper": _num(c.upper),
            "upper_unbounded": c.upper == math.inf,
            "confirmed": c.confirmed,
            "target_pct": c.target_pct,
            "note": c.note,
        },
        "points": [_point_json(a, p) for p in a.points],
    }


def render_sweep(run_dir: Path, *, html: bool = True, **options: Any) -> SweepReport:
    """Recompute a sweep's figures from its records; write summary.json, and (``html``: not under
    ``--no-report``) report.html and pareto.svg/png.

    ``options`` override what run.json recorded (``slo``, ``target_pct``, ``gpus``, ``prices``, ``lag_limit_ms``).
    """
    a = analyze_run(Path(run_dir), **options)
    write_json(Path(run_dir) / "summary.json", analysis_json(a))
    # in_window and the figures' own columns in records.parquet, per point, for one-line queries
    records = a.records if a.records is not None else a.table  # per request as written
    annotate_run(Path(run_dir), {p.index: p.summary.window for p in a.points}, table=records)
    return SweepReport(a, write_report(Path(run_dir), analysis=a) if html else None)
