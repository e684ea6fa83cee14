"""A single-point run folder's summary: figures from the records, caveats, validity, summary.json.

``summarize_run`` is the path from a ``loadgen run`` folder to its summary.json, used at
the end of ``run`` and by ``report`` (``report.terminal`` shows it); so a report
re-rendered later is the same function of the same records. What the client, the
simulator and the run's state say is read from run.json by ``analysis.validity``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from loadgen.analysis.annotate import start_annotate_run
from loadgen.analysis.metrics import SLO, Summary, summarize, summary_to_json
from loadgen.analysis.pipeline import PipelineFigures, pipeline_figures, pipeline_view
from loadgen.analysis.pooled import PooledFigures, pooled_figures
from loadgen.analysis.sessions import SessionSummary, session_summary
from loadgen.analysis.timeseries import drop_timeseries, start_timeseries, timeseries
from loadgen.analysis.tool_use import ToolUse, tool_use
from loadgen.analysis.validity import (
    VALID,
    Caveat,
    Validity,
    cache_caveats,
    client_caveats,
    first_codes_first,
    interruption,
    run_caveats,
    summary_caveats,
    validity_json,
)
from loadgen.analysis.window import choose_window
from loadgen.records import read_records
from loadgen.run_folder import read_run_meta, write_json
from loadgen.workload.pooled import POOLED_APIS

__all__ = ["SUMMARY_SCHEMA_VERSION", "RunReport", "summarize_run", "single_run_caveats"]

# summary.json's layout: 2 added validity as data, censoring flags and null (never "inf") bounds.
SUMMARY_SCHEMA_VERSION = "2"


@dataclass
class RunReport:
    """A single-point run folder's figures over its measurement window, and what may have distorted them."""

    run_dir: Path
    meta: dict[str, Any]
    summary: Summary
    caveats: list[Caveat] = field(default_factory=list)
    validity: Validity = VALID
    sessions: SessionSummary | None = None  # sessions of several turns: whole-session figures
    tool_use: ToolUse | None = None  # requests that offered tools: how often the answers called one
    pooled: PooledFigures | None = None  # an embeddings or rerank run: inputs/s, input tokens/s
    pipeline: PipelineFigures | None = None  # a pipeline run (rag-pipeline): the stage breakdown

    @property
    def warnings(self) -> list[str]:
        """The caveats' messages, for views that show words only."""
        return [c.message for c in self.caveats]

    @property
    def interruption(self) -> str | None:
        """The line to show first when the run was interrupted (else None)."""
        return interruption(self.meta)


def single_run_caveats(
    meta: dict[str, Any], summary: Summary, lag_limit_ms: float, table: pa.Table | None = None
) -> list[Caveat]:
    """Every caveat of a single run: its state and the simulator, its window's figures, its
    client, and (given its records) a prefix cache an earlier run warmed; those that say how to
    read TTFT and ITL at all (``validity.FIRST_CODES``) first."""
    return first_codes_first(
        run_caveats(meta)
        + summary_caveats(summary, lag_p99_limit_ms=lag_limit_ms)
        + client_caveats(meta.get("client") or {}, lag_limit_ms)
        + (cache_caveats(table, meta) if table is not None else [])
    )


def summarize_run(
    run_dir: Path,
    *,
    warmup_s: float | None = None,
    cooldown_s: float | None = None,
    lag_limit_ms: float | None = None,
    slo: SLO | None = None,
    write: bool = True,
    table: pa.Table | None = None,
) -> RunReport:
    """Recompute every figure of a single-point run from its records (``table``: the records as
    ``read_records`` returned them, to save reading them again)."""
    meta = read_run_meta(run_dir)
    settings = meta.get("settings", {})
    records = table if table is not None else read_records(run_dir)
    table = pipeline_view(records)  # a pipeline's user requests, one row each (analysis.pipeline)
    warm = settings.get("warmup_s", 0.0) if warmup_s is None else warmup_s
    cool = settings.get("cooldown_s", 0.0) if cooldown_s is None else cooldown_s
    limit = settings.get("lag_limit_ms", 10.0) if lag_limit_ms is None else lag_limit_ms
    window = choose_window(table, warmup_s=warm, cooldown_s=cool)
    # in_window and the figures' own columns, written into records.parquet while the figures are computed
    written = start_annotate_run(Path(run_dir), window, table=records) if write else None
    if write:  # summary.json's time series, computed beside the figures too
        start_timeseries(table)
    try:
        summary = summarize(table, window, slo)
        sessions = session_summary(table, window)
        caveats = single_run_caveats(meta, summary, limit, table)
        tools = tool_use(table, window)
        pooled = None
        if (meta.get("settings") or {}).get("api") in POOLED_APIS:  # (a filtered copy of the table: only for these)
            in_window = table.filter(pa.array(window.contains(table.column("t_sched").to_numpy(zero_copy_only=False))))
            pooled = pooled_figures(in_window)
        pipeline = pipeline_figures(records, window)
        if write:
            doc = {
                "schema_version": SUMMARY_SCHEMA_VERSION,
                "run_id": meta.get("run_id"),
                "endpoint": meta.get("endpoint"),
                "model": meta.get("model"),
                "validity": validity_json(caveats),
                "summary": summary_to_json(summary),
                "sessions": sessions.to_json(),
                "tool_use": tools.to_json() if tools is not None else None,
                "pooled": pooled,
                "pipeline": pipeline,
                "timeseries": timeseries(table),
            }
            write_json(Path(run_dir) / "summary.json", doc)
    except BaseException:
        if written is not None:
            written.exception()  # the rewrite finished (its own error, if any, second to this one)
        if write:
            drop_timeseries(table)
        raise
    if written is not None:
        written.result()
    return RunReport(
        Path(run_dir),
        meta,
        summary,
        caveats,
        Validity.of(caveats),
        sessions=sessions,
        tool_use=tools,
        pooled=pooled,
        pipeline=pipeline,
    )
