"""A virtual run's requests as ordinary records (``records.SCHEMA``) and its ground truth.

Each request is the record a perfect client would write against the real-time simulator: sent at
its due instant (``t_sent == t_sched``, no lag), headers at once, every output-carrying chunk
stamped at the instant its last token was emitted (the server writes a chunk when its tokens are
all out: ``answer.chunk_size``), the stream done with its last chunk, token counts from usage.
Built column by column: the per-token stamps go into Arrow as one flat array with offsets.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from loadgen.record_version import stamped
from loadgen.records import SCHEMA, SCHEMA_VERSION
from loadgen.sim.answer import SimConfig, chunk_seed, chunk_size
from loadgen.sim.virtual.requests import Unsent, VirtualRequest
from loadgen.sim.virtual.tokens import I64, TokenLog
from loadgen.workload.session import Turn

__all__ = ["records_table", "truth_table", "write_stream", "ENDPOINT"]

ENDPOINT = "sim-virtual"  # the records' endpoint label


def _chunks(
    done: Sequence[VirtualRequest], offsets: I64, times: I64, lo: int, hi: int
) -> tuple[I64, I64, npt.NDArray[np.int32]]:
    """(offsets, the instant each chunk went out, its tokens) of every request's chunks, from its
    tokens' ``offsets`` and ``times``: a chunk goes out with its last token (``answer.chunk_size``)."""
    if hi <= 1:
        return offsets, times, np.ones(len(times), np.int32)
    flat = times.tolist()
    bounds = offsets.tolist()
    ns: list[int] = []
    counts: list[int] = []
    out = [0]
    for i, r in enumerate(done):
        at, n = bounds[i], bounds[i + 1]
        if at < n:
            seed, c = chunk_seed(r.prompt_ids), 0
            while at < n:
                k = min(chunk_size(seed, c, lo, max(lo, hi)), n - at)
                at += k
                ns.append(flat[at - 1])
                counts.append(k)
                c += 1
        out.append(len(ns))
    return np.array(out, np.int64), np.array(ns, np.int64), np.array(counts, np.int32)


# what each request sent contributes to the columns, read in one C-level call per request
_FIELDS = operator.attrgetter(
    "seq", "session_id", "turn", "t_sched", "error_status", "finished", "tool_call", "tools_offered",
    "emitted", "prompt_len", "cached_tokens", "prompt_tokens_requested", "max_tokens_requested",
)  # fmt: skip


def records_table(
    done: Sequence[VirtualRequest],
    unsent: Sequence[Unsent],
    sim: SimConfig,
    tokens: TokenLog,
    *,
    run_id: str,
    point: int,
    cut_ns: int,
) -> pa.Table:
    """The records of every request sent (``done``) and every turn not sent, in ``SCHEMA``: built
    column by column with numpy, each null where the request has no value."""
    n, m = len(done), len(unsent)
    rows = list(map(_FIELDS, done))
    if rows:
        cols = [np.array(c, np.int64) for c in zip(*rows, strict=True)]
    else:
        cols = [np.zeros(0, np.int64)] * 13
    seq, session, turn, sched, status_code, fin, tool_call, tools, emitted, prompt, cached, p_req, o_req = cols
    refused, fin, tool_call, tools = status_code != 0, fin != 0, tool_call != 0, tools != 0
    tok_off, times = tokens.flatten(seq)
    if not np.array_equal(np.diff(tok_off), emitted):
        raise RuntimeError("a virtual request's emitted count differs from its logged tokens")
    lo, hi = sim.tokens_per_chunk, max(sim.tokens_per_chunk, sim.tokens_per_chunk_max)
    off, chunk_ns, chunk_tok = _chunks(done, tok_off, times, lo, hi)
    has = off[1:] > off[:-1]
    first = chunk_ns[np.minimum(off[:-1], max(len(chunk_ns) - 1, 0))] if len(chunk_ns) else np.zeros(n, np.int64)
    last = chunk_ns[np.maximum(off[1:] - 1, 0)] if len(chunk_ns) else np.zeros(n, np.int64)
    t_done = np.where(has, last, 0)
    t_done[~fin] = cut_ns
    for i in np.flatnonzero(fin & ~has & ~refused).tolist():  # finished with no tokens (none asked for)
        pe = done[i].prefill_end_ns
        t_done[i] = pe if pe is not None else sched[i]
    t_done[refused] = sched[refused]
    no = np.zeros(m, bool)
    yes = ~no
    unsent_turns = [_turn(u) for u in unsent]
    errors = [r.error or (None if r.finished else _CANCELLED) for r in done] + [u.why for u in unsent]
    # status: 0 http_error, 1 ok, 2 cancelled, 3 not_sent
    status = np.concatenate([np.where(refused, 0, np.where(fin, 1, 2)), np.full(m, 3)])
    # finish_reason: 0 tool_calls, 1 length, 2 stop, null while not finished
    finish = np.array([0 if r.finish == "length" else 1 for r in done], np.int64) + 1
    finish[tool_call] = 0
    cols_out: dict[str, pa.Array[Any]] = {
        "run_id": pa.repeat(pa.scalar(run_id, pa.string()), n + m),
        "point": pa.repeat(pa.scalar(point, pa.int32()), n + m),
        "shard": pa.repeat(pa.scalar(0, pa.int32()), n + m),
        "request": _ints(np.concatenate([seq, np.zeros(m, np.int64)]), pa.int64()),
        "session": _ints(np.concatenate([session, [u.run.session_id for u in unsent]]), pa.int64()),
        "turn": _ints(np.concatenate([turn, [u.turn for u in unsent]]), pa.int32()),
        "endpoint": pa.repeat(pa.scalar(ENDPOINT, pa.string()), n + m),
        "model": pa.repeat(pa.scalar(sim.model_name, pa.string()), n + m),
        "api": pa.repeat(pa.scalar("chat", pa.string()), n + m),
        "t_sched": _ints(np.concatenate([sched, [u.t_sched for u in unsent]]), pa.int64()),
        "t_sent": _ints(_pad(sched, m), pa.int64(), _nulls(n, m)),
        "t_headers": _ints(_pad(sched, m), pa.int64(), np.concatenate([refused, yes])),
        "t_first": _ints(_pad(first, m), pa.int64(), np.concatenate([~has, yes])),
        "t_first_content": _ints(_pad(first, m), pa.int64(), np.concatenate([~has | tool_call, yes])),
        "t_last": _ints(_pad(last, m), pa.int64(), np.concatenate([~has, yes])),
        "t_done": _ints(_pad(t_done, m), pa.int64(), _nulls(n, m)),
        "chunk_ns": pa.ListArray.from_arrays(_pad_offsets(off, m), pa.array(chunk_ns, pa.int64())),
        "chunk_tokens": pa.ListArray.from_arrays(_pad_offsets(off, m), pa.array(chunk_tok, pa.int32())),
        "prompt_tokens_requested": _ints(np.concatenate([p_req, [t.prompt_tokens for t in unsent_turns]]), pa.int32()),
        "prompt_tokens_reported": _ints(_pad(prompt, m), pa.int32(), np.concatenate([refused, yes])),
        "cached_tokens": _ints(_pad(cached, m), pa.int32(), np.concatenate([refused, yes])),
        "output_tokens_requested": _ints(np.concatenate([o_req, [t.max_tokens for t in unsent_turns]]), pa.int32()),
        "output_tokens_reported": _ints(_pad(emitted, m), pa.int32(), np.concatenate([~fin, yes])),
        "output_tokens": _ints(_pad(emitted, m), pa.int32()),
        "output_tokens_source": _strings(("usage", "chunks", "none"), np.concatenate([np.where(fin, 0, 1), [2] * m])),
        "stream_end": _strings(("done",), np.zeros(n + m, np.int64), np.concatenate([~fin, yes])),
        "finish_reason": _strings(("tool_calls", "length", "stop"), _pad(finish, m), np.concatenate([~fin, yes])),
        "tool_calls": _ints(_pad(tool_call.astype(np.int64), m), pa.int32(), np.concatenate([~(fin & tools), yes])),
        "status": _strings(("http_error", "ok", "cancelled", "not_sent"), status),
        "http_status": _ints(_pad(np.where(refused, status_code, 200), m), pa.int32(), _nulls(n, m)),
        "error": pa.array(errors, pa.string()),
    }  # fmt: skip
    arrays = [cols_out[f.name] if f.name in cols_out else pa.nulls(n + m, type=f.type) for f in SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


_CANCELLED = "cancelled: the run's drain ended"


def _pad(values: npt.NDArray[Any], m: int) -> npt.NDArray[Any]:
    """``values`` followed by ``m`` zeros (the unsent turns' places: null where it matters)."""
    return np.concatenate([values, np.zeros(m, values.dtype)])


def _nulls(n: int, m: int) -> npt.NDArray[np.bool_]:
    """No null among the ``n`` sent, nulls for the ``m`` unsent."""
    return np.concatenate([np.zeros(n, bool), np.ones(m, bool)])


def _pad_offsets(off: I64, m: int) -> pa.Int32Array:
    """A list column's offsets, with ``m`` empty lists after the sent ones."""
    return pa.array(np.concatenate([off, np.full(m, off[-1])]), pa.int32())


def _ints(values: npt.NDArray[Any], typ: pa.DataType, null: npt.NDArray[np.bool_] | None = None) -> pa.Array[Any]:
    values = np.asarray(values, np.int64)
    if null is None or not null.any():
        return pa.array(values, typ)
    return pa.array(values, typ, mask=null)


def _strings(
    words: tuple[str, ...], codes: npt.NDArray[Any], null: npt.NDArray[np.bool_] | None = None
) -> pa.Array[Any]:
    """The string column whose i-th value is ``words[codes[i]]`` (null where ``null``)."""
    index = pa.array(np.asarray(codes, np.int64), pa.int64(), mask=null if null is not None and null.any() else None)
    return pa.array(words, pa.string()).take(index)


def _turn(u: Unsent) -> Turn:
    return u.run.turns[u.turn]


def truth_table(done: Sequence[VirtualRequest]) -> pa.Table:
    """The engine's ground truth per request sent: what ``--truth`` writes, without the per-token lists."""
    return pa.table(
        {
            "rid": [r.rid for r in done],
            "arrival_ns": pa.array([r.arrival_ns for r in done], pa.int64()),
            "prompt_tokens": pa.array([r.prompt_len for r in done], pa.int32()),
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
    """Write ``table`` as a records stream (``records*.arrows``), which ``record_compact.compact`` then
    merges into the run folder's ``records.parquet`` as it does a real run's."""
    schema = stamped(SCHEMA, SCHEMA_VERSION)
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, schema) as w:
        w.write_table(table.replace_schema_metadata(schema.metadata))
