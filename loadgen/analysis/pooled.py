"""The figures of an embeddings or rerank run: latency (E2E), requests/s, inputs/s, input tokens/s.

A pooled request has no output tokens, so no TTFT and no ITL: its latency is E2E,
``t_done - t_sched`` (from its intended instant, as every latency in DESIGN.md, so a client
that fell behind is not flattering the server). Throughput is over the span of the run's
requests, from the first intended instant to the last answer's end:

- ``requests_per_s``: ok requests per second;
- ``inputs_per_s``: inputs embedded (or documents ranked) per second: per request, the
  records' ``inputs`` column where the records have one, else ``inputs_per_request`` (the
  workload's fixed batch size), else unknown (null);
- ``input_tokens_per_s``: the tokens the endpoint said it read (``prompt_tokens_reported``,
  from ``usage.prompt_tokens``, or rerank's ``usage.total_tokens``), per second; requests that
  did not report count their requested size (``prompt_tokens_requested``) and are counted in
  ``tokens_unreported``.

Percentiles are nearest-rank (the value of a real request), in milliseconds.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
import pyarrow as pa

from loadgen.analysis.stats import nearest_rank

__all__ = ["PooledFigures", "pooled_figures"]


class PooledFigures(TypedDict):
    requests: int  # ok requests
    failed: int  # requests that ended otherwise (not_sent included)
    span_s: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    requests_per_s: float | None
    inputs_per_s: float | None
    input_tokens_per_s: float | None
    tokens_unreported: int


def _column(table: pa.Table, name: str) -> np.ndarray[Any, Any] | None:
    if name not in table.column_names:
        return None
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=float)


def pooled_figures(table: pa.Table, inputs_per_request: int | None = None) -> PooledFigures:
    """The figures of the pooled requests in ``table`` (a records table)."""
    status = np.asarray(table.column("status").to_pylist(), dtype=object)
    ok = status == "ok"
    t_sched = _column(table, "t_sched")
    t_done = _column(table, "t_done")
    assert t_sched is not None and t_done is not None  # every records table has them
    ok &= ~np.isnan(t_done)
    n = int(ok.sum())
    figures: PooledFigures = {
        "requests": n,
        "failed": int(len(status) - n),
        "span_s": None,
        "e2e_p50_ms": None,
        "e2e_p99_ms": None,
        "requests_per_s": None,
        "inputs_per_s": None,
        "input_tokens_per_s": None,
        "tokens_unreported": 0,
    }
    if not n:
        return figures
    e2e = np.sort((t_done[ok] - t_sched[ok]) / 1e6)
    figures["e2e_p50_ms"] = nearest_rank(e2e, 50)
    figures["e2e_p99_ms"] = nearest_rank(e2e, 99)
    span = (float(t_done[ok].max()) - float(t_sched[ok].min())) / 1e9
    if span <= 0:
        return figures
    figures["span_s"] = span
    figures["requests_per_s"] = n / span
    inputs = _column(table, "inputs")
    if inputs is not None and not np.isnan(inputs[ok]).any():
        figures["inputs_per_s"] = float(inputs[ok].sum()) / span
    elif inputs_per_request is not None:
        figures["inputs_per_s"] = n * inputs_per_request / span
    reported = _column(table, "prompt_tokens_reported")
    requested = _column(table, "prompt_tokens_requested")
    assert reported is not None and requested is not None
    rep, req = reported[ok], requested[ok]
    missing = np.isnan(rep)
    figures["tokens_unreported"] = int(missing.sum())
    tokens = np.where(missing, np.nan_to_num(req), rep)
    figures["input_tokens_per_s"] = float(tokens.sum()) / span
    return figures
