"""Several client processes sending one schedule together.

Each worker process runs the same engine on shard i of n of the schedule
(sessions i, i+n, ...) against one shared start instant on the monotonic clock
(CLOCK_MONOTONIC is system-wide on Linux, so ``perf_counter_ns`` agrees across
processes). Each writes its own record stream; the run folder compacts them
into one ``records.parquet``.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

from loadgen import clock
from loadgen.client.point import run_engine
from loadgen.client.settings import RunSettings
from loadgen.workload.base import Workload

__all__ = ["run_sharded"]

_READY_TIMEOUT_S = 120.0


def _worker(
    conn: Connection,
    settings: RunSettings,
    workload: Workload,
    url: str,
    model: str,
    run_dir: str,
    run_id: str,
    api_key: str | None,
    shard: int,
    shards: int,
    stem: str,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the engine installs its own handler
    conn.send("ready")
    start_ns = conn.recv()
    client = clock.run(
        run_engine(
            settings,
            workload,
            url,
            model,
            Path(run_dir),
            run_id,
            api_key=api_key,
            stream_name=f"{stem}-w{shard:02d}.arrows",
            shard=shard,
            shards=shards,
            start_ns=start_ns,
        )
    )
    conn.send(client)
    conn.close()


def run_sharded(
    settings: RunSettings,
    workload: Workload,
    url: str,
    model: str,
    run_dir: Path,
    run_id: str,
    *,
    api_key: str | None,
    stem: str = "records",
) -> dict[str, Any]:
    """Run the point over ``settings.workers`` processes; returns the merged client health."""
    ctx = mp.get_context("spawn")
    n = settings.workers
    pipes: list[Connection] = []
    procs: list[SpawnProcess] = []
    for i in range(n):
        parent, child = ctx.Pipe()
        p = ctx.Process(
            target=_worker,
            args=(child, settings, workload, url, model, str(run_dir), run_id, api_key, i, n, stem),
            daemon=True,
        )
        p.start()
        pipes.append(parent)
        procs.append(p)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # workers get Ctrl-C from the terminal themselves
    try:
        for conn in pipes:
            if not conn.poll(_READY_TIMEOUT_S) or conn.recv() != "ready":
                raise RuntimeError("a worker process did not start")
        start_ns = time.perf_counter_ns() + 100_000_000
        for conn in pipes:
            conn.send(start_ns)
        clients: list[dict[str, Any]] = []
        for conn, p in zip(pipes, procs, strict=False):
            try:
                clients.append(conn.recv())
            except EOFError:
                clients.append({"shard": len(clients), "crashed": True, "records": 0})
            p.join(10)
    finally:
        signal.signal(signal.SIGINT, previous)
        for p in procs:
            if p.is_alive():
                p.terminate()
    return _merge(clients)


def _merge(clients: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [c for c in clients if not c.get("crashed")]
    wall = max((c["wall_seconds"] for c in ok), default=0.0)
    return {
        "clock_anchor": ok[0]["clock_anchor"] if ok else {},
        "cpu_seconds": sum(c["cpu_seconds"] for c in ok),
        "wall_seconds": wall,
        # the busiest worker decides whether the client distorted the timing
        "cpu_utilisation": max((c["cpu_utilisation"] for c in ok), default=0.0),
        "loop_lag_max_ms": max((c["loop_lag_max_ms"] for c in ok), default=0.0),
        "sends_delayed_by_max_inflight": sum(c["sends_delayed_by_max_inflight"] for c in ok),
        "interrupted": any(c.get("interrupted") for c in ok),
        "fast_read": all(c.get("fast_read", True) for c in ok),  # each worker's reason is under "workers"
        "records": sum(c.get("records", 0) for c in clients),
        "workers": clients,
    }
