"""A pipeline run's stage breakdown (``analysis.pipeline``), for the terminal and report.html.

The run's ordinary tables are the user requests' (a pipeline each: TTFT from the user request's
instant, E2E to the answer's end); these say where that time went: each stage's latency, its share
of the completed pipelines' E2E, the client's wait before sending it, its failures, and the pooled
stages' inputs per second.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table

from loadgen.analysis.pipeline import PipelineFigures, StageFigures
from loadgen.analysis.point_figures import PointFigures
from loadgen.report.markup import esc

__all__ = ["STAGES_CAPTION", "pipeline_line", "stage_lines", "stage_table", "stage_columns"]

STAGES_CAPTION = (
    "A user request is a pipeline of stage requests sent one after another (embed the question, rerank "
    "the candidates, generate); the tables above are the user requests' (TTFT and E2E from the user "
    "request's instant). Per stage: latency of its ok requests (from its own instant, the previous "
    "stage's end, so a completed pipeline's stages add up to its E2E) and its share of the completed "
    "pipelines' E2E."
)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _failed(f: PipelineFigures) -> str:
    return ", ".join(f"{n:,} at {stage}" for stage, n in f["failed_at"].items()) or "none"


def pipeline_line(f: PipelineFigures | None) -> str:
    """``pipelines: 120 in the window, 118 completed (E2E p50 ..., p99 ...); stopped: 2 at rerank``."""
    if f is None:
        return ""
    e2e = f" (E2E p50 {_ms(f['e2e_p50_ms'])} ms, p99 {_ms(f['e2e_p99_ms'])} ms)" if f["completed"] else ""
    return f"pipelines: {f['pipelines']:,} in the window, {f['completed']:,} completed{e2e}; stopped: {_failed(f)}"


def _extra(s: StageFigures) -> str:
    if s["inputs_per_s"] is not None:
        tok = f", {s['input_tokens_per_s']:,.0f} tok/s" if s["input_tokens_per_s"] is not None else ""
        return f"{s['inputs_per_s']:,.1f} inputs/s{tok}"
    if s["ttft_p50_ms"] is not None:
        return f"own TTFT p50 {_ms(s['ttft_p50_ms'])}, p99 {_ms(s['ttft_p99_ms'])} ms"
    return ""


def stage_table(f: PipelineFigures) -> Table:
    t = Table(title="pipeline stages (ms, ok requests, from each stage's own instant)", show_edge=False)
    for col in ("stage", "ok / sent", "failed", "p50", "p99", "mean", "share of E2E %", "wait p99"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for s in f["stages"]:
        t.add_row(
            s["stage"],
            f"{s['ok']:,} / {s['requests'] - s['not_sent']:,}",
            f"{s['failed']:,}",
            _ms(s["latency_p50_ms"]),
            _ms(s["latency_p99_ms"]),
            _ms(s["latency_mean_ms"]),
            _pct(s["share_of_e2e"]),
            _ms(s["wait_p99_ms"]),
        )
    return t


def stage_lines(f: PipelineFigures) -> list[str]:
    """What each stage did besides its latency: a pooled stage's inputs/s, the generating stage's own TTFT."""
    return [f"  {s['stage']} ({s['api']} at {s['endpoint']}, {s['model']}): {_extra(s) or '-'}" for s in f["stages"]]


Cell = Callable[[PointFigures], str]


def _stages(p: PointFigures) -> list[StageFigures]:
    return p.pipeline["stages"] if p.pipeline is not None else []


def stage_columns(points: list[PointFigures]) -> list[tuple[str, Cell]] | None:
    """report.html's per-point stage columns (None unless a point is a pipeline's)."""
    names: list[str] = []
    for p in points:
        for s in _stages(p):
            if s["stage"] not in names:
                names.append(s["stage"])
    if not names:
        return None

    def of(name: str, value: Callable[[StageFigures], str]) -> Cell:
        def cell(p: PointFigures) -> str:
            s = next((s for s in _stages(p) if s["stage"] == name), None)
            return "-" if s is None else esc(value(s))

        return cell

    def whole(value: Callable[[PipelineFigures], str]) -> Cell:
        return lambda p: "-" if p.pipeline is None else esc(value(p.pipeline))

    cols: list[tuple[str, Cell]] = [
        ("pipelines", whole(lambda f: f"{f['pipelines']:,}")),
        ("completed", whole(lambda f: f"{f['completed']:,}")),
        ("stopped at", whole(_failed)),
    ]
    for name in names:
        cols += [
            (f"{name} p50", of(name, lambda s: _ms(s["latency_p50_ms"]))),
            (f"{name} p99", of(name, lambda s: _ms(s["latency_p99_ms"]))),
            (f"{name} share %", of(name, lambda s: _pct(s["share_of_e2e"]))),
        ]
    return cols
