"""A single-point run on the terminal: header, latency and throughput tables, warnings (rich).

ITL's line says where its per-chunk token counts came from (``analysis.stream_shape``); a run
whose requests offered tools has a line of how often its answers called one (``analysis.tool_use``);
the client's health (CPU, event-loop lag, read-stamp lateness) has its own line before the
warnings, whose first ones say how to read TTFT and ITL at all (``validity.FIRST_CODES``).

A figure that is only a lower bound (censored samples: requests that never got what it
times count as at least their elapsed time) is shown ``>= x``; an unbounded interval end ∞.
An interrupted or suspect run says so on the first line (``banner``), before any figure.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from loadgen.analysis.client_health import health_line
from loadgen.analysis.metrics import Summary
from loadgen.analysis.pooled import PooledFigures
from loadgen.analysis.run_summary import RunReport
from loadgen.analysis.sessions import load_unit
from loadgen.analysis.stats import Dist
from loadgen.analysis.stream_shape import token_source_text
from loadgen.analysis.tool_use import ToolUse
from loadgen.report.banner import banner_lines, virtual_line
from loadgen.report.pipeline_view import pipeline_line, stage_lines, stage_table
from loadgen.report.request_terms import request_terms

__all__ = [
    "print_run",
    "latency_table",
    "itl_line",
    "throughput_table",
    "token_lines",
    "tool_line",
    "pooled_line",
    "load_label",
]


def print_run(report: RunReport, console: Console | None = None) -> None:
    """The run's header, latency and throughput tables, and its warnings."""
    console = console or Console()
    s = report.summary
    for line in [*filter(None, [virtual_line(report.meta)]), *banner_lines(report.interruption, report.validity)]:
        console.print(Text(line, style="bold red"))
    console.print(header_text(report.meta, s))
    console.print(latency_table(s))
    if line := itl_line(s):
        console.print(Text(line))
    console.print(throughput_table(s))
    for line in token_lines(s):
        console.print(line)
    if line := tool_line(report.tool_use):
        console.print(Text(line))
    if line := pooled_line(report.pooled):
        console.print(Text(line))
    if report.pipeline is not None:  # a pipeline run: where the user requests' time went
        console.print(stage_table(report.pipeline))
        for line in [pipeline_line(report.pipeline), *stage_lines(report.pipeline)]:
            console.print(Text(line))
    if report.sessions is not None and report.sessions.multi_turn:
        for line in report.sessions.lines():
            console.print(line)
    if health := health_line(report.meta.get("client") or {}):
        console.print(Text(health))
    for w in report.warnings:
        console.print(Text("warning: " + w, style="yellow"))
    console.print(f"records: {report.run_dir / 'records.parquet'}")


def header_text(meta: dict[str, Any], s: Summary) -> Text:
    arrival = load_label(meta)
    t = Text()
    t.append(f"{meta.get('endpoint', '?')}", style="bold")
    t.append(f"  model {meta.get('model', '?')}  ·  {arrival}\n")
    t.append(request_terms(meta) + "\n")
    t.append(
        f"{s.requests} requests in a {s.window_s:.1f} s window ({s.window}) · "
        f"ok {s.ok}, failed {s.failed}, cancelled {s.cancelled}" + (f", not sent {s.not_sent}" if s.not_sent else "")
    )
    return t


def load_label(meta: dict[str, Any]) -> str:
    """The arrival as written, in the load's own unit: sessions/s for sessions of several
    turns (an agentic rate of 0.5 is half a session per second, not half a request)."""
    arrival = meta.get("settings", {}).get("arrival", {})
    label = str(arrival.get("label", ""))
    if arrival.get("kind") != "trace" and load_unit(meta.get("workload") or {}) == "sessions/s":
        return label.replace(" req/s", " sessions/s")
    return label


def _fmt(v: float, lower_bound: bool = False) -> str:
    """A figure: "-" for NaN, ∞ for an open end, ``>= x`` for a lower bound, 1,705 past 1000."""
    if v != v:  # NaN
        return "-"
    if v in (float("inf"), float("-inf")):
        return "∞" if v > 0 else "-∞"
    text = f"{v:.1f}" if abs(v) < 1000 else f"{v:,.0f}"
    return f">= {text}" if lower_bound else text


def _cell(d: Dist, key: str) -> str:
    if d.n == 0:
        return "-"
    v, lo, hi = d.pcts[key]
    f = d.flags.get(key)
    value = _fmt(v, f is not None and f.value)
    return f"{value} [{_fmt(lo, f is not None and f.lo)}, {_fmt(hi)}]" if key in ("p99", "p99.9") else value


def latency_table(s: Summary) -> Table:
    title = "latency (ms; p99 with its 95% interval)"
    if any(d.censored for d in (s.ttft, s.e2e, s.ttft_sent, s.schedule_lag)):
        title += "; >= x: a lower bound, requests that never got a first token (or never finished) count as their wait"
    t = Table(title=title, show_edge=False)
    for col in ("metric", "n", "mean", "p50", "p90", "p95", "p99", "p99.9"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    rows = (
        ("TTFT (from schedule)", s.ttft),
        ("TTFT (from send)", s.ttft_sent),
        *((("TTFT to content (not reasoning)", s.ttft_content),) if s.content_after_first else ()),
        *(
            (("TTFT, cache hit (>= 50%)", s.ttft_ms_cached), ("TTFT, cache miss", s.ttft_ms_uncached))
            if s.ttft_ms_cached is not None and s.ttft_ms_uncached is not None
            else ()
        ),
        ("TPOT", s.tpot),
        ("ITL", s.itl),
        ("ICL (chunk gaps)", s.icl),
        ("E2E", s.e2e),
        ("schedule lag", s.schedule_lag),
    )  # per-user speed (tok/s, slow tail) is one of ``token_lines``
    for name, d in rows:
        n = f"{d.n} ({d.censored} censored)" if d.censored else str(d.n)
        mean = _fmt(d.mean, d.mean_lower_bound) if d.n else "-"
        t.add_row(name, n, mean, *(_cell(d, k) for k in ("p50", "p90", "p95", "p99", "p99.9")))
    return t


def itl_line(s: Summary) -> str:
    """ITL's p50 and p99 with where its per-chunk token counts came from (and whether that makes
    its percentiles approximate); "" without ITL samples."""
    if not s.itl.n:
        return ""
    source = token_source_text(s)
    return f"ITL p50 {_cell(s.itl, 'p50')} ms, p99 {_fmt(s.itl.pct(99)[0])} ms" + (f" ({source})" if source else "")


def token_lines(s: Summary) -> list[str]:
    """The slow users, token goodput, cached prompt tokens and reasoning tokens, one line each where known."""
    out = []
    if s.per_user_tps.n:
        p10, p1 = s.per_user_slow
        out.append(
            f"per-user tok/s: p50 {_fmt(s.per_user_tps.pct(50)[0])}, slowest users p10 {_fmt(p10)}, p1 {_fmt(p1)}"
        )
    if s.goodput_tps is not None:
        out.append(f"goodput: {_fmt(s.goodput_rps or 0.0)} req/s, {_fmt(s.goodput_tps)} output tok/s meeting the SLO")
    if s.cached_prompt_fraction is not None:
        line = (
            f"cached prompt tokens: {100 * s.cached_prompt_fraction:.1f}% "
            f"({s.cached_prompt_tokens:,} reported cached, {s.cached_reported:,} requests reported)"
        )
        if s.ttft_ms_cached is not None and s.ttft_ms_uncached is not None:
            line += (
                f"; TTFT p50 {_cell(s.ttft_ms_cached, 'p50')} ms on cache hits (>= half the prompt cached), "
                f"{_cell(s.ttft_ms_uncached, 'p50')} ms on misses"
            )
        out.append(line)
    if s.reasoning_reported:
        out.append(
            f"reasoning tokens: {s.reasoning_tokens:,} ({_fmt(s.reasoning_output_pct)}% of the output of the "
            f"{s.reasoning_reported:,} requests that reported them)"
        )
    return out


def tool_line(tu: ToolUse | None) -> str:
    """How often the answers called a tool, calls per answer, and the arguments' share of the
    output; "" when no request offered tools."""
    if tu is None:
        return ""
    if not tu.answers:
        return "tool calls: no ok answer to a request that offered tools"
    return (
        f"tool calls: {tu.called:,} of {tu.answers:,} answers called a tool ({_fmt(tu.called_pct)}%; "
        f"{tu.not_called:,} did not), {tu.calls_per_answer:.2f} calls per answer"
        + (f" ({tu.calls_per_calling_answer:.2f} per answer that called)" if tu.called else "")
        + f"; arguments ~{_fmt(tu.argument_output_pct)}% of output tokens "
        f"({tu.argument_tokens:,} of {tu.output_tokens:,})"
    )


def pooled_line(f: PooledFigures | None) -> str:
    """An embeddings or rerank run's throughput in inputs (and input tokens) per second, where
    the tables' output tokens say nothing; "" for any other API."""
    if f is None:
        return ""
    if not f["requests"] or f["requests_per_s"] is None:
        return "inputs: no ok request in the window"
    per_s = f"{f['inputs_per_s']:,.1f} inputs/s" if f["inputs_per_s"] is not None else "inputs/s unknown"
    tokens = f"{f['input_tokens_per_s']:,.0f} input tok/s" if f["input_tokens_per_s"] is not None else ""
    unreported = f" ({f['tokens_unreported']:,} requests reported no usage: their requested size counted)"
    return f"inputs: {per_s}, {tokens} over {f['requests']:,} ok requests ({f['requests_per_s']:,.2f} req/s)" + (
        unreported if f["tokens_unreported"] else ""
    )


def throughput_table(s: Summary) -> Table:
    t = Table(title="throughput", show_edge=False)
    for col in (
        "offered req/s",
        "sent req/s",
        "completed req/s",
        "output tok/s",
        "total tok/s",
        "success %",
        "goodput req/s",
        "SLO attainment %",
    ):
        t.add_column(col, justify="right")
    t.add_row(
        f"{s.offered_rps:.2f}",
        f"{s.sent_rps:.2f}",
        f"{s.completed_rps:.2f}",
        f"{s.output_tps:.1f}",
        f"{s.total_tps:.1f}",
        f"{s.success_pct:.1f}",
        "-" if s.goodput_rps is None else f"{s.goodput_rps:.2f}",
        "-" if s.slo_attainment_pct is None else f"{s.slo_attainment_pct:.1f}",
    )
    return t
