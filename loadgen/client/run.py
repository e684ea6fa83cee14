"""One run, end to end: resolve the target, send the load point (in-process or sharded), write the run folder.

A run folder holds ``records.parquet`` (the truth), ``run.json`` (the resolved
configuration, tool and host; never a secret) and ``summary.json``. Everything
after the records is a pure function of them (``loadgen report`` redoes it).
"""

from __future__ import annotations

import asyncio
import os
import platform
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from loadgen import clock
from loadgen.client.endpoint import endpoint_label
from loadgen.client.engine import Engine
from loadgen.client.point import run_engine
from loadgen.client.settings import RunResult, RunSettings, check_url, settings_json
from loadgen.errors import EndpointError
from loadgen.records import compact, make_folder, tool_info, write_json
from loadgen.workload.base import Workload

__all__ = ["execute", "run_point", "target", "discover_model", "host_info", "new_run_id"]


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
    from loadgen.client.scrape import ScraperThread, resolve_option
    from loadgen.records import SERVER_METRICS_NAME

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
) -> RunResult:
    """Run once: target up, records written and compacted, run.json complete.

    A folder that cannot be written is refused before the target is started or asked anything."""
    make_folder(out)
    run_id = new_run_id()
    with target(settings.endpoint, sim_flags or []) as (url, is_sim):
        model = settings.model or asyncio.run(discover_model(url, api_key))
        meta: dict[str, Any] = {
            "run_id": run_id,
            "tool": tool_info(),
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
