"""A single-point run on the terminal: header, latency and throughput tables, warnings (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from loadgen.analysis.metrics import Summary
from loadgen.analysis.run_summary import RunReport
from loadgen.analysis.stats import Dist

__all__ = ["print_run", "latency_table", "throughput_table"]


def print_run(report: RunReport, console: Console | None = None) -> None:
    """The run's header, latency and throughput tables, and its warnings."""
    console = console or Console()
    s = report.summary
    console.print(header_text(report.meta, s))
    console.print(latency_table(s))
    console.print(throughput_table(s))
    for w in report.warnings:
        console.print(Text("warning: " + w, style="yellow"))
    console.print(f"records: {report.run_dir / 'records.parquet'}")


def header_text(meta: dict[str, Any], s: Summary) -> Text:
    arrival = meta.get("settings", {}).get("arrival", {}).get("label", "")
    t = Text()
    t.append(f"{meta.get('endpoint', '?')}", style="bold")
    t.append(f"  model {meta.get('model', '?')}  ·  {arrival}\n")
    t.append(
        f"{s.requests} requests in a {s.window_s:.1f} s window ({s.window}) · "
        f"ok {s.ok}, failed {s.failed}, cancelled {s.cancelled}"
    )
    return t


def _fmt(v: float) -> str:
    if v != v:  # NaN
        return "-"
    if v in (float("inf"), float("-inf")):
        return "∞"
    return f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"


def _cell(d: Dist, key: str) -> str:
    if d.n == 0:
        return "-"
    v, lo, hi = d.pcts[key]
    return f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]" if key in ("p99", "p99.9") else _fmt(v)


def latency_table(s: Summary) -> Table:
    t = Table(title="latency (ms; p99 with its 95% interval)", show_edge=False)
    for col in ("metric", "n", "mean", "p50", "p90", "p95", "p99", "p99.9"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    rows = (
        ("TTFT (from schedule)", s.ttft),
        ("TTFT (from send)", s.ttft_sent),
        ("TPOT", s.tpot),
        ("ITL", s.itl),
        ("ICL (chunk gaps)", s.icl),
        ("E2E", s.e2e),
        ("schedule lag", s.schedule_lag),
        ("per-user tok/s", s.per_user_tps),
    )
    for name, d in rows:
        t.add_row(
            name, str(d.n), _fmt(d.mean) if d.n else "-", *(_cell(d, k) for k in ("p50", "p90", "p95", "p99", "p99.9"))
        )
    return t


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
