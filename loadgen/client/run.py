"""One run, end to end: resolve the target, send the plan, write the run folder.

A run folder holds ``records.parquet`` (the truth), ``run.json`` (the resolved
configuration, tool and host; never a secret) and ``summary.json``. Everything
after the records is a pure function of them (``loadgen report`` redoes it).
"""

from __future__ import annotations

import asyncio
import os
import platform
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import orjson

from loadgen import __version__, clock
from loadgen.client.config import EngineConfig, Plan, Timeouts
from loadgen.client.endpoint import endpoint_label
from loadgen.client.engine import Engine
from loadgen.clock import SpinMeter
from loadgen.errors import ConfigError, EndpointError
from loadgen.records import STREAM_NAME, RecordWriter, compact, write_json
from loadgen.schedule import Arrival, offsets_ns, shard_indices
from loadgen.workload.load import Workload

__all__ = ["RunSettings", "RunResult", "execute", "endpoint_label", "api_key_from_env", "target"]


@dataclass(frozen=True)
class RunSettings:
    """Everything that decides what a run sends; printed in run.json and reports."""

    endpoint: str | None  # OpenAI base URL; None = the built-in simulator
    model: str | None
    api: str = "chat"
    arrival: Arrival = field(default_factory=lambda: Arrival("poisson", rate=4.0))
    duration_s: float | None = 10.0
    requests: int | None = None
    seed: int = 0
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    timeouts: Timeouts = field(default_factory=Timeouts)
    ignore_eos: bool = True
    keep_text: bool = False
    max_inflight: int = 10_000
    drain_s: float = 60.0
    lag_limit_ms: float = 10.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    point: int = 0
    workers: int = 1  # client processes, each sending a shard of the schedule
    server_metrics: str | None = None  # None/"auto": the endpoint's /metrics when it answers; "off"; a URL

    def __post_init__(self) -> None:
        if self.api not in ("chat", "completions"):
            raise ConfigError(f"--api {self.api!r}: use chat or completions")
        if self.duration_s is None and self.requests is None:
            raise ConfigError("give --duration or --requests (or both: whichever ends first)")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError(f"--duration {self.duration_s}: must be > 0 seconds")
        if self.requests is not None and self.requests <= 0:
            raise ConfigError(f"--requests {self.requests}: must be >= 1")
        if self.workers < 1:
            raise ConfigError(f"--workers {self.workers}: must be >= 1")
        if self.arrival.kind == "closed" and self.workers > (self.arrival.concurrency or 1):
            raise ConfigError(f"--workers {self.workers} exceeds --concurrency {self.arrival.concurrency}")
        if self.warmup_s < 0 or self.cooldown_s < 0:
            raise ConfigError("--warmup and --cooldown must be >= 0 seconds")
        if self.duration_s and self.warmup_s + self.cooldown_s >= self.duration_s:
            raise ConfigError(
                f"--warmup {self.warmup_s} + --cooldown {self.cooldown_s} leave no measurement "
                f"window in --duration {self.duration_s}"
            )


@dataclass
class RunResult:
    run_dir: Path
    run_id: str
    records: int
    client: dict[str, Any]
    interrupted: bool = False


def api_key_from_env(name: str | None) -> str | None:
    """The API key: from ``$NAME`` when given (which must exist), else $OPENAI_API_KEY."""
    if name:
        value = os.environ.get(name)
        if not value:
            raise ConfigError(f"--api-key-env {name}: that environment variable is not set")
        return value
    return os.environ.get("OPENAI_API_KEY") or None


def host_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "aiohttp": aiohttp.__version__,
        "numpy": np.__version__,
    }


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


async def discover_model(url: str, api_key: str | None, timeout_s: float = 10.0) -> str:
    """The first model ``/v1/models`` lists, for runs not told which model to ask for."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
            async with http.get(url.rstrip("/") + "/models", headers=headers) as resp:
                if resp.status != 200:
                    raise EndpointError(f"{endpoint_label(url)}/models answered HTTP {resp.status}; pass --model")
                data = orjson.loads(await resp.read())
                return str(data["data"][0]["id"])
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise EndpointError(f"cannot reach {endpoint_label(url)}: {type(e).__name__}: {e}") from None
    except (KeyError, IndexError, TypeError, orjson.JSONDecodeError):
        raise EndpointError(f"{endpoint_label(url)}/models listed no model; pass --model") from None


@contextmanager
def target(endpoint: str | None, sim_flags: list[str]) -> Iterator[tuple[str, bool]]:
    """Yield (base URL, is_simulator): the given endpoint, or a fresh simulator process."""
    if endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--endpoint {endpoint!r}: expected an OpenAI base URL like http://host:8000/v1")
        yield endpoint.rstrip("/"), False
        return
    from loadgen.sim.process import start_sim

    with start_sim(sim_flags) as sim:
        yield sim.url, True


def build_plan(settings: RunSettings, workload: Workload, shard: int = 0, shards: int = 1) -> Plan:
    """The sessions this shard sends, and when: a pure function of the settings."""
    arrival = settings.arrival
    if arrival.kind == "closed":
        users = (arrival.concurrency or 1) // shards + (shard < (arrival.concurrency or 1) % shards)
        return Plan(
            session=workload.session, concurrency=users, count=settings.requests, duration_s=settings.duration_s
        )
    trace = workload.offsets_ns()
    if trace is not None:
        offs = np.asarray(trace, dtype=np.int64)
        if settings.duration_s is not None:
            offs = offs[offs < int(settings.duration_s * 1e9)]
        if settings.requests is not None:
            offs = offs[: settings.requests]
    else:
        offs = offsets_ns(arrival, settings.seed, duration_s=settings.duration_s, count=settings.requests)
    return Plan(session=workload.session, offsets_ns=offs, indices=shard_indices(len(offs), shard, shards))


def settings_json(settings: RunSettings) -> dict[str, Any]:
    d = asdict(settings)
    d["arrival"] = {**asdict(settings.arrival), "label": str(settings.arrival)}
    return d


async def run_engine(
    settings: RunSettings,
    workload: Workload,
    url: str,
    model: str,
    run_dir: Path,
    run_id: str,
    *,
    api_key: str | None,
    on_engine: Callable[[Engine], None] | None = None,
    stream_name: str = STREAM_NAME,
    shard: int = 0,
    shards: int = 1,
    start_ns: int | None = None,
) -> dict[str, Any]:
    """Send one load point (or shard ``shard`` of ``shards`` of it, from a shared
    ``start_ns``); records go to ``run_dir/stream_name``. Returns client health."""
    cfg = EngineConfig(
        url=url,
        model=model,
        api=settings.api,
        run_id=run_id,
        endpoint_label=endpoint_label(url),
        point=settings.point,
        shard=shard,
        shards=shards,
        timeouts=settings.timeouts,
        ignore_eos=settings.ignore_eos,
        keep_text=settings.keep_text,
        max_inflight=settings.max_inflight,
        extra_body=settings.extra_body,
    )
    plan = build_plan(settings, workload, shard, shards)
    with RecordWriter(run_dir / stream_name) as writer:
        engine = Engine(cfg, writer, api_key=api_key)
        if on_engine:
            on_engine(engine)
        loop = asyncio.get_running_loop()
        interrupted = False

        def on_signal() -> None:
            nonlocal interrupted
            interrupted = True
            engine.stop()

        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        cpu0, wall0, spun0 = time.process_time(), time.perf_counter(), SpinMeter.spun_ns
        if start_ns is None:
            start_ns = time.perf_counter_ns() + 50_000_000  # 50 ms to settle before the first send
        anchor = {"wall_ns": time.time_ns(), "perf_ns": time.perf_counter_ns(), "start_perf_ns": start_ns}
        try:
            await engine.run(plan, start_ns, grace_s=settings.drain_s)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        spun = (SpinMeter.spun_ns - spun0) / 1e9
    return {
        "clock_anchor": anchor,
        "event_loop": "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio",
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        # yielding while waiting for a send instant is not load: it is left out here
        "cpu_utilisation": max(cpu - spun, 0.0) / wall if wall > 0 else 0.0,
        "cpu_seconds_waiting_for_send_instants": spun,
        "loop_lag_max_ms": engine.live.loop_lag_max_ms,
        "sends_delayed_by_max_inflight": engine.live.capped,
        "interrupted": interrupted,
        "records": writer.written,
        "shard": shard,
    }


def run_point(
    settings: RunSettings,
    workload: Workload,
    url: str,
    model: str,
    run_dir: Path,
    run_id: str,
    *,
    api_key: str | None,
    on_engine: Callable[[Engine], None] | None = None,
    stem: str = "records",
) -> dict[str, Any]:
    """One load point, in this process or sharded over ``settings.workers`` processes."""
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
                on_engine=on_engine,
                stream_name=f"{stem}.arrows",
            )
        )
    from loadgen.client.shards import run_sharded

    return run_sharded(settings, workload, url, model, run_dir, run_id, api_key=api_key, stem=stem)


@contextmanager
def scraping_server_metrics(settings: RunSettings, url: str, run_dir: Path, meta: dict[str, Any]) -> Iterator[None]:
    """Scrape the server's Prometheus metrics into the run folder while the body runs."""
    from loadgen.client.scrape import FILE_NAME, ScraperThread, resolve_option

    scraper = ScraperThread(resolve_option(settings.server_metrics, url), 1.0, run_dir / FILE_NAME)
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
) -> RunResult:
    """Run once: target up, records written and compacted, run.json complete."""
    out.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id()
    with target(settings.endpoint, sim_flags or []) as (url, is_sim):
        model = settings.model or asyncio.run(discover_model(url, api_key))
        meta: dict[str, Any] = {
            "run_id": run_id,
            "tool": {"name": "loadgen", "version": __version__},
            "command": [a for a in sys.argv[1:]],
            "endpoint": endpoint_label(url),
            "simulator": {"flags": sim_flags or []} if is_sim else None,
            "model": model,
            "settings": settings_json(settings),
            "workload": workload.describe(),
            "host": host_info(),
            "started_wall_ns": time.time_ns(),
        }
        write_json(out / "run.json", meta)
        with scraping_server_metrics(settings, url, out, meta):
            client = run_point(settings, workload, url, model, out, run_id, api_key=api_key, on_engine=on_engine)
        if is_sim:
            meta["simulator"].update(asyncio.run(simulator_health(url)))
    compact(out)
    meta["client"] = client
    meta["finished_wall_ns"] = time.time_ns()
    write_json(out / "run.json", meta)
    return RunResult(out, run_id, client["records"], client, client["interrupted"])
