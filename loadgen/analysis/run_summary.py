"""A single-point run folder's summary: figures from the records, warnings, summary.json.

``summarize_run`` is the path from a ``loadgen run`` folder to its summary.json, used at
the end of ``run`` and by ``report`` (``report.terminal`` shows it); so a report
re-rendered later is the same function of the same records. The client's and the
simulator's warnings are read from run.json here, for sweeps (``analysis.points``) too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.analysis.metrics import SLO, Summary, summarize, summary_to_json
from loadgen.analysis.timeseries import timeseries
from loadgen.analysis.validity import validity_warnings
from loadgen.analysis.window import choose_window
from loadgen.records import read_records, read_run_meta, write_json

__all__ = ["RunReport", "summarize_run", "client_warnings", "simulator_warnings"]


@dataclass
class RunReport:
    """A single-point run folder's figures over its measurement window, and what may have distorted them."""

    run_dir: Path
    meta: dict[str, Any]
    summary: Summary
    warnings: list[str] = field(default_factory=list)


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
    # the client's fast path (each read stamped as it arrives, each request held to its instant):
    # every process says whether it had it (a run merged from workers lists them under "workers")
    processes = [p for c in _clients(meta) for p in (c, *c.get("workers", []))]
    for why in dict.fromkeys(
        p.get("fast_read_why_not") or "no reason given" for p in processes if p.get("fast_read") is False
    ):
        out.append(
            f"the client ran without its fast path ({why}): timing fell back to the slower path, "
            "reads stamped when the request's task got to them and requests prepared at their instant "
            "(so timings include more client delay)"
        )
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
