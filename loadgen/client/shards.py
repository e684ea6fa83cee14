"""Several client processes sending one schedule together.

Each worker process runs the same engine on shard i of n of the schedule
(sessions i, i+n, ...) against one shared start instant on the monotonic clock
(CLOCK_MONOTONIC is system-wide on Linux, so ``perf_counter_ns`` agrees across
processes). Each writes its own record stream; the run folder compacts them
into one ``records.parquet``.

A worker lives and stops by its parent (loadgen.lifeline): it ignores SIGINT (a
terminal's Ctrl-C reaches the parent, whose stopper forwards the stop over each
worker's lifeline, and a second Ctrl-C as a cut), drains on a SIGTERM sent to it
alone, and dies at once when the parent dies, however (the parent-death signal, and
end of file on its lifeline). ``daemon=True`` alone would not do: it only acts when
the parent exits normally.

While it runs, a worker sends its engine's counters (``LiveCounters.snapshot()``, a few
KiB) over its pipe every ``LIVE_EVERY_S``; the parent passes each to ``on_live`` (the
live view merges them) until the worker's last message, its client health.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess
from pathlib import Path
from types import FrameType
from typing import Any

from loadgen import clock
from loadgen.client.config import LiveCounters
from loadgen.client.engine import Engine
from loadgen.client.fingerprint import merge_traffic
from loadgen.client.interrupts import Stopper
from loadgen.client.point import run_engine
from loadgen.client.settings import RunSettings
from loadgen.lifeline import STOP, Lifelines, hold, pdeathsig_safe
from loadgen.redaction import Secrets
from loadgen.workload.base import Workload

__all__ = ["run_sharded", "merge_health"]

_READY_TIMEOUT_S = 120.0
_EXIT_TIMEOUT_S = 10.0
LIVE_EVERY_S = 0.5  # how often a worker sends its counters to the parent's live view


def _worker(
    conn: Connection,
    lifeline: Connection,
    parent_pid: int,
    pdeathsig: bool,
    settings: RunSettings,
    workload: Workload,
    url: str,
    model: str,
    run_dir: str,
    run_id: str,
    api_key: str | None,
    secrets: Secrets,
    shard: int,
    shards: int,
    stem: str,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards a Ctrl-C
    stopper = Stopper()
    hold(lifeline.fileno(), parent_pid, pdeathsig=pdeathsig, on_order=stopper.order)

    def on_term(signum: int, frame: FrameType | None) -> None:
        stopper.order(STOP, "SIGTERM")  # a cut comes only from the parent

    signal.signal(signal.SIGTERM, on_term)
    conn.send("ready")
    start_ns = conn.recv()
    reporters: list[asyncio.Task[None]] = []  # held here: the loop keeps only a weak reference
    client = clock.run(
        run_engine(
            settings,
            workload,
            url,
            model,
            Path(run_dir),
            run_id,
            api_key=api_key,
            secrets=secrets,
            stopper=stopper,
            stream_name=f"{stem}-w{shard:02d}.arrows",
            shard=shard,
            shards=shards,
            start_ns=start_ns,
            on_engine=lambda engine: reporters.append(asyncio.get_running_loop().create_task(_report(conn, engine))),
        )
    )  # the loop's end cancels the reporter, so the health below is the last message
    conn.send(client)
    conn.close()


async def _report(conn: Connection, engine: Engine) -> None:
    """Send the engine's counters to the parent every LIVE_EVERY_S, on the engine's own loop (so a
    snapshot is never taken halfway through an update)."""
    while True:
        await asyncio.sleep(LIVE_EVERY_S)
        conn.send(engine.live.snapshot())


def run_sharded(
    settings: RunSettings,
    workload: Workload,
    url: str,
    model: str,
    run_dir: Path,
    run_id: str,
    *,
    api_key: str | None,
    secrets: Secrets | None = None,
    stopper: Stopper | None = None,
    stem: str = "records",
    on_live: Callable[[int, LiveCounters], None] | None = None,
) -> dict[str, Any]:
    """Run the point over ``settings.workers`` processes; returns the merged client health.
    ``stopper``'s orders (given before or during the point) are forwarded to every worker;
    ``on_live(shard, counters)`` gets each worker's counters as they come (twice a second)."""
    ctx = mp.get_context("spawn")
    n = settings.workers
    secrets = secrets if secrets is not None else Secrets.of(api_key=api_key, url=url)
    stopper = stopper if stopper is not None else Stopper()
    lifelines = Lifelines()
    pipes: list[Connection] = []
    procs: list[SpawnProcess] = []
    pdeathsig = pdeathsig_safe()
    try:
        for i in range(n):
            parent, child = ctx.Pipe()
            theirs, ours = ctx.Pipe(duplex=False)
            lifelines.adopt(os.dup(ours.fileno()))
            ours.close()
            args = (child, theirs, os.getpid(), pdeathsig, settings, workload, url, model, str(run_dir), run_id)
            p = ctx.Process(target=_worker, args=(*args, api_key, secrets, i, n, stem), daemon=True)
            p.start()
            child.close()
            theirs.close()
            pipes.append(parent)
            procs.append(p)
        stopper.forward(lifelines)  # an order given while they started reaches them now
        for conn in pipes:
            if not conn.poll(_READY_TIMEOUT_S) or conn.recv() != "ready":
                raise RuntimeError("a worker process did not start")
        start_ns = time.perf_counter_ns() + 100_000_000
        for conn in pipes:
            conn.send(start_ns)
        clients = _collect(pipes, on_live)
        for p in procs:
            p.join(_EXIT_TIMEOUT_S)
    finally:
        stopper.forward(None)
        lifelines.close()  # a worker still running ends at once
        for p in procs:
            p.join(1.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
    return merge_health(clients)


# Counters each worker reports that add up over the workers.
_SUMMED = (
    "records_degraded",
    "records_bounded",
    "records_unwritten",
    "record_write_failures",
    "not_sent",
    "housekeeping_errors",
    "writer_errors",
    "internal_errors",
)


# The client self-check figures of each worker (loop_probe.py): the run takes the worst.
_WORST = ("loop_lag_p99_ms", "loop_lag_max_ms", "read_lateness_p99_ms")


def _collect(pipes: list[Connection], on_live: Callable[[int, LiveCounters], None] | None) -> list[dict[str, Any]]:
    """Each worker's client health (its last message), passing on the counters it sends before."""
    clients: dict[int, dict[str, Any]] = {}
    while len(clients) < len(pipes):
        ready = wait([c for i, c in enumerate(pipes) if i not in clients])
        for i, conn in enumerate(pipes):
            if i in clients or conn not in ready:
                continue
            try:
                msg = conn.recv()
            except EOFError:
                clients[i] = {"shard": i, "crashed": True, "records": 0}
                continue
            if isinstance(msg, LiveCounters):
                if on_live is not None:
                    on_live(i, msg)
            else:
                clients[i] = msg
    return [clients[i] for i in range(len(pipes))]


def merge_health(clients: list[dict[str, Any]]) -> dict[str, Any]:
    """One point's client health from its shards' (``--workers N`` here, a distributed run's workers)."""
    ok = [c for c in clients if not c.get("crashed")]
    wall = max((c["wall_seconds"] for c in ok), default=0.0)
    judged = [c["cpu_utilisation"] for c in ok if "cpu_utilisation" in c]
    why_not = next((c["cpu_utilisation_why_not"] for c in ok if "cpu_utilisation_why_not" in c), None)
    reasons = [c["stop_reason"] for c in ok if c.get("stop_reason")]
    return {
        "clock_anchor": ok[0]["clock_anchor"] if ok else {},
        "cpu_seconds": sum(c["cpu_seconds"] for c in ok),
        "wall_seconds": wall,
        # the busiest worker decides whether the client distorted the timing
        **({"cpu_utilisation": max(judged)} if judged else {"cpu_utilisation_why_not": why_not or "no worker ran"}),
        # the worst worker's self-check: its late stamps are in the run's records
        **{key: max((c.get(key, 0.0) for c in ok), default=0.0) for key in _WORST},
        "loop_lag_samples": min((c.get("loop_lag_samples", 0) for c in ok), default=0),
        "sends_delayed_by_max_inflight": sum(c["sends_delayed_by_max_inflight"] for c in ok),
        "interrupted": any(c.get("interrupted") for c in ok),
        "stop_reason": reasons[0] if reasons else None,
        "drain_cut": any(c.get("drain_cut") for c in ok),
        "cut_inflight": sum(c.get("cut_inflight", 0) for c in ok),
        "fast_read": all(c.get("fast_read", True) for c in ok),  # each worker's reason is under "workers"
        "transport": ok[0].get("transport", "") if ok else "",  # every worker is configured alike
        "transport_fallback": ok[0].get("transport_fallback", "") if ok else "",
        "records": sum(c.get("records", 0) for c in clients),
        **{key: sum(c.get(key, 0) for c in ok) for key in _SUMMED},
        **merge_traffic(clients),
        "workers": clients,
    }
