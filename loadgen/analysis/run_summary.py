"""A run folder's summary: figures from the records, warnings, summary.json, terminal.

``summarize_run`` is the one path from a run folder to its figures, used at
the end of ``run`` and by ``report``; so a report re-rendered later is the same
function of the same records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from loadgen.analysis.metrics import SLO, Summary, summarize, summary_to_json, validity_warnings
from loadgen.analysis.stats import Dist
from loadgen.analysis.timeseries import timeseries
from loadgen.analysis.window import choose_window
from loadgen.records import read_records, read_run_meta, write_json

__all__ = ["RunReport", "summarize_run", "client_warnings", "latency_table"]


@dataclass
class RunReport:
    run_dir: Path
    meta: dict[str, Any]
    summary: Summary
    warnings: list[str] = field(default_factory=list)

    def print(self, console: Console | None = None) -> None:
        console = console or Console()
        s = self.summary
        console.print(header_text(self.meta, s))
        console.print(latency_table(s))
        console.print(throughput_table(s))
        for w in self.warnings:
            console.print(Text("warning: " + w, style="yellow"))
        console.print(f"records: {self.run_dir / 'records.parquet'}")


def client_warnings(meta: dict[str, Any]) -> list[str]:
    """Where loadgen itself may have distorted the result (from run.json's client block)."""
    out = []
    for c in _clients(meta):
        if c.get("cpu_utilisation", 0) >= 0.9:
            out.append(
                f"client CPU was saturated ({c['cpu_utilisation']:.0%} of a core): "
                "timings may include client delay; add --workers or a bigger machine"
            )
        if c.get("sends_delayed_by_max_inflight"):
            out.append(
                f"{c['sends_delayed_by_max_inflight']} sends waited for --max-inflight: the open loop was capped"
            )
        if c.get("loop_lag_max_ms", 0) > 50:
            out.append(f"the client's event loop stalled for up to {c['loop_lag_max_ms']:.0f} ms")
    return out


def simulator_warnings(meta: dict[str, Any]) -> list[str]:
    sim = meta.get("simulator") or {}
    late, steps = sim.get("late_steps", 0), sim.get("steps", 0)
    # a rare step a few ms late is scheduling noise; many, or a long stall, distort what was measured
    if late and (late > 0.01 * max(steps, 1) or sim.get("max_lateness_ms", 0) > 20):
        return [
            f"the simulator fell behind its own model on {late} of {steps} steps (up to "
            f"{sim.get('max_lateness_ms', 0):.1f} ms late): its answers were slower than modelled"
        ]
    return []


def _clients(meta: dict[str, Any]) -> list[dict[str, Any]]:
    if "client" in meta:
        return [meta["client"]]
    return [p.get("client", {}) for p in meta.get("points", [])]


def summarize_run(
    run_dir: Path,
    *,
    warmup_s: float | None = None,
    cooldown_s: float | None = None,
    lag_limit_ms: float | None = None,
    slo: SLO | None = None,
    write: bool = True,
) -> RunReport:
    """Recompute every figure of a single-point run from its records."""
    meta = read_run_meta(run_dir)
    settings = meta.get("settings", {})
    table = read_records(run_dir)
    warm = settings.get("warmup_s", 0.0) if warmup_s is None else warmup_s
    cool = settings.get("cooldown_s", 0.0) if cooldown_s is None else cooldown_s
    limit = settings.get("lag_limit_ms", 10.0) if lag_limit_ms is None else lag_limit_ms
    window = choose_window(table, warmup_s=warm, cooldown_s=cool)
    summary = summarize(table, window, slo)
    warnings = validity_warnings(summary, lag_p99_limit_ms=limit) + client_warnings(meta) + simulator_warnings(meta)
    if write:
        doc = {
            "run_id": meta.get("run_id"),
            "endpoint": meta.get("endpoint"),
            "model": meta.get("model"),
            "summary": summary_to_json(summary),
            "warnings": warnings,
            "timeseries": timeseries(table),
        }
        write_json(Path(run_dir) / "summary.json", doc)
    return RunReport(Path(run_dir), meta, summary, warnings)


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
