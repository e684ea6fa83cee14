"""One run, end to end: resolve the target, send the load point (in-process or sharded), write the run folder.

A run folder holds ``records.parquet`` (the truth), ``run.json`` (the resolved
configuration, tool and host; never a secret) and ``summary.json``. Everything
after the records is a pure function of them (``loadgen report`` redoes it).

run.json is written when sending starts, with ``state: running`` and this process's
``pid``, and finalised ``complete`` or ``interrupted`` (with ``interrupted_reason``),
so a folder whose run was killed never reads as finished. SIGINT and SIGTERM stop
the run through one ``Stopper`` (client.interrupts) for the whole command; the
built-in simulator keeps serving through the drain and is stopped after it.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import secrets as tokens
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from loadgen import clock
from loadgen.client.config import LiveCounters
from loadgen.client.endpoint import endpoint_label
from loadgen.client.engine import Engine
from loadgen.client.interrupts import Stopper, catching_signals
from loadgen.client.point import run_engine
from loadgen.client.preflight import preflight
from loadgen.client.settings import RunResult, RunSettings, check_url, settings_json
from loadgen.client.usage_probe import PerChunkUsage, resolved
from loadgen.record_compact import compact
from loadgen.records import read_records, tool_info
from loadgen.redaction import REDACTED, Secrets
from loadgen.run_folder import make_folder, mark_finished, mark_running, write_json
from loadgen.untrusted import clean_text
from loadgen.workload.base import Workload
from loadgen.workload.reuse import predict_reuse, sent_sessions
from loadgen.workload.salt import Salt, salt_of

__all__ = [
    "execute",
    "run_point",
    "target",
    "for_target",
    "host_info",
    "new_run_id",
    "command_line",
    "start_state",
    "finish_state",
    "every_request_failed",
]


def host_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "aiohttp": aiohttp.__version__,
        "numpy": np.__version__,
    }


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + tokens.token_hex(3)


# A flag whose value is a credential (none of loadgen's today: the key is read from the
# environment; this keeps one added later, or a wrapper's, out of run.json).
_SECRET_FLAG = re.compile(r"--?(?:api[-_]?key|key|token|password|passwd|secret|bearer|auth\w*|header|H)", re.I)
_USERINFO = re.compile(r"(?i)\b(https?://)[^/@\s]*@")  # a URL's user:password@, however short


def command_line(argv: Sequence[str], secrets: Secrets) -> list[str]:
    """The command as run.json keeps it: every secret of the run redacted, and the value of a
    credential-like flag (``--api-key X``, ``--token=X``, ``--header "Authorization: ..."``) hidden."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            shown.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if _SECRET_FLAG.fullmatch(flag):
            shown.append(f"{flag}={REDACTED}" if eq else arg)
            hide_next = not eq
            continue
        shown.append(_USERINFO.sub(rf"\1{REDACTED}@", secrets.redact(arg)))
    return shown


def start_state(meta: dict[str, Any]) -> dict[str, Any]:
    """Mark ``meta`` (run.json, or a sweep point) as running in this process (its pid and
    start time, so a dead run is told from a live one even after its pid is reused)."""
    mark_running(meta)
    return meta


def finish_state(meta: dict[str, Any], stopper: Stopper, error: BaseException | None = None) -> dict[str, Any]:
    """Mark ``meta`` complete, or interrupted with the reason (a stop, a cut drain, an error)."""
    reason: str | None = stopper.cut_reason or stopper.reason
    if error is not None:
        reason = f"the run failed: {type(error).__name__}: {error}" if str(error) else type(error).__name__
    mark_finished(meta, None if reason is None else clean_text(reason))
    return meta


def every_request_failed(run_dir: Path, secrets: Secrets, points: Sequence[int] | None = None) -> str | None:
    """When no request of the run (of ``points``, if given) succeeded: one line naming the most
    common failure and its count, e.g. ``40 x http_error "HTTP 404: model 'x' not found"``."""
    table = read_records(run_dir).select(["point", "status", "error"]).to_pydict()
    rows = [
        (s, e)
        for p, s, e in zip(table["point"], table["status"], table["error"], strict=True)
        if points is None or p in points
    ]
    if not rows or any(s == "ok" for s, _ in rows):
        return None
    kinds = Counter((s, clean_text(secrets.redact(e), 200) if e else "") for s, e in rows)
    (status, error), n = kinds.most_common(1)[0]
    line = f'{n} x {status} "{error}"' if error else f"{n} x {status}"
    if n < len(rows):
        line += f" ({len(rows) - n} more, {len(kinds) - 1} other kind{'s' if len(kinds) > 2 else ''})"
    return line


def cancelled_at_cut(run_dir: Path, point: int | None = None) -> int:
    """How many requests (of ``point``, if given) the records say were cancelled: after a second
    interrupt, those the cut drain cancelled (a first stop cancels none: it waits). Counted from
    the records, not from the engine's in-flight counter at the cut instant, which misses a
    request that was on its way to the wire then."""
    table = read_records(run_dir).select(["point", "status"]).to_pydict()
    return sum(
        1 for p, s in zip(table["point"], table["status"], strict=True) if s == "cancelled" and point in (None, p)
    )


def for_target(settings: RunSettings, is_sim: bool) -> RunSettings:
    """``settings`` as sent to the target: the built-in simulator (on loopback) never through a proxy."""
    return replace(settings, http=replace(settings.http, proxies=False)) if is_sim else settings


@contextmanager
def target(endpoint: str | None, sim_flags: list[str]) -> Iterator[tuple[str, bool]]:
    """Yield (base URL, is_simulator): the given endpoint, or a fresh simulator process
    (stopped when the body ends, after the drain)."""
    if endpoint:
        check_url("--endpoint", endpoint, "an OpenAI base URL like http://127.0.0.1:8000/v1")
        yield endpoint.rstrip("/"), False
        return
    from loadgen.sim.process import start_sim

    with start_sim(sim_flags) as sim:
        yield sim.url, True


def run_point(
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
    stem: str = "records",
    on_live: Callable[[int, LiveCounters], None] | None = None,
    point_sender: Callable[..., dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One load point, in this process or sharded over ``settings.workers`` processes. The live
    view reads the engine (``on_engine``) here, or each worker's counters (``on_live``) there.
    ``point_sender``: who sends it instead, with this signature (a distributed run's master,
    ``loadgen.distributed.master.Master.run_point``)."""
    if point_sender is not None:
        return point_sender(
            settings,
            workload,
            url,
            model,
            run_dir,
            run_id,
            api_key=api_key,
            secrets=secrets,
            stopper=stopper,
            stem=stem,
            on_live=on_live,
        )
    secrets = secrets if secrets is not None else settings.http.secrets(api_key, url, settings.stage_endpoints.values())
    if settings.workers <= 1:
        return clock.run(
            run_engine(
                settings,
                workload,
                url,
                model,
                run_dir,
                run_id,
                api_key=api_key,
                secrets=secrets,
                stopper=stopper,
                on_engine=on_engine,
                stream_name=f"{stem}.arrows",
            )
        )
    from loadgen.client.shards import run_sharded

    return run_sharded(
        settings,
        workload,
        url,
        model,
        run_dir,
        run_id,
        api_key=api_key,
        secrets=secrets,
        stopper=stopper,
        stem=stem,
        on_live=on_live,
    )


@contextmanager
def scraping_server_metrics(settings: RunSettings, url: str, run_dir: Path, meta: dict[str, Any]) -> Iterator[None]:
    """Scrape the server's Prometheus metrics into the run folder while the body runs."""
    from loadgen.client.scrape import ScraperThread, resolve_option
    from loadgen.run_folder import SERVER_METRICS_NAME

    scraper = ScraperThread(resolve_option(settings.server_metrics, url), 1.0, run_dir / SERVER_METRICS_NAME)
    scraper.start()
    try:
        yield
    finally:
        meta["server_metrics"] = scraper.stop()


async def simulator_health(url: str) -> dict[str, Any]:
    """Whether the built-in simulator kept up with its own model during the run."""
    from loadgen.client.prometheus import fetch_metrics, metrics_url

    m = await fetch_metrics(metrics_url(url)) or {}
    return {
        "late_steps": int(m.get("vllm:late_steps_total", 0)),
        "steps": int(m.get("vllm:steps_total", 0)),
        "frontend_waits": int(m.get("vllm:frontend_waits_total", 0)),
        "frontend_wait_ms": 1e3 * m.get("vllm:frontend_wait_seconds_total", 0.0),
        "max_lateness_ms": 1e3 * m.get("vllm:max_lateness_seconds", 0.0),
    }


def execute(
    settings: RunSettings,
    workload: Workload,
    out: Path,
    *,
    api_key: str | None = None,
    sim_flags: list[str] | None = None,
    on_engine: Callable[[Engine], None] | None = None,
    force: bool = False,
    salt: Salt | None = None,
    on_live: Callable[[int, LiveCounters], None] | None = None,
    point_sender: Callable[..., dict[str, Any]] | None = None,
) -> RunResult:
    """Run once: target up, records written and compacted, run.json complete (or interrupted).

    A folder that cannot be written, or that holds a run (unless ``force``), is refused
    before the target is started or asked anything."""
    make_folder(out, force=force)
    run_id = new_run_id()
    secrets = settings.http.secrets(api_key, settings.endpoint, settings.stage_endpoints.values())
    stopper = Stopper()
    with catching_signals(stopper):
        with target(settings.endpoint, sim_flags or []) as (url, is_sim):
            settings = for_target(settings, is_sim)
            model, usage = preflight(
                settings, url, is_sim=is_sim, api_key=api_key, run_id=run_id, secrets=secrets, sim_flags=sim_flags or []
            )
            meta = start_state(
                _meta(settings, workload, url, is_sim, model, run_id, sim_flags or [], secrets, salt, usage)
            )
            write_json(out / "run.json", meta)
            try:
                with scraping_server_metrics(settings, url, out, meta):
                    client = run_point(
                        resolved(settings, usage),
                        workload,
                        url,
                        model,
                        out,
                        run_id,
                        api_key=api_key,
                        secrets=secrets,
                        stopper=stopper,
                        on_engine=on_engine,
                        on_live=on_live,
                        point_sender=point_sender,
                    )
                if is_sim:
                    meta["simulator"].update(asyncio.run(simulator_health(url)))
            except BaseException as e:  # the record streams stay readable; run.json says what happened
                write_json(out / "run.json", finish_state(meta, stopper, e))
                raise
        compact(out)
        meta["client"] = client
        # how much of the prompts' bytes the workload itself repeats: the bound a warm cache exceeds
        meta["prefix_reuse"] = predict_reuse(workload, sent_sessions(read_records(out))).json()
        meta["finished_wall_ns"] = time.time_ns()
        write_json(out / "run.json", finish_state(meta, stopper))
    failure = None if stopper.stopped else every_request_failed(out, secrets)
    return RunResult(
        out,
        run_id,
        client["records"],
        client,
        interrupted=stopper.stopped,
        stop_reason=stopper.reason,
        drain_cut=stopper.cut,
        cut_inflight=cancelled_at_cut(out) if stopper.cut else 0,
        failure=failure,
    )


def _meta(
    settings: RunSettings,
    workload: Workload,
    url: str,
    is_sim: bool,
    model: str,
    run_id: str,
    sim_flags: list[str],
    secrets: Secrets,
    salt: Salt | None = None,
    usage: PerChunkUsage | None = None,
) -> dict[str, Any]:
    return {
        **(salt or salt_of(workload.describe())).json(),
        "run_id": run_id,
        "tool": tool_info(),
        "command": command_line(sys.argv[1:], secrets),
        "endpoint": endpoint_label(url),
        "simulator": {"flags": sim_flags} if is_sim else None,
        "model": model,
        "settings": settings_json(settings),
        # whether every request asked for running usage per chunk, and how that was decided
        "per_chunk_usage": usage.json() if usage is not None else None,
        "workload": workload.describe(),
        "host": host_info(),
        "started_wall_ns": time.time_ns(),
    }
