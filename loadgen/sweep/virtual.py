"""``loadgen sweep --sim-virtual``: every point of the plan (or the search) in virtual time.

The sweep's plan, search, salts, windows and run.json are ``sweep.run``'s; only the sending
differs: no server starts and no client runs, each point's schedule goes into a fresh simulated
engine stepped on a virtual clock (``client.virtual_run.virtual_point``), and its records are
written as the point's ``records-pNNN.arrows`` and compacted with the others. run.json says first,
under ``virtual``, that the sweep is virtual.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen.analysis.metrics import summarize
from loadgen.analysis.points import point_window
from loadgen.analysis.saturation import observe
from loadgen.analysis.validity import Caveat, Validity, point_caveats
from loadgen.client.interrupts import Stopper
from loadgen.client.run import finish_state, new_run_id, start_state
from loadgen.client.virtual_run import VIRTUAL_NOTE, client_block, virtual_point
from loadgen.record_compact import compact
from loadgen.redaction import Secrets
from loadgen.run_folder import make_folder, write_json
from loadgen.sim.virtual.table import ENDPOINT, write_stream
from loadgen.sweep.run import (
    PointResult,
    SweepResult,
    SweepSettings,
    _check_sweepable,
    _history,
    _meta,
    _point_json,
    _point_settings,
    _steps,
    point_salt,
)
from loadgen.sweep.search import search_end
from loadgen.workload.base import Workload
from loadgen.workload.salt import resolve_salt

if TYPE_CHECKING:
    from loadgen.sim.answer import SimConfig
    from loadgen.sim.roofline import RooflineModel

__all__ = ["run_sweep_virtual"]


def run_sweep_virtual(
    settings: SweepSettings,
    make_workload: Callable[[str], Workload],
    out: Path,
    *,
    engine: Callable[[], tuple[RooflineModel, SimConfig]],
    sim_flags: list[str],
    on_point: Callable[[PointResult], None] | None = None,
    force: bool = False,
) -> SweepResult:
    """Run every point in virtual time (``engine()`` gives each point a fresh engine), then compact."""
    salt = resolve_salt(settings.salt)
    settings = replace(settings, salt=salt.text)
    _check_sweepable(make_workload(point_salt(settings, 0)))
    make_folder(out, force=force)
    run_id = new_run_id()
    probe, sim = engine()
    meta = _meta(
        settings, make_workload(settings.salt or ""), ENDPOINT, True, sim.model_name, run_id, sim_flags, Secrets()
    )
    meta = {"virtual": {"note": VIRTUAL_NOTE, "virtual": True}, **salt.json(), **meta}
    meta["endpoint"] = ENDPOINT
    meta["simulator"] = {"flags": sim_flags, "virtual": True, **probe.describe()}
    start_state(meta)
    write_json(out / "run.json", meta)
    result = SweepResult(out, run_id, [])
    wall = time.perf_counter()
    while (step := _steps(settings, _history(result))) is not None:
        k = len(result.points)
        entry = start_state(_point_json(settings, step, k, None))
        meta["points"].append(entry)
        point, vr_meta = _point(settings, step, k, make_workload(point_salt(settings, k)), engine, out, run_id)
        result.points.append(point)
        entry.update(_point_json(settings, step, k, point))
        entry["virtual"] = vr_meta
        finish_state(entry, Stopper())
        write_json(out / "run.json", meta)
        if on_point:
            on_point(point)
    if settings.plan.mode == "auto":
        meta["sweep"]["search_end"] = search_end(settings.plan.auto, _history(result), settings.plan.sizing)
    compact(out)
    meta["virtual"]["wall_seconds"] = round(time.perf_counter() - wall, 3)
    meta["finished_wall_ns"] = time.time_ns()
    write_json(out / "run.json", finish_state(meta, Stopper()))
    return result


def _point(
    settings: SweepSettings,
    step: Any,
    k: int,
    workload: Workload,
    engine: Callable[[], tuple[RooflineModel, SimConfig]],
    out: Path,
    run_id: str,
) -> tuple[PointResult, dict[str, Any]]:
    """One point in virtual time, summarised as ``sweep.run._run_point`` summarises a sent one."""
    ps = _point_settings(settings, step, k)
    eng, sim = engine()
    vr = virtual_point(ps, workload, eng, sim, run_id)
    write_stream(vr.records, out / f"records-p{k:03d}.arrows")
    client = client_block(vr)
    window, problem = point_window(vr.records, ps.warmup_s)
    summary = summarize(vr.records, window, settings.slo)
    rate = step.rate if step.arrival.kind != "closed" else summary.offered_rps
    caveats = point_caveats({"phase": step.phase, "client": client}, summary, settings.base.lag_limit_ms)
    caveats += [Caveat("window_fallback", problem)] if problem else []
    obs = observe(summary, rate, settings.base.lag_limit_ms, client=client, validity=Validity.of(caveats))
    return PointResult(k, step, summary, obs, client, caveats), vr.describe()
