"""One load point in one process: the plan a shard sends, and the engine that sends it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen.client.config import Plan
from loadgen.client.engine import Engine
from loadgen.client.interrupts import Stopper
from loadgen.client.settings import RunSettings, engine_config
from loadgen.client.trace_cut import cut_trace
from loadgen.client.wire.choice import wire_json
from loadgen.clock import SpinMeter
from loadgen.errors import ConfigError
from loadgen.records import RecordWriter
from loadgen.redaction import Secrets
from loadgen.run_folder import STREAM_NAME
from loadgen.schedule import offsets_ns, shard_indices
from loadgen.workload.base import Workload
from loadgen.workload.rag_pipeline import pooled_stages

__all__ = ["build_plan", "run_engine", "cpu_utilisation", "MIN_JUDGED_WALL_S"]

MIN_JUDGED_WALL_S = 1.0  # shorter, the CPU share is start-up noise (a zero-length point read 101%)


def build_plan(settings: RunSettings, workload: Workload, shard: int = 0, shards: int = 1) -> Plan:
    """The sessions this shard sends, and when: a pure function of the settings.

    A trace workload (its own ``offsets_ns()``) is replayed under a ``trace`` arrival, whole
    unless ``duration_s`` / ``requests`` cut it (``trace_cut.cut_trace``); any other arrival
    with it, or a ``trace`` arrival without one, is a ``ConfigError``: nothing is ignored."""
    arrival = settings.arrival
    if arrival.kind == "closed":
        users = (arrival.concurrency or 1) // shards + (shard < (arrival.concurrency or 1) % shards)
        return Plan(
            session=workload.session, concurrency=users, count=settings.requests, duration_s=settings.duration_s
        )
    trace = workload.offsets_ns()
    if trace is not None:
        if arrival.kind != "trace":
            raise ConfigError(
                f"workload {workload.name} carries its own arrival times: arrival {arrival} would be "
                "ignored; replay it as a trace (its speed is the spec's speed)"
            )
        offs = cut_trace(trace, settings.duration_s, settings.requests).offsets_ns
    elif arrival.kind == "trace":
        raise ConfigError(
            f"arrival trace: workload {workload.name} has no arrival times of its own "
            "(only mooncake, azure and burstgpt traces do); give it a rate"
        )
    else:
        offs = offsets_ns(arrival, settings.seed, duration_s=settings.duration_s, count=settings.requests)
    return Plan(session=workload.session, offsets_ns=offs, indices=shard_indices(len(offs), shard, shards))


async def run_engine(
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
    on_engine: Callable[[Engine], None] | None = None,
    stream_name: str = STREAM_NAME,
    shard: int = 0,
    shards: int = 1,
    start_ns: int | None = None,
) -> dict[str, Any]:
    """Send one load point (or shard ``shard`` of ``shards`` of it, from a shared
    ``start_ns``); records go to ``run_dir/stream_name``. Returns client health.

    ``stopper`` (client.interrupts) is how the run is stopped: its orders, given before
    or during the run, reach this engine; signals are the caller's to route to it."""
    stages = pooled_stages(workload)
    cfg = engine_config(settings, url, model, run_id, shard=shard, shards=shards, stages=stages)
    plan = build_plan(settings, workload, shard, shards)
    stopper = stopper if stopper is not None else Stopper()
    with RecordWriter(run_dir / stream_name) as writer:
        engine = Engine(cfg, writer, api_key=api_key, secrets=secrets)
        if on_engine:
            on_engine(engine)
        loop = asyncio.get_running_loop()
        cpu0, wall0, spun0 = time.process_time(), time.perf_counter(), SpinMeter.spun_ns
        if start_ns is None:
            start_ns = time.perf_counter_ns() + 50_000_000  # 50 ms to settle before the first send
        anchor = {"wall_ns": time.time_ns(), "perf_ns": time.perf_counter_ns(), "start_perf_ns": start_ns}
        stopper.attach(engine)
        try:
            await engine.run(plan, start_ns, grace_s=settings.drain_s)
        finally:
            stopper.detach()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        spun = (SpinMeter.spun_ns - spun0) / 1e9
    return {
        "clock_anchor": anchor,
        "event_loop": "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio",
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        **cpu_utilisation(cpu - spun, wall),
        "cpu_seconds_waiting_for_send_instants": spun,
        # the client's self-check (client.loop_probe): how late its loop ran what was due (p99,
        # max) and the estimate of how late it stamped a read (p99)
        "loop_lag_p99_ms": engine.probe.lag_p99_ms,
        "loop_lag_max_ms": engine.probe.lag_max_ms,
        "loop_lag_samples": engine.probe.lag.n,  # fewer than ~100: its "p99" is the worst tick, not judged
        "read_lateness_p99_ms": engine.probe.read_p99_ms,
        "sends_delayed_by_max_inflight": engine.live.capped,
        "interrupted": stopper.stopped,
        "stop_reason": stopper.reason,
        "drain_cut": stopper.cut,
        "cut_inflight": stopper.cut_inflight,
        "records": writer.written,
        # what the writer had to bound or degrade to keep every record (records.py)
        "records_degraded": writer.degraded,
        "records_bounded": writer.bounded,
        "records_unwritten": writer.unwritten,
        "record_write_failures": writer.write_failures,
        **engine.live.health(),
        # what was sent, as fingerprints (client.fingerprint): compare's identical-traffic check
        **engine.traffic.health(),
        "shard": shard,
        # reads stamped in aiohttp's protocol and requests held to their instants; when false, why not
        "fast_read": engine.fast_path.ok,
        "fast_read_why_not": engine.fast_path.why,
        # the wire that carried the run (--transport) and, when not the one asked for, why (client.wire.choice)
        **wire_json(engine.wire, engine.transport),
    }


def cpu_utilisation(busy_s: float, wall_s: float) -> dict[str, Any]:
    """The client's CPU share of one core (yielding while waiting for a send instant is not
    load: it is left out of ``busy_s``); too short a run to judge gives the reason instead."""
    if wall_s < MIN_JUDGED_WALL_S:
        return {"cpu_utilisation_why_not": f"the point lasted {wall_s:.2f} s, too short to judge the client's CPU"}
    return {"cpu_utilisation": max(busy_s, 0.0) / wall_s}
