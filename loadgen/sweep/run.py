"""Run a sweep: bring the target up once, send each load point, keep one run folder.

Each point is a ``client.run.run_point`` call with its own arrival, a warm-up, a
measurement window (fixed, or sized by the plan to hold the samples its p99 verdicts
need; run.json records the sizing and, per point, which cap cut it short) and a bounded drain; its records go to
``records-pNNN.arrows`` (the ``point`` column says which) and are compacted
with the others into one ``records.parquet``. Between points the search
(``search.next_step``) sees only the point's Observation, so it is replayable.
Prompts carry the sweep's salt (fresh for each sweep unless ``--salt`` replays one) and a
per-point part, so prefix-cache state cannot carry from one point into the next, nor from
an earlier sweep into this one (ENDPOINTS.md, "where tools measure wrong" 9).

Like a run, the sweep's run.json says ``state: running`` while it runs and is
finalised ``complete`` or ``interrupted`` (with ``interrupted_reason``), and so is
each point's entry: a point stopped by SIGINT or SIGTERM is kept, marked
``interrupted``, and no further point is sent. One ``Stopper`` takes the signals of
the whole sweep (client.interrupts).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from loadgen.analysis.metrics import SLO, Summary, summarize
from loadgen.analysis.pipeline import pipeline_view
from loadgen.analysis.points import PointJson, point_window, slo_to_json
from loadgen.analysis.saturation import Observation, observe
from loadgen.analysis.validity import Caveat, Validity, point_caveats
from loadgen.client.config import LiveCounters
from loadgen.client.endpoint import endpoint_label
from loadgen.client.engine import Engine
from loadgen.client.interrupts import Stopper, catching_signals
from loadgen.client.preflight import preflight
from loadgen.client.run import (
    cancelled_at_cut,
    command_line,
    every_request_failed,
    finish_state,
    for_target,
    host_info,
    new_run_id,
    run_point,
    scraping_server_metrics,
    simulator_health,
    start_state,
    target,
)
from loadgen.client.settings import RunSettings, settings_json
from loadgen.client.usage_probe import resolved
from loadgen.errors import ConfigError
from loadgen.record_compact import compact
from loadgen.records import SCHEMA, read_stream, tool_info
from loadgen.redaction import Secrets
from loadgen.run_folder import make_folder, write_json
from loadgen.sweep.plan import SweepPlan
from loadgen.sweep.search import Step, count_cv, search_end
from loadgen.workload.base import Workload
from loadgen.workload.salt import resolve_salt

__all__ = ["SweepSettings", "PointResult", "SweepResult", "run_sweep", "point_salt", "point_simulator"]


@dataclass(frozen=True)
class SweepSettings:
    """A sweep: the per-request settings shared by every point, the plan, and how to judge it."""

    base: RunSettings  # arrival, duration and warm-up are replaced per point
    plan: SweepPlan
    slo: SLO | None = None
    slo_name: str = ""
    gpus: float | None = None
    prices: dict[str, float] = field(default_factory=dict)
    point_salt: bool = True
    # the sweep's prompt salt, prepended to each point's: None draws a fresh one (prefix caches
    # start cold however often the sweep is rerun), "none" sends none, else that one (a replay)
    salt: str | None = None
    slo_is_default: bool = False  # the SLO is the default profile, not one the user named
    price_is_example: bool = False  # the price is an example (no --price-per-gpu-hour): label its costs
    gpus_is_default: bool = False  # the GPU count was not given (the simulator's own)

    def __post_init__(self) -> None:
        if self.gpus is not None and not self.gpus > 0:
            raise ConfigError(f"--gpus {self.gpus}: must be > 0")
        if self.plan.has_slo != (self.slo is not None):
            raise ConfigError("the plan's has_slo must match whether an SLO is given")
        if self.price_is_example and not self.prices:
            raise ConfigError("an example price needs a price")


@dataclass
class PointResult:
    index: int
    step: Step
    summary: Summary
    observation: Observation
    client: dict[str, Any]
    caveats: list[Caveat]


@dataclass
class SweepResult:
    run_dir: Path
    run_id: str
    points: list[PointResult]
    interrupted: bool = False
    stop_reason: str | None = None  # what stopped it first: "SIGINT", "SIGTERM"
    drain_cut: bool = False  # a second interrupt ended a point's drain
    cut_inflight: int = 0  # requests in flight at the cut, recorded as cancelled
    failure: str | None = None  # when every request of every point failed: the most common failure


def point_salt(settings: SweepSettings, k: int) -> str:
    """The prompt salt of point k: the sweep's (resolved by ``run_sweep``: a fresh one unless
    given) and the point's own, so no point warms another's prefix cache and no rerun gains
    from an earlier one."""
    salt = settings.salt or ""
    return salt if not settings.point_salt else f"{salt}p{k}"


def _steps(settings: SweepSettings, history: list[tuple[Step, Observation]]) -> Step | None:
    """The step sent after ``history``: the plan's (listed or searched, sized or fixed)."""
    return settings.plan.next_step(history)


def _point_settings(settings: SweepSettings, step: Step, k: int) -> RunSettings:
    plan = settings.plan
    return replace(
        settings.base,
        arrival=step.arrival,
        duration_s=plan.warmup_s + step.duration_s,
        requests=None,
        warmup_s=plan.warmup_s,
        cooldown_s=0.0,
        drain_s=plan.drain_s,
        point=k,
    )


def _meta(
    settings: SweepSettings,
    workload: Workload,
    url: str,
    is_sim: bool,
    model: str,
    run_id: str,
    sim_flags: list[str],
    secrets: Secrets,
) -> dict[str, Any]:
    plan = settings.plan
    base = settings_json(
        replace(settings.base, duration_s=plan.point_duration_s, warmup_s=plan.warmup_s, drain_s=plan.drain_s)
    )
    base["arrival"] = {
        "kind": plan.kind if plan.mode != "concurrency" else "closed",
        "cv": plan.cv,
        "label": f"sweep ({plan.mode}; see points)",
    }
    return {
        "run_id": run_id,
        "tool": tool_info(),
        "command": command_line(sys.argv[1:], secrets),
        "endpoint": endpoint_label(url),
        "simulator": {"flags": sim_flags} if is_sim else None,
        "model": model,
        "settings": base,
        "workload": workload.describe(),
        "host": host_info(),
        "started_wall_ns": time.time_ns(),
        "sweep": {
            "mode": plan.mode,
            "point_duration_s": plan.point_duration_s,
            "sizing": plan.sizing.to_json(count_cv(plan.kind, plan.cv)) if plan.sizing is not None else None,
            "warmup_s": plan.warmup_s,
            "drain_s": plan.drain_s,
            "auto": asdict(plan.auto) if plan.mode == "auto" else None,
            "plan": plan.describe(),
            "slo": slo_to_json(settings.slo, settings.slo_name, plan.auto.target_pct),
            "slo_is_default": settings.slo_is_default,
            "gpus": settings.gpus,
            "gpus_is_default": settings.gpus_is_default,
            "prices": settings.prices,
            "price_is_example": settings.price_is_example,
            "point_salt": settings.point_salt,
            "salt": settings.salt or None,
        },
        "points": [],
    }


def run_sweep(
    settings: SweepSettings,
    make_workload: Callable[[str], Workload],
    out: Path,
    *,
    api_key: str | None = None,
    sim_flags: list[str] | None = None,
    on_point: Callable[[PointResult], None] | None = None,
    on_engine: Callable[[Engine], None] | None = None,
    force: bool = False,
    on_live: Callable[[int, LiveCounters], None] | None = None,
    point_sender: Callable[..., dict[str, Any]] | None = None,
) -> SweepResult:
    """Send every point of the plan (or of the search), then compact the records.

    ``make_workload(salt)`` builds the workload for one point; run.json is
    rewritten after every point, so an interrupted sweep is still a valid run folder.
    A folder that holds a run is refused unless ``force``.
    """
    salt = resolve_salt(settings.salt)
    settings = replace(settings, salt=salt.text)
    _check_sweepable(make_workload(point_salt(settings, 0)))
    make_folder(out, force=force)
    run_id = new_run_id()
    flags = sim_flags or []
    secrets = settings.base.http.secrets(api_key, settings.base.endpoint, settings.base.stage_endpoints.values())
    stopper = Stopper()
    with catching_signals(stopper), target(settings.base.endpoint, flags) as (url, is_sim):
        settings = replace(settings, base=for_target(settings.base, is_sim))
        model, usage = preflight(
            settings.base, url, is_sim=is_sim, api_key=api_key, run_id=run_id, secrets=secrets, sim_flags=flags
        )
        meta = _meta(settings, make_workload(settings.salt or ""), url, is_sim, model, run_id, flags, secrets)
        meta = start_state({**salt.json(), **meta, "per_chunk_usage": usage.json()})
        settings = replace(settings, base=resolved(settings.base, usage))  # every point asks alike
        write_json(out / "run.json", meta)
        to = _Target(url, model, out, run_id, api_key, secrets, stopper, on_engine, is_sim, on_live, point_sender)
        result = SweepResult(out, run_id, [])
        error: BaseException | None = None
        try:
            with scraping_server_metrics(settings.base, url, out, meta):
                _send_points(settings, make_workload, to, meta, on_point, result)
            if settings.plan.mode == "auto":
                meta["sweep"]["search_end"] = search_end(settings.plan.auto, _history(result), settings.plan.sizing)
            if is_sim:
                meta["simulator"].update(asyncio.run(simulator_health(url)))
        except BaseException as e:
            error = e
            raise
        finally:
            if error is None:
                compact(out)  # after an error the record streams stay as they are (still readable)
            meta["finished_wall_ns"] = time.time_ns()
            write_json(out / "run.json", finish_state(meta, stopper, error))
    result.interrupted = stopper.stopped
    result.stop_reason = stopper.reason
    result.drain_cut = stopper.cut
    if stopper.cut and result.points:  # the cut point is the last one sent
        result.cut_inflight = cancelled_at_cut(out, result.points[-1].index)
    if not stopper.stopped and result.points:
        result.failure = every_request_failed(out, secrets)
    return result


def _check_sweepable(probe: Workload) -> None:
    """Refuse, before anything is sent, a trace workload (it fixes its own times)."""
    if probe.offsets_ns() is not None:
        raise ConfigError(
            "a trace workload fixes its own arrival times, so it cannot be swept; "
            "use loadgen run (with the trace's time scaling) instead"
        )


@dataclass(frozen=True)
class _Target:
    """Where every point of one sweep is sent and recorded."""

    url: str
    model: str
    out: Path
    run_id: str
    api_key: str | None
    secrets: Secrets
    stopper: Stopper
    on_engine: Callable[[Engine], None] | None
    is_sim: bool = False
    on_live: Callable[[int, LiveCounters], None] | None = None  # each worker's counters (--workers)
    point_sender: Callable[..., dict[str, Any]] | None = None  # a distributed run's master (--master)


def _history(result: SweepResult) -> list[tuple[Step, Observation]]:
    """What the search has seen: each sent step and its observation."""
    return [(p.step, p.observation) for p in result.points]


def _send_points(
    settings: SweepSettings,
    make_workload: Callable[[str], Workload],
    to: _Target,
    meta: dict[str, Any],
    on_point: Callable[[PointResult], None] | None,
    result: SweepResult,
) -> None:
    """Send the next step until the plan or the search has none (or the sweep is stopped);
    each point's entry is in run.json while it runs (``running``) and after (its state)."""
    while not to.stopper.stopped and (step := _steps(settings, _history(result))) is not None:
        k = len(result.points)
        entry = start_state(_point_json(settings, step, k, None))
        meta["points"].append(entry)
        write_json(to.out / "run.json", meta)
        try:
            before = asyncio.run(simulator_health(to.url)) if to.is_sim else None
            point = _run_point(settings, step, k, make_workload(point_salt(settings, k)), to)
        except BaseException as e:
            finish_state(entry, to.stopper, e)
            raise
        result.points.append(point)
        entry.update(_point_json(settings, step, k, point))
        if before is not None:
            entry["simulator"] = point_simulator(before, asyncio.run(simulator_health(to.url)))
        finish_state(entry, to.stopper)
        write_json(to.out / "run.json", meta)
        if on_point:
            on_point(point)


def point_simulator(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """How the built-in simulator kept up during one point: its step counters' change over it
    (the run's ``simulator`` block holds the whole sweep's). Its lateness is a running maximum:
    the point's own is known only when it rose during the point, else null here with
    ``max_lateness_ms_at_most``, the earlier maximum its steps stayed within (``late_steps``
    counts them anyway)."""
    out = {k: after.get(k, 0) - before.get(k, 0) for k in ("steps", "late_steps", "frontend_waits")}
    out["frontend_wait_ms"] = float(after.get("frontend_wait_ms", 0.0)) - float(before.get("frontend_wait_ms", 0.0))
    rose = float(after.get("max_lateness_ms", 0.0)) > float(before.get("max_lateness_ms", 0.0))
    out["max_lateness_ms"] = float(after["max_lateness_ms"]) if rose else None
    if not rose:
        out["max_lateness_ms_at_most"] = float(before.get("max_lateness_ms", 0.0))
    return out


def _run_point(settings: SweepSettings, step: Step, k: int, workload: Workload, to: _Target) -> PointResult:
    """Send one point, then summarise its records as the search and the live view see them."""
    ps = _point_settings(settings, step, k)
    stem = f"records-p{k:03d}"
    client = run_point(
        ps,
        workload,
        to.url,
        to.model,
        to.out,
        to.run_id,
        api_key=to.api_key,
        secrets=to.secrets,
        stopper=to.stopper,
        on_engine=to.on_engine,
        stem=stem,
        on_live=to.on_live,
        point_sender=to.point_sender,
    )
    streams = sorted(to.out.glob(f"{stem}*.arrows"))  # one per worker process
    table = pa.concat_tables([read_stream(p) for p in streams]) if streams else SCHEMA.empty_table()
    table = pipeline_view(table)  # a pipeline's user requests, as the report judges them
    window, problem = point_window(table, ps.warmup_s)
    summary = summarize(table, window, settings.slo)
    rate = step.rate if step.arrival.kind != "closed" else summary.offered_rps
    caveats = point_caveats({"phase": step.phase, "client": client}, summary, settings.base.lag_limit_ms)
    caveats += [Caveat("window_fallback", problem)] if problem else []
    obs = observe(summary, rate, settings.base.lag_limit_ms, client=client, validity=Validity.of(caveats))
    return PointResult(k, step, summary, obs, client, caveats)


def _point_json(settings: SweepSettings, step: Step, k: int, point: PointResult | None) -> dict[str, Any]:
    """A point's run.json entry (``PointJson``); its client block once it has run."""
    entry: PointJson = {
        "index": k,
        **step.to_json(),
        "warmup_s": settings.plan.warmup_s,
        "cooldown_s": 0.0,
        "lag_limit_ms": settings.base.lag_limit_ms,
        "salt": point_salt(settings, k),
    }
    if point is not None:
        entry["client"] = point.client
    out: dict[str, Any] = dict(entry)
    if (sizing := step.sizing_json()) is not None:
        out["sizing"] = sizing
    return out
