"""``loadgen run --sim-virtual``: one load point in virtual time, written as an ordinary run folder.

No server starts and no client runs: the workload and the schedule go straight into the
simulated engine (``sim.virtual``), and its records are written and compacted as a real run's
are, so ``report``, ``gate`` and ``compare`` read the folder as any other. run.json says first,
under ``virtual``, that the run is virtual (its endpoint is ``sim-virtual``, its times virtual ns).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen.client.run import command_line, host_info, new_run_id
from loadgen.client.settings import RunResult, RunSettings, settings_json
from loadgen.record_compact import compact
from loadgen.records import tool_info
from loadgen.redaction import Secrets
from loadgen.run_folder import make_folder, mark_finished, write_json
from loadgen.sim.virtual import VirtualRun, simulate_point
from loadgen.sim.virtual.table import ENDPOINT, write_stream
from loadgen.workload.base import Workload
from loadgen.workload.salt import Salt, salt_of

if TYPE_CHECKING:
    from loadgen.sim.answer import SimConfig
    from loadgen.sim.roofline import RooflineModel

__all__ = ["execute_virtual", "virtual_point", "VIRTUAL_NOTE"]

VIRTUAL_NOTE = (
    "virtual time: no server and no client ran; the simulated engine was stepped on a virtual clock "
    "and every request recorded as a perfect client would see it (no client lag, no network)"
)


def virtual_point(
    settings: RunSettings, workload: Workload, engine: RooflineModel, sim: SimConfig, run_id: str
) -> VirtualRun:
    """One point of ``settings`` (its arrival, duration or count, seed, drain) in virtual time."""
    return simulate_point(
        workload,
        settings.arrival,
        engine,
        run_id=run_id,
        seed=settings.seed,
        duration_s=settings.duration_s,
        requests=settings.requests,
        point=settings.point,
        sim=sim,
        api=settings.api,
        drain_s=settings.drain_s,
        ignore_eos=settings.ignore_eos,
    )


def client_block(vr: VirtualRun) -> dict[str, Any]:
    """run.json's ``client`` block of a virtual point: what ran instead of a client."""
    return {"virtual": True, "records": vr.records.num_rows, "wall_s": round(vr.wall_s, 3)}


def execute_virtual(
    settings: RunSettings,
    workload: Workload,
    out: Path,
    *,
    engine: RooflineModel,
    sim: SimConfig,
    sim_flags: list[str],
    force: bool = False,
    salt: Salt | None = None,
) -> RunResult:
    """Run once in virtual time: records written and compacted, run.json complete."""
    make_folder(out, force=force)
    run_id = new_run_id()
    started = time.time_ns()
    vr = virtual_point(settings, workload, engine, sim, run_id)
    client = client_block(vr)
    write_stream(vr.records, out / "records.arrows")
    compact(out)
    meta = {
        "virtual": {"note": VIRTUAL_NOTE, **vr.describe()},
        **(salt or salt_of(workload.describe())).json(),
        "run_id": run_id,
        "tool": tool_info(),
        "command": command_line(sys.argv[1:], Secrets()),
        "endpoint": ENDPOINT,
        "simulator": {"flags": sim_flags, "virtual": True, **engine.describe()},
        "model": sim.model_name,
        "settings": settings_json(settings),
        "workload": workload.describe(),
        "host": host_info(),
        "started_wall_ns": started,
        "client": client,
        "finished_wall_ns": time.time_ns(),
    }
    mark_finished(meta)
    write_json(out / "run.json", meta)
    return RunResult(out, run_id, vr.records.num_rows, client)
