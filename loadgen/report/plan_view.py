"""A plan's views: the terminal ranking, plan.json and plan.html (overlaid Pareto curves, the axes).

Drawn with the sweep report's blocks: ``charts.pareto_chart`` (one series per deployment, its
frontier a line), ``charts.overlay_chart`` (SLO attainment against load; capacity against each
axis), ``markup.page`` and the report's stylesheet. Every figure is the deployment's (a unit's
times its replicas) unless the column says per GPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadgen.analysis.pareto import frontier
from loadgen.plan.figures import PlanEntry, PlanResult, PointFigures, Priced, SearchSettings, fmt_load
from loadgen.plan.prices import PricingModel
from loadgen.report.chart_style import to_svg
from loadgen.report.charts import Series, overlay_chart, pareto_chart
from loadgen.report.markup import esc, figure_html, fmt, page
from loadgen.run_folder import write_json

__all__ = ["PlanHeader", "ranking_table", "axes_table", "plan_json", "write_plan", "print_plan"]

COLUMNS = (
    "rank",
    "configuration",
    "GPUs",
    "capacity at SLO",
    "out tok/s /GPU",
    "in tok/s /GPU",
    "user tok/s",
    "TTFT p99 ms",
    "TPOT p99 ms",
    "$/GPU-h",
    "$/M in",
    "$/M out",
    "$/M blended",
    "out tok/s per MW",
    "$/M out, all cost on output",
    "prompt cached %",
)


class PlanHeader:
    """What the plan was asked: workload, SLO, pricing, how load was searched."""

    def __init__(self, workload: str, slo_text: str, pricing: PricingModel, cfg: SearchSettings, price_ratio: float):
        self.workload, self.slo_text, self.pricing, self.cfg, self.price_ratio = (
            workload,
            slo_text,
            pricing,
            cfg,
            price_ratio,
        )

    def lines(self) -> list[str]:
        c = self.cfg
        unit = "concurrent sessions per unit" if c.load == "concurrency" else "arrivals/s per unit"
        return [
            f"workload {self.workload}; SLO {self.slo_text}, {c.target_pct:g}% of requests",
            f"pricing {self.pricing.label} ({self.pricing.kind}); $/M split so that output = "
            f"{self.price_ratio:g} x input",
            f"each point: {c.warmup_s:g} s warm-up + {c.duration_s:g} s measured in virtual time; load: {unit}",
            f"prices: {self.pricing.statement}",
        ]


def _row(rank: str, e: PlanEntry, at: Priced | None, load_kind: str) -> list[str]:
    if at is None:
        why = e.search.note
        p = min(e.search.points, key=lambda q: q.load) if e.search.points else None
        if p is not None and p.requests:
            why += f"; there {p.attainment_pct:.1f}% met it (most misses: {_worst(p)})"
        return [rank, e.label, str(e.gpus), why] + ["-"] * (len(COLUMNS) - 4)
    p = at.point
    cap = fmt_load(at.capacity, load_kind)
    return [
        rank,
        e.label,
        str(e.gpus),
        cap,
        fmt(at.output_tps_per_gpu),
        fmt(at.input_tps_per_gpu),
        fmt(p.per_user_tps),
        fmt(p.ttft_p99_ms),
        fmt(p.tpot_p99_ms),
        fmt(at.usd_per_gpu_hour),
        fmt(at.costs.input),
        fmt(at.costs.output),
        fmt(at.costs.blended),
        fmt(at.tokens_per_mw),
        fmt(at.costs.output_only),
        fmt(p.cached_pct),
    ]


def ranking_rows(result: PlanResult, load_kind: str) -> list[list[str]]:
    rows, k = [], 0
    for e in result.entries:
        k += e.at_slo is not None
        rows.append(_row(str(k) if e.at_slo is not None else "-", e, e.at_slo, load_kind))
    return rows


TERMINAL = (
    "rank",
    "configuration",
    "GPUs",
    "capacity at SLO",
    "out tok/s /GPU",
    "in tok/s /GPU",
    "user tok/s",
    "$/M in",
    "$/M out",
    "$/M blended",
    "out tok/s per MW",
)


def _worst(p: PointFigures) -> str:
    return max(p.misses, key=lambda k: p.misses[k]) if p.misses else "-"


def ranking_table(result: PlanResult, load_kind: str) -> Table:
    """The ranking, the columns that fit a terminal (plan.html has them all); a configuration that
    never met the SLO says why below the table (``unmet_lines``)."""
    t = Table(title="ranked by $/M blended tokens at the SLO (figures at capacity, whole deployment)", show_edge=False)
    keep = [COLUMNS.index(c) for c in TERMINAL]
    for c in TERMINAL:
        t.add_column(c, justify="left" if c == "configuration" else "right", no_wrap=c == "configuration")
    for e, r in zip(result.entries, ranking_rows(result, load_kind), strict=True):
        t.add_row(*[r[i] for i in keep] if e.at_slo else [r[0], r[1], r[2], "none (below)"] + ["-"] * (len(keep) - 4))
    return t


def unmet_lines(result: PlanResult) -> list[str]:
    out = []
    for e in result.entries:
        if e.at_slo is None:
            p = min(e.search.points, key=lambda q: q.load) if e.search.points else None
            why = e.search.note
            if p is not None and p.requests:
                why += f"; there {p.attainment_pct:.1f}% met the SLO, most misses by {_worst(p)}"
            out.append(f"{e.label}: no capacity at the SLO: {why}")
    return out


def axis_rows(result: PlanResult, load_kind: str) -> list[list[str]]:
    rows = []
    for a in result.axes:
        for e in a.entries:
            at = e.at_slo
            rows.append(
                [
                    a.axis.replace("_", "-"),
                    f"{a.value:g}",
                    e.label,
                    fmt_load(at.capacity, load_kind) if at else "none",
                    fmt(at.output_tps_per_gpu) if at else "-",
                    fmt(at.input_tps_per_gpu) if at else "-",
                    fmt(at.costs.blended) if at else "-",
                ]
            )
    return rows


AXIS_COLUMNS = ("axis", "value", "configuration", "capacity at SLO", "out tok/s /GPU", "in tok/s /GPU", "$/M blended")


def axes_table(result: PlanResult, load_kind: str) -> Table:
    t = Table(title="capacity at SLO along the axes (one axis varied at a time)", show_edge=False)
    for c in AXIS_COLUMNS:
        t.add_column(c, justify="left" if c in ("axis", "configuration") else "right")
    for r in axis_rows(result, load_kind):
        t.add_row(*r)
    return t


def print_plan(result: PlanResult, header: PlanHeader, html: Path, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        console = Console(width=max(console.width, 150)) if not console.is_terminal else console
    for line in header.lines():
        console.print(line, highlight=False)
    console.print(ranking_table(result, header.cfg.load))
    for line in unmet_lines(result):
        console.print(line, style="yellow", highlight=False)
    if result.axes:
        console.print(axes_table(result, header.cfg.load))
    best = next((e for e in result.entries if e.at_slo is not None), None)
    if best is None:
        console.print(
            "no configuration meets the SLO at any load tried: see the reasons in the table", style="bold red"
        )
    else:
        at = best.at_slo
        assert at is not None
        console.print(
            f"cheapest at the SLO: {best.label}, ${fmt(at.costs.blended)}/M tokens blended "
            f"(${fmt(at.costs.output)}/M output) at {fmt_load(at.capacity, header.cfg.load)}",
            highlight=False,
        )
    console.print(f"{result.points} points simulated in {result.wall_s:.1f} s; report: {html}", highlight=False)


def _num(v: float) -> float | None:
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def _priced_json(q: Priced) -> dict[str, Any]:
    p = q.point
    return {
        "load": p.load,
        "capacity": q.capacity,
        "requests": p.requests,
        "attainment_pct": _num(p.attainment_pct),
        "output_tps": _num(q.output_tps),
        "input_tps": _num(q.input_tps),
        "output_tps_per_gpu": _num(q.output_tps_per_gpu),
        "input_tps_per_gpu": _num(q.input_tps_per_gpu),
        "cached_prompt_pct": _num(p.cached_pct),
        "per_user_tps_p50": _num(p.per_user_tps),
        "ttft_p99_ms": _num(p.ttft_p99_ms),
        "tpot_p99_ms": _num(p.tpot_p99_ms),
        "e2e_p99_ms": _num(p.e2e_p99_ms),
        "misses": p.misses,
        "preemptions": p.preemptions,
        "measured_s": p.duration_s,
        "wall_s": round(p.wall_s, 3),
        "usd_per_gpu_hour": q.usd_per_gpu_hour,
        "usd_per_million": {
            "input": _num(q.costs.input),
            "output": _num(q.costs.output),
            "blended": _num(q.costs.blended),
            "output_only": _num(q.costs.output_only),
        },
        "output_tps_per_mw": _num(q.tokens_per_mw),
    }


def _entry_json(e: PlanEntry) -> dict[str, Any]:
    return {
        "deployment": e.describe,
        "capacity_at_slo": _priced_json(e.at_slo) if e.at_slo else None,
        "note": e.search.note,
        "points": [_priced_json(q) for q in e.priced],
    }


def plan_json(result: PlanResult, header: PlanHeader) -> dict[str, Any]:
    c = header.cfg
    return {
        "plan": True,
        "workload": header.workload,
        "slo": {"text": header.slo_text, "target_pct": c.target_pct},
        "pricing": {"label": header.pricing.label, "kind": header.pricing.kind, "statement": header.pricing.statement},
        "price_ratio": header.price_ratio,
        "load": c.load,
        "point": {"warmup_s": c.warmup_s, "duration_s": c.duration_s, "drain_s": c.drain_s, "seed": c.seed},
        "ranking": [_entry_json(e) for e in result.entries],
        "axes": [
            {"axis": a.axis, "value": a.value, "entries": [_entry_json(e) for e in a.entries]} for a in result.axes
        ],
        "points_simulated": result.points,
        "wall_s": round(result.wall_s, 2),
    }


def _pareto_svg(result: PlanResult) -> str:
    series = []
    for e in result.entries:
        xs = [q.point.per_user_tps for q in e.priced]
        ys = [q.output_tps_per_gpu for q in e.priced]
        series.append(Series(e.label, xs, ys, frontier(xs, ys)))
    return to_svg(pareto_chart(series, y_label="output tok/s per GPU"))


def _attainment_svg(result: PlanResult, load_kind: str) -> str:
    lines: dict[str, tuple[list[float], list[float], list[tuple[float, float]]]] = {}
    for e in result.entries:
        pts = sorted(e.priced, key=lambda q: q.capacity)
        lines[e.label] = ([q.capacity for q in pts], [q.point.attainment_pct for q in pts], [])
    label = "concurrent sessions" if load_kind == "concurrency" else "arrivals/s"
    return to_svg(overlay_chart(lines, x_label=f"load ({label}, whole deployment)", y_label="SLO attainment %"))


def _axes_svgs(result: PlanResult, load_kind: str) -> list[tuple[str, str]]:
    out = []
    for axis in dict.fromkeys(a.axis for a in result.axes):
        lines: dict[str, tuple[list[float], list[float], list[tuple[float, float]]]] = {}
        for a in (a for a in result.axes if a.axis == axis):
            for e in a.entries:
                xs, ys, _ = lines.setdefault(e.label, ([], [], []))
                xs.append(a.value)
                ys.append(e.at_slo.capacity if e.at_slo else 0.0)
        unit = "concurrent sessions" if load_kind == "concurrency" else "arrivals/s"
        svg = to_svg(overlay_chart(lines, x_label=axis.replace("_", " "), y_label=f"capacity at SLO ({unit})"))
        out.append((axis, svg))
    return out


def _table_html(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    head = "".join(f'<th class="{"l" if c == "configuration" else ""}">{esc(c)}</th>' for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if i == 1 else ""}">{esc(v)}</td>' for i, v in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f'<div class="scroll"><table class="points"><tr>{head}</tr>{body}</table></div>'


def render_plan_html(result: PlanResult, header: PlanHeader) -> str:
    kind = header.cfg.load
    parts = ["<h1>loadgen plan</h1>"] + [f'<p class="sub">{esc(line)}</p>' for line in header.lines()]
    parts.append("<h2>Ranking</h2>" + _table_html(COLUMNS, ranking_rows(result, kind)))
    parts.append(
        "<h2>Throughput against interactivity</h2>"
        + figure_html(
            "pareto",
            _pareto_svg(result),
            "Every simulated point of every configuration: output tok/s per GPU against per-user tok/s "
            "(median of 1/TPOT); each configuration's frontier is its line.",
        )
    )
    parts.append(
        "<h2>SLO attainment against load</h2>"
        + figure_html("attainment", _attainment_svg(result, kind), "Capacity at SLO is the highest load at the target.")
    )
    if result.axes:
        parts.append("<h2>Along the axes</h2>" + _table_html(AXIS_COLUMNS, axis_rows(result, kind)))
        for axis, svg in _axes_svgs(result, kind):
            parts.append(figure_html(f"axis-{axis}", svg, f"Capacity at SLO against {esc(axis.replace('_', ' '))}."))
    parts.append(
        "<h2>Method</h2><p>Each configuration is simulated in virtual time (the built-in engine model: continuous "
        "batching, KV and prefix cache, preemption, a roofline step cost; docs/simulator.md) as one serving unit "
        "at its share of the load; the deployment's figures are the unit's times its replicas. "
        "$/M tokens = $/GPU-hour x GPUs / tokens per hour x 10^6; the input/output split charges output "
        f"{header.price_ratio:g} x input, so the two add up to the hour's cost. Tokens per MW use the pricing "
        "model's facility power (ownership: GPU and node power x PUE) or, for rentals, the GPU's board power.</p>"
    )
    return page("loadgen plan", "\n".join(parts))


def write_plan(out: Path, result: PlanResult, header: PlanHeader) -> Path:
    """plan.json and plan.html into ``out``; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "plan.json", plan_json(result, header))
    html = out / "plan.html"
    html.write_text(render_plan_html(result, header), encoding="utf-8")
    return html
