"""A lost worker's shard in the records: every request of it with no record home is ``not_sent``.

Every scheduled request ends as exactly one record (records.py). When a worker is lost
mid-point (it stopped heartbeating, or its engine died), the master holds the records
it had received, at most one flush and one relay interval short of what the worker
measured; the rest of the shard's schedule is rebuilt here from the plan (a pure function
of the settings: ``client.point.build_plan``) and recorded ``not_sent``, with the reason
and the request's planned instant on the master's clock. A request the worker may have
sent whose record never came home is among them: the error says so. A closed loop has no
planned instants to rebuild; its loss is recorded in run.json only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from loadgen.client.endpoint import endpoint_label
from loadgen.client.point import build_plan
from loadgen.client.settings import RunSettings
from loadgen.records import Record, RecordWriter, read_stream
from loadgen.workload.base import Workload
from loadgen.workload.session import Session, Turn

__all__ = ["write_lost", "lost_reason"]


def lost_reason(shard: int, host: str | None, why: str) -> str:
    return (
        f"not sent: worker {shard} ({host or 'unknown host'}) was lost: {why}; "
        "no record of this request came home (it may have been sent)"
    )


def _turns(session: Session) -> Iterator[tuple[int, int, Turn]]:
    """(session id, turn number, turn) of ``session`` and of its subagent sessions, children first."""
    for k, turn in enumerate(session.turns):
        for child in turn.children:
            yield from _turns(child)
        yield session.session, k, turn


def _present(stream: Path | None) -> tuple[set[tuple[int, int]], set[int]]:
    if stream is None or not stream.exists():
        return set(), set()
    table: pa.Table = read_stream(stream).select(["session", "turn", "request"])
    d = table.to_pydict()
    return set(zip(d["session"], d["turn"], strict=True)), set(d["request"])


def write_lost(
    settings: RunSettings,
    workload: Workload,
    *,
    shard: int,
    shards: int,
    stream: Path | None,
    out: Path,
    run_id: str,
    url: str,
    model: str,
    start_perf_ns: int,
    reason: str,
) -> int:
    """Write a ``not_sent`` record to ``out`` for each request of shard ``shard`` of ``shards``
    that ``stream`` (the master's copy of its records) lacks; returns how many."""
    plan = build_plan(settings, workload, shard, shards)
    if plan.offsets_ns is None or plan.indices is None:
        return 0
    present, used = _present(stream)
    used_k = {(r - shard) // shards for r in used}
    next_k = max(used_k, default=-1) + 1
    label = endpoint_label(url)
    written = 0
    with RecordWriter(out) as writer:
        for k, idx in enumerate(plan.indices.tolist()):
            session = plan.session(int(idx))
            t_sched = start_perf_ns + int(plan.offsets_ns[idx])
            single = len(session.turns) == 1 and not session.turns[0].children
            for sid, turn_no, turn in _turns(session):
                if (sid, turn_no) in present:
                    continue
                if single and k not in used_k:
                    seq_k = k  # the engine numbers a one-turn session's request by its place in the shard
                else:
                    seq_k, next_k = next_k, next_k + 1
                rec = Record(
                    run_id=run_id,
                    point=settings.point,
                    shard=shard,
                    request=shard + shards * seq_k,
                    session=sid,
                    turn=turn_no,
                    endpoint=label,
                    model=model,
                    api=turn.api or settings.api,
                    t_sched=t_sched,
                    prompt_tokens_requested=turn.prompt_tokens or None,
                    output_tokens_requested=turn.max_tokens,
                    status="not_sent",
                    error=reason,
                    stage=turn.stage or None,
                )
                writer.add(rec)
                written += 1
    return written
