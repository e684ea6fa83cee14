"""One distributed point's client health, as run.json keeps it: the workers' merged, each worker listed.

The merge is ``--workers N``'s (``client.shards``): the busiest worker's CPU and loop lag,
the sum of the counts, the traffic fingerprints summed (so a distributed run of a seed
has a single process's fingerprint). On top of it: the master's clock anchor (every
record is on the master's monotonic clock), each worker's host, pids, shard, clock offset
and uncertainty, its own schedule lag p99 (from its records) and CPU, the workers lost
(with the ``not_sent`` records written for them), what the master took in, and a warning
when a clock's uncertainty is large against the schedule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from loadgen.client.settings import RunSettings
from loadgen.client.shards import merge_health
from loadgen.distributed.clock_sync import ClockOffset, offset_warning
from loadgen.distributed.lost import lost_reason, write_lost
from loadgen.records import read_stream
from loadgen.workload.base import Workload

__all__ = ["merge_point", "lag_p99_ms"]


def lag_p99_ms(stream: Path | None) -> float | None:
    """Schedule lag p99 (ms, nearest rank) of the requests sent in a worker's stream."""
    if stream is None or not stream.exists():
        return None
    d = read_stream(stream).select(["t_sched", "t_sent"]).to_pydict()
    lag = sorted((s - t) / 1e6 for t, s in zip(d["t_sched"], d["t_sent"], strict=True) if s is not None)
    if not lag:
        return None
    return float(lag[min(len(lag) - 1, int(np.ceil(0.99 * len(lag))) - 1)])


def merge_point(
    result: dict[str, Any],
    settings: RunSettings,
    workload: Workload,
    run_dir: Path,
    *,
    run_id: str,
    stem: str,
    url: str,
    model: str,
) -> dict[str, Any]:
    shards = result["shards"]
    n = len(shards)
    clients: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    offsets: dict[int, ClockOffset] = {}
    for sh in shards:
        i, worker = int(sh["shard"]), sh["worker"]
        stream = run_dir / sh["stream"] if sh.get("stream") else None
        offsets[i] = ClockOffset(
            int(worker["clock_offset_ms"] * 1e6), int(worker["clock_uncertainty_ms"] * 1e6), worker["clock_samples"]
        )
        about = {
            "shard": i,
            "host": worker.get("host"),
            "worker_pid": worker.get("pid"),
            "engine_pid": sh.get("engine_pid"),
            "cpus": worker.get("cpus"),
            **{k: worker[k] for k in ("clock_offset_ms", "clock_uncertainty_ms", "clock_samples")},
            "schedule_lag_p99_ms": lag_p99_ms(stream),
            "relay_cpu_seconds": sh.get("relay_cpu_seconds"),
            "records_received": sh["records_received"],
            "chunks_received": sh["chunks_received"],
        }
        why = sh.get("lost") or (sh.get("error") if sh.get("client") is None else None)
        if why or sh.get("client") is None:
            why = why or "it sent no client health"
            missing = write_lost(
                settings,
                workload,
                shard=i,
                shards=n,
                stream=stream,
                out=run_dir / f"{stem}-w{i:02d}-lost.arrows",
                run_id=run_id,
                url=url,
                model=model,
                start_perf_ns=int(result["start_perf_ns"]),
                reason=lost_reason(i, worker.get("host"), why),
            )
            lost.append({"shard": i, "host": worker.get("host"), "reason": why, "not_sent": missing})
            clients.append({**about, "crashed": True, "lost": why, "records": sh["records_received"] + missing})
        else:
            clients.append({**sh["client"], **about})
    merged = merge_health(clients)
    start = int(result["start_perf_ns"])
    merged["clock_anchor"] = {"wall_ns": int(result["start_wall_ns"]), "perf_ns": start, "start_perf_ns": start}
    merged["not_sent"] = merged.get("not_sent", 0) + sum(x["not_sent"] for x in lost)
    merged["workers_lost"] = lost
    warning = offset_warning(offsets, settings.arrival.rate, settings.lag_limit_ms)
    merged["distributed"] = {
        "workers": n,
        "ingest": result.get("ingest"),
        "clock_warning": warning,
    }
    return merged
