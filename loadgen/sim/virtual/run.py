"""The entry points of a virtual run: ``simulate`` (sessions and instants in, records out) and
``simulate_point`` (one sweep point's schedule, then ``simulate``). See the package's note."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from loadgen.errors import ConfigError
from loadgen.schedule import Arrival, offsets_ns
from loadgen.sim.answer import SimConfig
from loadgen.sim.virtual.loop import VirtualLoop
from loadgen.sim.virtual.table import records_table, truth_table
from loadgen.workload.base import Workload

if TYPE_CHECKING:
    from loadgen.sim.roofline import RooflineModel

__all__ = ["VirtualRun", "simulate", "simulate_point", "ORIGIN_NS"]

# The virtual clock's reading at the run's start: records' times are ns on it (never 0, which
# some readers would take for a missing stamp).
ORIGIN_NS = 1_000_000_000


@dataclass(frozen=True)
class VirtualRun:
    """What a virtual run produced: its records, the engine's ground truth and counters."""

    records: pa.Table  # records.SCHEMA, endpoint "sim-virtual", times in virtual ns
    truth: pa.Table  # per request sent: rid, arrival/queue/prefill instants, cached tokens, preemptions
    stats: dict[str, float]  # the engine's counters (RooflineModel.stats() keys)
    end_ns: int  # the virtual instant the last step ended
    wall_s: float  # what it cost on this machine's clock

    def describe(self) -> dict[str, Any]:
        """A line for run.json: that the run is virtual, and its engine's figures."""
        return {
            "virtual": True,
            "virtual_seconds": round((self.end_ns - ORIGIN_NS) / 1e9, 6),
            "wall_seconds": round(self.wall_s, 3),
            "requests": self.records.num_rows,
            "engine": self.stats,
        }


def simulate(
    workload: Workload,
    offsets_ns: npt.NDArray[np.int64] | None,
    engine: RooflineModel,
    *,
    run_id: str,
    seed: int = 0,
    sim: SimConfig | None = None,
    point: int = 0,
    api: str = "chat",
    concurrency: int | None = None,
    duration_ns: int | None = None,
    max_requests: int | None = None,
    drain_ns: int | None = None,
    ignore_eos: bool = True,
) -> VirtualRun:
    """Run ``workload`` into ``engine`` in virtual time (the package's note says how).

    ``seed`` is the run's (the workload and schedule already carry it; kept for run.json);
    ``api`` must be chat or completions (the same prompt either way); ``max_requests`` caps the
    sessions started (a session's later turns still go). ``engine`` is consumed: pass a fresh one."""
    if api not in ("chat", "completions"):
        raise ConfigError(f"--sim-virtual models the chat and completions APIs, not {api}")
    if (offsets_ns is None) == (concurrency is None):
        raise ConfigError("a virtual run needs either arrival offsets (open loop) or a concurrency (closed loop)")
    if engine._task is not None:
        raise ConfigError("the engine is running in real time: a virtual run needs a fresh one")
    cfg = sim or SimConfig(model_name=engine.model.name)
    # no drain limit (or no duration): every request sent runs to its end
    cut = duration_ns + drain_ns if duration_ns is not None and drain_ns is not None else None
    t0 = time.perf_counter()
    loop = VirtualLoop(
        workload,
        engine,
        cfg,
        run_id=run_id,
        origin_ns=ORIGIN_NS,
        offsets_ns=offsets_ns,
        concurrency=concurrency,
        duration_ns=duration_ns,
        cut_ns=cut,
        max_sessions=max_requests,
        ignore_eos=ignore_eos,
    )
    with _no_cyclic_gc():
        loop.run()
        cut_at = ORIGIN_NS + cut if cut is not None else loop.end_ns
        records = records_table(loop.done, loop.unsent, cfg, loop.tokens, run_id=run_id, point=point, cut_ns=cut_at)
        truth = truth_table(loop.done)
        end_ns = loop.end_ns
        del loop  # its requests go now, by reference counting, before the collector is back
    if api != "chat":
        records = records.set_column(records.schema.get_field_index("api"), "api", pa.array([api] * records.num_rows))
    return VirtualRun(records, truth, dict(engine.stats()), end_ns, time.perf_counter() - t0)


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a run goes. A run's requests, sequences and sessions
    point one way, so passes over its millions of live objects would find nothing, yet cost a tenth
    of the run; reference counting frees them as before. The one cycle is the engine's (it holds a
    bound method of its own), so the engine, with its pool, waits for the collector, which is back
    on (if it was) when the run ends."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def simulate_point(
    workload: Workload,
    arrival: Arrival,
    engine: RooflineModel,
    *,
    run_id: str,
    seed: int,
    duration_s: float | None,
    requests: int | None = None,
    point: int = 0,
    sim: SimConfig | None = None,
    api: str = "chat",
    drain_s: float = 30.0,
    ignore_eos: bool = True,
) -> VirtualRun:
    """One load point: ``arrival``'s schedule over ``duration_s`` and/or ``requests`` (as
    ``client.point.build_plan`` derives it: drawn from ``seed``; a trace's own instants, cut at the
    duration; closed loop: that many users, ``requests`` sessions in all), then ``simulate``;
    requests still running ``drain_s`` after the duration are cancelled."""
    duration_ns = None if duration_s is None else int(duration_s * 1e9)
    offs: npt.NDArray[np.int64] | None = None
    users = None
    if arrival.kind == "closed":
        users = arrival.concurrency
    elif arrival.kind == "trace":
        trace = workload.offsets_ns()
        if trace is None:
            raise ConfigError(f"arrival trace: workload {workload.name} has no arrival times of its own")
        speed = arrival.speed or 1.0
        scaled = (np.asarray(trace, dtype=np.float64) / speed).astype(np.int64)
        offs = scaled if duration_ns is None else scaled[scaled < duration_ns]
        offs = offs if requests is None else offs[:requests]
    else:
        offs = offsets_ns(arrival, seed, duration_s=duration_s, count=requests)
    return simulate(
        workload,
        offs,
        engine,
        run_id=run_id,
        seed=seed,
        sim=sim,
        point=point,
        api=api,
        concurrency=users,
        duration_ns=duration_ns,
        max_requests=requests if users is not None else None,
        drain_ns=int(drain_s * 1e9),
        ignore_eos=ignore_eos,
    )
