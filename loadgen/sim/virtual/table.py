"""A virtual run's requests as ordinary records (``records.SCHEMA``) and its ground truth.

Each request is the record a perfect client would write against the real-time simulator: sent at
its due instant (``t_sent == t_sched``, no lag), headers at once, every output-carrying chunk
stamped at the instant its last token was emitted (the server writes a chunk when its tokens are
all out: ``answer.chunk_size``), the stream done with its last chunk, token counts from usage.
Built column by column: the per-token stamps go into Arrow as one flat array with offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from loadgen.record_version import stamped
from loadgen.records import SCHEMA, SCHEMA_VERSION
from loadgen.sim.answer import SimConfig, chunk_seed, chunk_size
from loadgen.sim.virtual.loop import SessionRun, Unsent, VirtualRequest
from loadgen.workload.session import Turn

__all__ = ["records_table", "truth_table", "write_stream", "ENDPOINT"]

ENDPOINT = "sim-virtual"  # the records' endpoint label


def _chunks(r: VirtualRequest, lo: int, hi: int) -> tuple[list[int], list[int]]:
    """(the instant each chunk went out, its tokens) for ``r``'s emitted tokens."""
    times, n = r.emit_ns, len(r.emit_ns)
    if hi <= 1:
        return times, [1] * n
    seed, c, at, ns, counts = chunk_seed(r.prompt_ids), 0, 0, [], []
    while at < n:
        k = min(chunk_size(seed, c, lo, max(lo, hi)), n - at)
        at += k
        ns.append(times[at - 1])
        counts.append(k)
        c += 1
    return ns, counts


def records_table(
    done: Sequence[VirtualRequest], unsent: Sequence[Unsent], sim: SimConfig, *, run_id: str, point: int, cut_ns: int
) -> pa.Table:
    """The records of every request sent (``done``) and every turn not sent, in ``SCHEMA``."""
    lo, hi = sim.tokens_per_chunk, max(sim.tokens_per_chunk, sim.tokens_per_chunk_max)
    flat_ns: list[int] = []
    flat_tok: list[int] = []
    offsets = [0]
    first: list[int | None] = []
    last: list[int | None] = []
    for r in done:
        ns, counts = _chunks(r, lo, hi) if r.emit_ns else ([], [])
        flat_ns.extend(ns)
        flat_tok.extend(counts)
        offsets.append(len(flat_ns))
        first.append(ns[0] if ns else None)
        last.append(ns[-1] if ns else None)
    offsets.extend([len(flat_ns)] * len(unsent))
    ok = [r.finished for r in done]
    refused = [r.error_status != 0 for r in done]
    n, m = len(done), len(unsent)
    sched = [r.t_sched for r in done]
    cols: dict[str, list[Any]] = {
        "run_id": [run_id] * (n + m),
        "point": [point] * (n + m),
        "shard": [0] * (n + m),
        "request": [r.seq for r in done] + [0] * m,
        "session": [_run(r).session.session for r in done] + [u.run.session.session for u in unsent],
        "turn": [r.turn for r in done] + [u.turn for u in unsent],
        "endpoint": [ENDPOINT] * (n + m),
        "model": [sim.model_name] * (n + m),
        "api": ["chat"] * (n + m),
        "t_sched": sched + [u.t_sched for u in unsent],
        "t_sent": sched + [None] * m,
        "t_headers": [None if e else t for t, e in zip(sched, refused, strict=True)] + [None] * m,
        "t_first": first + [None] * m,
        "t_first_content": [None if r.tool_call else f for r, f in zip(done, first, strict=True)] + [None] * m,
        "t_last": last + [None] * m,
        "t_done": [_t_done(r, t, cut_ns) for r, t in zip(done, last, strict=True)] + [None] * m,
        "prompt_tokens_requested": [r.prompt_tokens_requested for r in done] + [_turn(u).prompt_tokens for u in unsent],
        "prompt_tokens_reported": [None if e else len(r.prompt_ids) for r, e in zip(done, refused, strict=True)]
        + [None] * m,
        "cached_tokens": [None if e else r.cached_tokens for r, e in zip(done, refused, strict=True)] + [None] * m,
        "output_tokens_requested": [r.max_tokens_requested for r in done] + [_turn(u).max_tokens for u in unsent],
        "output_tokens_reported": [r.emitted if k else None for r, k in zip(done, ok, strict=True)] + [None] * m,
        "output_tokens": [r.emitted for r in done] + [0] * m,
        "output_tokens_source": ["usage" if k else "chunks" for k in ok] + ["none"] * m,
        "stream_end": ["done" if k else None for k in ok] + [None] * m,
        "finish_reason": [("tool_calls" if r.tool_call else r.finish) if r.finished else None for r in done]
        + [None] * m,
        "tool_calls": [int(r.tool_call) if r.finished and r.tools_offered else None for r in done] + [None] * m,
        "status": [_status(r) for r in done] + ["not_sent"] * m,
        "http_status": [r.error_status or 200 for r in done] + [None] * m,
        "error": [r.error or (None if r.finished else _CANCELLED) for r in done] + [u.why for u in unsent],
    }
    off = pa.array(offsets, type=pa.int32())
    arrays: list[pa.Array[Any]] = []
    for f in SCHEMA:
        if f.name == "chunk_ns":
            arrays.append(pa.ListArray.from_arrays(off, pa.array(flat_ns, type=pa.int64())))
        elif f.name == "chunk_tokens":
            arrays.append(pa.ListArray.from_arrays(off, pa.array(flat_tok, type=pa.int32())))
        elif f.name in cols:
            arrays.append(pa.array(cols[f.name], type=f.type))
        else:  # a column this run has no value for (reasoning tokens, inputs, kept text, ...)
            arrays.append(pa.nulls(n + m, type=f.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


_CANCELLED = "cancelled: the run's drain ended"


def _run(r: VirtualRequest) -> SessionRun:
    assert r.run is not None
    return r.run


def _turn(u: Unsent) -> Turn:
    return u.run.session.turns[u.turn]


def _status(r: VirtualRequest) -> str:
    return "http_error" if r.error_status else "ok" if r.finished else "cancelled"


def _t_done(r: VirtualRequest, t_last: int | None, cut_ns: int) -> int:
    """When the stream ended: with its last chunk; refused at once; cut at the drain's end."""
    if r.error_status:
        return r.t_sched
    if not r.finished:
        return cut_ns
    if t_last is not None:
        return t_last
    return r.prefill_end_ns if r.prefill_end_ns is not None else r.t_sched  # no tokens asked for


def truth_table(done: Sequence[VirtualRequest]) -> pa.Table:
    """The engine's ground truth per request sent: what ``--truth`` writes, without the per-token lists."""
    return pa.table(
        {
            "rid": [r.rid for r in done],
            "arrival_ns": pa.array([r.arrival_ns for r in done], pa.int64()),
            "prompt_tokens": pa.array([len(r.prompt_ids) for r in done], pa.int32()),
            "cached_tokens": pa.array([r.cached_tokens for r in done], pa.int32()),
            "queue_wait_ns": pa.array([r.queue_wait_ns for r in done], pa.int64()),
            "prefill_start_ns": pa.array([r.prefill_start_ns for r in done], pa.int64()),
            "prefill_end_ns": pa.array([r.prefill_end_ns for r in done], pa.int64()),
            "tokens": pa.array([r.emitted for r in done], pa.int32()),
            "preemptions": pa.array([r.preemptions for r in done], pa.int32()),
            "cancelled": pa.array([not r.finished for r in done], pa.bool_()),
        }
    )


def write_stream(table: pa.Table, path: Path) -> None:
    """Write ``table`` as a records stream (``records*.arrows``), which ``records.compact`` then
    merges into the run folder's ``records.parquet`` as it does a real run's."""
    schema = stamped(SCHEMA, SCHEMA_VERSION)
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, schema) as w:
        w.write_table(table.replace_schema_metadata(schema.metadata))
