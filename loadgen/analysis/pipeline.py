"""A pipeline run (the rag-pipeline workload): user requests made of stage requests.

The records hold one row per stage request (``stage``: embed, rerank, generate), each timed as
any request. The user's figures are the pipeline's, so ``pipeline_view`` folds each user request
(a ``session`` within its ``point``) into one row that every ordinary analysis then reads:

- its ``t_sched`` is the first stage's (the user request's intended instant) and its ``t_sent``
  the first stage's (schedule lag is the client's lateness in starting the user request);
- a pipeline whose stages all ended ``ok`` is its generating request's row, so its TTFT runs from
  the user request's instant to the answer's first token, its E2E to the answer's last byte, and
  its tokens, chunks and ITL are the answer's;
- a pipeline that did not is the row of its first stage that did not end ``ok`` (its status,
  error and times): a user request fails, or is censored, where its first stage did;
- a pipeline whose generating request left no record (a killed run loses its last flush) did
  not complete: its last row, ``cancelled``, says so.

So TTFT, ITL, E2E, throughput, the SLO and every verdict are those of user requests, by the
definitions of DESIGN.md applied to the user request as the request (docs/metrics.md,
"Pipelines"). ``pipeline_figures`` is the stage breakdown: per stage, its ok requests' latency
(``t_done - t_sched``, the stage's own instant being the previous stage's end, so the stages'
latencies of a completed pipeline add up to its E2E exactly) and share of the completed
pipelines' E2E, the client's wait before sending it (``t_sent - t_sched``), failures, and the
pooled stages' throughput (``analysis.pooled``). A pipeline counts in a window when its first
stage's instant is in it, and so do all its stages.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
import pyarrow as pa

from loadgen.analysis.pooled import pooled_figures
from loadgen.analysis.stats import nearest_rank
from loadgen.analysis.window import Window

__all__ = ["StageFigures", "PipelineFigures", "has_stages", "pipeline_view", "pipeline_figures"]


class StageFigures(TypedDict):
    stage: str
    api: str
    endpoint: str
    model: str
    requests: int  # stage requests of the window's pipelines (not_sent included)
    ok: int
    failed: int  # ended otherwise, not_sent excluded (a stage after a failure is never due)
    not_sent: int
    latency_p50_ms: float | None  # of its ok requests
    latency_p90_ms: float | None
    latency_p99_ms: float | None
    latency_mean_ms: float | None
    share_of_e2e: float | None  # its latency over the completed pipelines' E2E (sums of both)
    wait_p99_ms: float | None  # t_sent - t_sched of its sent requests: the client's part
    ttft_p50_ms: float | None  # the generating stage's own TTFT (from its own instant)
    ttft_p99_ms: float | None
    inputs_per_s: float | None  # pooled stages: inputs embedded or documents ranked per second
    input_tokens_per_s: float | None


class PipelineFigures(TypedDict):
    pipelines: int  # user requests whose first stage's instant is in the window
    completed: int  # every stage ended ok
    failed_at: dict[str, int]  # the stage where each other pipeline stopped (not_sent: cut before it)
    e2e_p50_ms: float | None  # completed pipelines, from the first stage's instant to the answer's end
    e2e_p99_ms: float | None
    stages: list[StageFigures]


def has_stages(table: pa.Table) -> bool:
    """Whether ``table``'s records are a pipeline's stage requests."""
    return "stage" in table.column_names and table.column("stage").null_count < table.num_rows


def _ints(table: pa.Table, name: str) -> np.ndarray[Any, Any]:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False))


def _floats(table: pa.Table, name: str) -> np.ndarray[Any, Any]:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


class _Groups:
    """The stage records of ``table`` grouped by user request, in stage order."""

    def __init__(self, table: pa.Table) -> None:
        point, session, turn = _ints(table, "point"), _ints(table, "session"), _ints(table, "turn")
        self.order = np.lexsort((turn, session, point))
        p, s = point[self.order], session[self.order]
        change = np.ones(len(p), dtype=bool)
        change[1:] = (p[1:] != p[:-1]) | (s[1:] != s[:-1])
        self.starts = np.flatnonzero(change)  # positions in ``order`` where a user request begins
        self.sizes = np.diff(np.append(self.starts, len(p)))
        self.group = np.cumsum(change) - 1  # each sorted row's user request

    def first_bad(self, ok_sorted: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Per user request, the position (in ``order``) of its first stage that was not ok, or
        of its last stage when every one was."""
        n = len(ok_sorted)
        pos = np.arange(n)
        bad_pos = np.where(ok_sorted, n, pos)
        first = np.minimum.reduceat(bad_pos, self.starts) if n else np.array([], dtype=np.int64)
        last = self.starts + self.sizes - 1
        return np.where(first < n, first, last)


def pipeline_view(table: pa.Table) -> pa.Table:
    """One row per user request (see the module's note); a table with no stage records is
    returned as it is."""
    if not has_stages(table) or table.num_rows == 0:
        return table
    g = _Groups(table)
    ok = _complete_rows(table, g)[g.order]
    rows = g.order[g.first_bad(ok)]  # the row standing for each user request
    firsts = g.order[g.starts]
    view = table.take(rows)
    for name in ("t_sched", "t_sent"):
        i = view.schema.get_field_index(name)
        view = view.set_column(i, name, table.column(name).take(firsts))
    cut = ~ok[g.first_bad(ok)] & (np.asarray(view.column("status").to_pylist(), dtype=object) == "ok")
    if cut.any():  # its last stage's record is missing: not a completed user request
        status = np.where(cut, "cancelled", np.asarray(view.column("status").to_pylist(), dtype=object))
        error = [_LOST if c else e for c, e in zip(cut.tolist(), view.column("error").to_pylist(), strict=True)]
        view = view.set_column(view.schema.get_field_index("status"), "status", pa.array(status.tolist(), pa.string()))
        view = view.set_column(view.schema.get_field_index("error"), "error", pa.array(error, pa.string()))
    return view


_LOST = "cancelled: the pipeline's generating request left no record (the run was killed before it was flushed)"


def _complete_rows(table: pa.Table, g: _Groups) -> np.ndarray[Any, Any]:
    """Per record: ended ok, and (the last record of its user request) is the generating stage."""
    ok: np.ndarray[Any, Any] = np.asarray(table.column("status").to_pylist(), dtype=object) == "ok"
    last = g.order[g.starts + g.sizes - 1]
    stage = np.asarray(table.column("stage").to_pylist(), dtype=object)
    ok[last] &= stage[last] == "generate"
    return ok


def pipeline_figures(table: pa.Table, window: Window | None = None) -> PipelineFigures | None:
    """The stage breakdown of the user requests in ``window`` (None: all); None when ``table``
    holds no stage records."""
    if not has_stages(table):
        return None
    g = _Groups(table)
    first_sched = _ints(table, "t_sched")[g.order][g.starts]
    keep_group = window.contains(first_sched) if window is not None else np.ones(len(g.starts), dtype=bool)
    keep = np.zeros(table.num_rows, dtype=bool)
    keep[g.order] = keep_group[g.group]
    t = table.filter(pa.array(keep))
    if t.num_rows == 0:
        return {"pipelines": 0, "completed": 0, "failed_at": {}, "e2e_p50_ms": None, "e2e_p99_ms": None, "stages": []}
    g = _Groups(t)
    status = np.asarray(t.column("status").to_pylist(), dtype=object)
    stage = np.asarray(t.column("stage").to_pylist(), dtype=object)
    ok_sorted = _complete_rows(t, g)[g.order]
    done = np.logical_and.reduceat(ok_sorted, g.starts)
    stop = g.order[g.first_bad(ok_sorted)]
    failed_at: dict[str, int] = {}
    for s in stage[stop[~done]].tolist():
        failed_at[str(s)] = failed_at.get(str(s), 0) + 1
    t_sched, t_done = _floats(t, "t_sched"), _floats(t, "t_done")
    latency = (t_done - t_sched) / 1e6
    first = _floats(t, "t_sched")[g.order][g.starts]
    last_done = t_done[g.order][g.starts + g.sizes - 1]
    e2e = np.sort((last_done[done] - first[done]) / 1e6)
    complete_row = np.zeros(t.num_rows, dtype=bool)
    complete_row[g.order] = done[g.group]
    total_e2e = float(e2e.sum())
    names = [s for s in ("embed", "rerank", "generate") if s in set(stage.tolist())]
    names += sorted({str(s) for s in stage.tolist() if s is not None} - set(names))
    return {
        "pipelines": len(g.starts),
        "completed": int(done.sum()),
        "failed_at": failed_at,
        "e2e_p50_ms": nearest_rank(e2e, 50) if e2e.size else None,
        "e2e_p99_ms": nearest_rank(e2e, 99) if e2e.size else None,
        "stages": [_stage(t, stage == name, status, latency, complete_row, total_e2e) for name in names],
    }


def _stage(
    t: pa.Table,
    mine: np.ndarray[Any, Any],
    status: np.ndarray[Any, Any],
    latency: np.ndarray[Any, Any],
    complete_row: np.ndarray[Any, Any],
    total_e2e: float,
) -> StageFigures:
    rows = t.filter(pa.array(mine))
    ok = mine & (status == "ok")
    lat = np.sort(latency[ok])
    sent = mine & (status != "not_sent")
    wait = np.sort(((_floats(t, "t_sent") - _floats(t, "t_sched")) / 1e6)[sent])
    wait = wait[~np.isnan(wait)]
    api = str(rows.column("api")[0].as_py() or "")
    first = _floats(t, "t_first")
    ttft = np.sort(((first - _floats(t, "t_sched")) / 1e6)[ok & ~np.isnan(first)])
    pooled = pooled_figures(t.filter(pa.array(ok))) if api in ("embeddings", "rerank") else None
    share = float(latency[mine & complete_row].sum()) / total_e2e if total_e2e > 0 else None
    n_not_sent = int((mine & (status == "not_sent")).sum())

    def pct(x: np.ndarray[Any, Any], p: float) -> float | None:
        return nearest_rank(x, p) if x.size else None

    return {
        "stage": str(rows.column("stage")[0].as_py()),
        "api": api,
        "endpoint": str(rows.column("endpoint")[0].as_py() or ""),
        "model": str(rows.column("model")[0].as_py() or ""),
        "requests": int(mine.sum()),
        "ok": int(ok.sum()),
        "failed": int(mine.sum()) - int(ok.sum()) - n_not_sent,
        "not_sent": n_not_sent,
        "latency_p50_ms": pct(lat, 50),
        "latency_p90_ms": pct(lat, 90),
        "latency_p99_ms": pct(lat, 99),
        "latency_mean_ms": float(lat.mean()) if lat.size else None,
        "share_of_e2e": share,
        "wait_p99_ms": pct(wait, 99),
        "ttft_p50_ms": pct(ttft, 50) if api not in ("embeddings", "rerank") else None,
        "ttft_p99_ms": pct(ttft, 99) if api not in ("embeddings", "rerank") else None,
        "inputs_per_s": pooled["inputs_per_s"] if pooled else None,
        "input_tokens_per_s": pooled["input_tokens_per_s"] if pooled else None,
    }
