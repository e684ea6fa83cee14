"""report.html's load-point tables: throughput, outcomes and SLO, latency, users and tokens.

One wide table of every figure would scroll sideways on a laptop screen, so the points
are shown in several narrower tables, one row per load point in each, that fit a
1280-px window (cells wrap; nothing scrolls). A percentile that censored samples make a
lower bound is shown ``≥ x`` (``markup.pct_html``); an open interval end "unbounded".
Columns that only some endpoints fill (TTFT to the first visible content, cached
prompt tokens, reasoning tokens) appear only when a point has them, and so does the tool-call
table (a run whose requests offered tools: ``analysis.tool_use``). ITL's per-chunk token
source sits beside ITL (``analysis.stream_shape``); the client's own health (CPU, event-loop
lag, read-stamp lateness: run.json's "client" block) is a table of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from loadgen.analysis.point_figures import PointFigures
from loadgen.analysis.points import RunAnalysis
from loadgen.analysis.pooled import PooledFigures, pooled_figures
from loadgen.analysis.stream_shape import itl_approximate, source_shares_text
from loadgen.analysis.tool_use import ToolUse, tool_use
from loadgen.report.markup import esc, fmt, fmt_ci, pct_html
from loadgen.report.pipeline_view import STAGES_CAPTION, stage_columns
from loadgen.workload.pooled import POOLED_APIS

__all__ = ["points_section", "LATENCY_CAPTION", "HEALTH_CAPTION", "TOOLS_CAPTION"]

LATENCY_CAPTION = (
    "Latencies in ms, from each request's intended send time; p99 with its 95% interval. "
    "≥ x: a lower bound; requests never answered count at their wait (censored), so the true "
    "value may be higher; an interval end that the samples cannot bound is \u201cunbounded\u201d. "
    "ITL per-chunk tokens: where each chunk's token count came from (the endpoint's usage per chunk, a "
    "tokenizer, one per chunk, or the final usage spread evenly over the chunks, which makes ITL "
    "approximate when chunks carry several tokens)."
)

Cell = Callable[[PointFigures], str]


def _table(a: RunAnalysis, columns: Sequence[tuple[str, Cell]], table_id: str) -> str:
    """One table of the points: ``#`` and load first, then ``columns`` (header, cell of a point)."""
    cols: list[tuple[str, Cell]] = [("#", lambda p: str(p.index)), ("load", lambda p: esc(p.short_label))]
    cols += columns
    th = "".join(f'<th class="l">{esc(h)}</th>' if i == 1 else f"<th>{esc(h)}</th>" for i, (h, _) in enumerate(cols))
    rows = []
    for p in a.points:
        marks = [c for c in ("frontier" if p.on_frontier else "", "suspect" if _suspect(a, p) else "") if c]
        cls = f' class="{" ".join(marks)}"' if marks else ""
        tds = "".join(f'<td class="l">{f(p)}</td>' if i == 1 else f"<td>{f(p)}</td>" for i, (_, f) in enumerate(cols))
        rows.append(f"<tr{cls}>{tds}</tr>")
    return f'<table class="points" id="{table_id}"><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _suspect(a: RunAnalysis, p: PointFigures) -> bool:
    return a.point_validity(p).withholding.suspect


def _throughput(a: RunAnalysis) -> list[tuple[str, Cell]]:
    cols: list[tuple[str, Cell]] = [
        ("phase", lambda p: esc(p.phase)),
        ("offered req/s", lambda p: esc(fmt(p.summary.offered_rps))),
        ("sent req/s", lambda p: esc(fmt(p.summary.sent_rps))),
        ("completed req/s", lambda p: esc(fmt(p.summary.completed_rps))),
        ("output tok/s [95% CI]", lambda p: fmt_ci(p.summary.output_tps, p.output_tps_ci)),
    ]
    if a.gpus is not None:
        cols.append(("output tok/s per GPU [CI]", lambda p: fmt_ci(p.y, p.y_ci)))
    cols.append(("total tok/s", lambda p: esc(fmt(p.summary.total_tps))))
    cols += [(f"$/M output tokens ({name})", _cost(name)) for name in a.prices]
    return cols


def _cost(name: str) -> Cell:
    return lambda p: esc(fmt(p.costs.get(name)))


def _outcomes(a: RunAnalysis) -> list[tuple[str, Cell]]:
    cols: list[tuple[str, Cell]] = []
    if a.slo is not None:
        cols += [
            ("goodput req/s [CI]", lambda p: fmt_ci(p.summary.goodput_rps, p.goodput_ci)),
            ("goodput output tok/s", lambda p: esc(fmt(p.summary.goodput_tps))),
            ("SLO attainment % [CI]", _attainment),
        ]
    cols += [
        ("requests", lambda p: f"{p.summary.requests:,}"),
        ("ok", lambda p: f"{p.summary.ok:,}"),
        ("failed", lambda p: f"{p.summary.failed:,}"),
        ("cancelled", lambda p: f"{p.summary.cancelled:,}"),
    ]
    if any(p.summary.not_sent for p in a.points):
        cols.append(("not sent", lambda p: f"{p.summary.not_sent:,}"))
    return cols


def _attainment(p: PointFigures) -> str:
    att = p.attainment_ci
    return fmt_ci(p.summary.slo_attainment_pct, (att[0] * 100, att[1] * 100) if att else None)


def _latency() -> list[tuple[str, Cell]]:
    return [
        ("TTFT p50", lambda p: pct_html(p.summary.ttft, 50)),
        ("TTFT p99 [CI]", lambda p: pct_html(p.summary.ttft, 99, ci=True, censored=True)),
        ("TPOT p50", lambda p: pct_html(p.summary.tpot, 50)),
        ("TPOT p99", lambda p: pct_html(p.summary.tpot, 99)),
        ("ITL p50", lambda p: pct_html(p.summary.itl, 50)),
        ("ITL p99", lambda p: pct_html(p.summary.itl, 99)),
        ("ITL per-chunk tokens", _itl_source),
        ("E2E p50", lambda p: pct_html(p.summary.e2e, 50)),
        ("E2E p99 [CI]", lambda p: pct_html(p.summary.e2e, 99, ci=True, censored=True)),
        ("schedule lag p99", lambda p: pct_html(p.summary.schedule_lag, 99)),
    ]


def _itl_source(p: PointFigures) -> str:
    """Where ITL's per-chunk token counts came from, and ``approximate`` when spread usage makes it so."""
    shares = source_shares_text(p.summary)
    if not shares:
        return "-"
    note = (
        f" (≈{p.summary.spread_tokens_per_chunk:.1f} tok/chunk: ITL approximate)" if itl_approximate(p.summary) else ""
    )
    return esc(shares + note)


def _client_of(a: RunAnalysis, p: PointFigures) -> dict[str, Any]:
    """The point's run.json "client" block (a single run's is the run's)."""
    if "points" not in a.meta:
        return dict(a.meta.get("client") or {})
    entry: dict[str, Any] = next((e for e in a.meta["points"] if e.get("index") == p.index), {})
    return dict(entry.get("client") or {})


def _health_cell(a: RunAnalysis, key: str, scale: float) -> Cell:
    def cell(p: PointFigures) -> str:
        v = _client_of(a, p).get(key)
        return esc(fmt(scale * v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"

    return cell


_HEALTH = (
    ("client CPU % of a core", "cpu_utilisation", 100.0),
    ("event-loop lag p99 ms", "loop_lag_p99_ms", 1.0),
    ("event-loop lag max ms", "loop_lag_max_ms", 1.0),
    ("read stamps late p99 ms (est.)", "read_lateness_p99_ms", 1.0),
)
HEALTH_CAPTION = (
    "What the client measured about itself over each point: its CPU share, how late a probe timer of its "
    "event loop ran (a loop-lag p99 above --lag-limit-ms marks the point suspect: client_loop_lag), and an "
    "estimate of how late a read's arrival was stamped."
)


def _health(a: RunAnalysis) -> list[tuple[str, Cell]] | None:
    """The client-health columns that some point has a figure for (None when none has any)."""
    cols = [(h, _health_cell(a, k, scale)) for h, k, scale in _HEALTH if any(k in _client_of(a, p) for p in a.points)]
    return cols or None


def _users_and_tokens(a: RunAnalysis) -> list[tuple[str, Cell]]:
    cols: list[tuple[str, Cell]] = [
        ("per-user tok/s p50", lambda p: pct_html(p.summary.per_user_tps, 50)),
        ("p10 (slow)", lambda p: pct_html(p.summary.per_user_tps, 10)),
        ("p1 (slowest)", lambda p: pct_html(p.summary.per_user_tps, 1)),
    ]
    if any(p.summary.content_after_first for p in a.points):
        cols += [
            ("TTFT to content p50 ms", lambda p: pct_html(p.summary.ttft_content, 50)),
            ("TTFT to content p99 ms", lambda p: pct_html(p.summary.ttft_content, 99, censored=True)),
        ]
    if any(p.summary.cached_reported for p in a.points):
        cols += [
            ("cached prompt %", _cached_pct),
            ("TTFT p50 ms cache hit / miss", _cached_split),
        ]
    if any(p.summary.reasoning_reported for p in a.points):
        cols += [
            ("reasoning tokens", lambda p: f"{p.summary.reasoning_tokens:,}" if p.summary.reasoning_reported else "-"),
            ("reasoning % of output", lambda p: esc(fmt(p.summary.reasoning_output_pct))),
        ]
    return cols


def _cached_pct(p: PointFigures) -> str:
    f = p.summary.cached_prompt_fraction
    return esc(fmt(100.0 * f)) if f is not None else "-"


def _cached_split(p: PointFigures) -> str:
    hit, miss = p.summary.ttft_ms_cached, p.summary.ttft_ms_uncached
    if hit is None or miss is None:
        return "-"
    return f"{pct_html(hit, 50)} / {pct_html(miss, 50)}"


TOOLS_CAPTION = (
    "Of the ok answers to requests that offered tools: how many called one (the others did not, and their "
    "session went on with the tool result as a user message), tool calls per answer, and the share of output "
    "tokens that were tool-call arguments (the calling answers' output less their reported reasoning: exact "
    "when an answer that calls says nothing else)."
)


def _tools(a: RunAnalysis) -> list[tuple[str, Cell]] | None:
    """The tool-call columns (None when no point's requests offered tools)."""
    sweep = "points" in a.meta
    figures = {p.index: tool_use(a.table, p.summary.window, p.index if sweep else None) for p in a.points}
    if all(tu is None for tu in figures.values()):
        return None

    def cell(f: Callable[[ToolUse], str]) -> Cell:
        return lambda p: "-" if (tu := figures[p.index]) is None else f(tu)

    return [
        ("answers", cell(lambda tu: f"{tu.answers:,}")),
        ("called a tool", cell(lambda tu: f"{tu.called:,} ({esc(fmt(tu.called_pct))}%)")),
        ("did not call", cell(lambda tu: f"{tu.not_called:,}")),
        ("calls per answer", cell(lambda tu: f"{tu.calls_per_answer:.2f}" if tu.answers else "-")),
        ("per answer that called", cell(lambda tu: f"{tu.calls_per_calling_answer:.2f}" if tu.called else "-")),
        ("argument tokens % of output", cell(lambda tu: esc(fmt(tu.argument_output_pct)))),
    ]


POOLED_CAPTION = (
    "An embeddings or rerank run streams no tokens: its throughput is in inputs (embedded texts, or "
    "documents scored) and input tokens per second (usage's prompt_tokens; the requested size where a "
    "request reported none), over the ok requests of each window."
)


def _pooled(a: RunAnalysis) -> list[tuple[str, Cell]] | None:
    """The pooled-throughput columns (None unless the run's API is embeddings or rerank)."""
    if (a.meta.get("settings") or {}).get("api") not in POOLED_APIS:
        return None
    sweep = "points" in a.meta
    t_sched = a.table.column("t_sched").to_numpy(zero_copy_only=False)
    point = a.table.column("point").to_numpy(zero_copy_only=False)
    figures = {
        p.index: pooled_figures(
            a.table.filter(pa.array(p.summary.window.contains(t_sched) & ((point == p.index) | (not sweep))))
        )
        for p in a.points
    }

    def cell(value: Callable[[PooledFigures], float | None], digits: int) -> Cell:
        return lambda p: "-" if (v := value(figures[p.index])) is None else f"{v:,.{digits}f}"

    return [
        ("ok requests", cell(lambda f: f["requests"], 0)),
        ("req/s", cell(lambda f: f["requests_per_s"], 2)),
        ("inputs/s", cell(lambda f: f["inputs_per_s"], 1)),
        ("input tok/s", cell(lambda f: f["input_tokens_per_s"], 0)),
    ]


def points_section(a: RunAnalysis) -> str:
    """The "points" section: its tables, each with a caption of what it shows."""
    window = esc(a.points[0].summary.window.how) if a.points else ""
    kinds = sorted({p.label.split(" @ ")[0] for p in a.points if p.rate is not None})
    arrival = f" Arrivals: {esc(', '.join(kinds))}." if kinds else ""
    blocks = [
        ("Throughput", "", _table(a, _throughput(a), "points-throughput")),
        (
            "Outcomes and SLO" if a.slo else "Outcomes",
            "Goodput counts requests that met every SLO bound; goodput tok/s is their output tokens per second."
            if a.slo
            else "",
            _table(a, _outcomes(a), "points-outcomes"),
        ),
        ("Latency (ms)", LATENCY_CAPTION, _table(a, _latency(), "points-latency")),
        (
            "Per-user speed and tokens",
            "Per-user speed is 1000 / TPOT per request; p10 and p1 are the slowest users (TPOT p90, p99).",
            _table(a, _users_and_tokens(a), "points-users"),
        ),
    ]
    if (tools := _tools(a)) is not None:
        blocks.append(("Tool calls", TOOLS_CAPTION, _table(a, tools, "points-tools")))
    if (pooled := _pooled(a)) is not None:
        blocks.append(("Inputs", POOLED_CAPTION, _table(a, pooled, "points-pooled")))
    if (stages := stage_columns(a.points)) is not None:
        blocks.append(("Pipeline stages (ms)", STAGES_CAPTION, _table(a, stages, "points-stages")))
    if (health := _health(a)) is not None:
        blocks.append(("Client health", HEALTH_CAPTION, _table(a, health, "points-client")))
    body = "".join(
        f"<h3>{esc(h)}</h3>" + (f'<p class="sub">{esc(cap)}</p>' if cap else "") + f'<div class="fit">{t}</div>'
        for h, cap, t in blocks
    )
    return (
        f'<section id="points"><h2>Load points</h2><p class="sub">Each point counts the requests scheduled in its '
        f"measurement window ({window}); ★ marks the Pareto frontier, ⚠ a suspect point (see Validity)."
        f"{arrival}</p>{body}</section>"
    )
