"""The endpoint's own Prometheus ``/metrics``, scraped during a run into the run folder.

Why: the client sees latency; only the server knows why. Queue depth, running
batch size, KV-cache pressure, preemptions and prefix-cache hits, on the same
``perf_counter_ns`` clock as the records, explain a TTFT knee or a throughput
plateau. Engines name these differently, so every sample is also mapped onto one
normalized set of series (``SERIES``; the parsing is in ``client.prometheus``,
the mapping in ``client.metric_names``); the raw engine-prefixed values are kept
beside it so nothing the engine said is lost.

Rows go to ``server_metrics.jsonl`` in the run folder, one JSON object per scrape,
appended and flushed as they come, so a crash leaves every finished sample. A
scrape is one GET per interval (default 1 s), bounded in size and time (the body is
read up to ``prometheus.MAX_BYTES``); a failed scrape (no answer, a body over the
cap, text that is not Prometheus's) is a row with an ``error`` and never stops the
run. If the first probe gets no metrics the scraper stays off and says why.

Use ``ServerMetricsScraper`` inside an event loop, or ``ScraperThread`` around
synchronous code (its own thread and loop, so it is independent of how many
client processes or event loops the run uses). ``run_folder.load_server_metrics`` reads a
run folder's series back for reports; ``summarize`` folds rows into run.json's
summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from loadgen.client.endpoint import endpoint_label
from loadgen.client.metric_names import SERIES, detect_engine, normalize, parse_engine_metrics
from loadgen.client.prometheus import MAX_BYTES, PrometheusTextError, metrics_url, read_body
from loadgen.errors import ConfigError

__all__ = ["ServerMetricsScraper", "ScraperThread", "summarize", "resolve_option"]


def resolve_option(option: str | None, base_url: str) -> str | None:
    """``--server-metrics``: None or ``auto`` -> the endpoint's ``/metrics`` (used when it answers);
    ``off`` -> None; otherwise a URL of its own (e.g. a metrics port separate from the API)."""
    if option is None or option == "auto":
        return metrics_url(base_url)
    if option == "off":
        return None
    parts = urlsplit(option)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--server-metrics {option!r}: expected auto, off or a URL like http://host:8000/metrics")
    return option


class ServerMetricsScraper:
    """Scrape ``url`` every ``interval_s`` into ``out_path`` (JSON lines) as a background task.

    ``await start()`` probes once: with no metrics there, the scraper is off (``reason``
    says why) and ``stop()`` just reports that. Ticks are absolute (start + k x interval),
    so a slow scrape skips ticks instead of drifting or piling up requests. ``stop()``
    takes one last sample, so counter deltas cover the whole run.
    """

    def __init__(
        self,
        url: str,
        interval_s: float = 1.0,
        out_path: Path | str | None = None,
        *,
        timeout_s: float | None = None,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s {interval_s!r}: must be > 0")
        self.url = url
        self.interval_s = float(interval_s)
        self.out_path = Path(out_path) if out_path is not None else None
        self.timeout_s = timeout_s if timeout_s is not None else min(max(self.interval_s, 1.0), 5.0)
        self.max_bytes = max_bytes
        self.clock = clock
        self.enabled = False
        self.reason: str | None = None
        self.engine = "unknown"
        self.rows: list[dict[str, Any]] = []  # kept for the summary; a sample is ~1 KiB
        self._errors = 0
        self._file: IO[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ServerMetricsScraper:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> bool:
        """Probe; when metrics answer, open the file, keep the first sample, start the task."""
        # force_close: a fresh connection per scrape (one a second) rather than racing a
        # server that closes idle keep-alive connections (llama.cpp closes after streams)
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1, force_close=True),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            auto_decompress=True,
        )
        row = await self._sample()
        if row.get("error") or not row.get("raw"):
            self.reason = row.get("error") or "no vLLM, llama.cpp, SGLang or TGI metrics in the answer"
            await self._http.close()
            self._http = None
            return False
        if self.out_path is not None:
            try:
                self.out_path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.out_path, "ab")  # noqa: SIM115 - closed in stop()
            except OSError as e:
                self.reason = f"cannot write {self.out_path}: {e}"
                await self._http.close()
                self._http = None
                return False
        self.enabled = True
        self.engine = detect_engine(row["raw"])
        self._keep(row)
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return True

    async def stop(self) -> dict[str, Any]:
        """Stop the task, take a last sample, close the file; return the summary."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self._keep(await self._sample())
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._file is not None:
            self._file.close()
            self._file = None
        return self.summary()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": endpoint_label(self.url), "enabled": self.enabled, "interval_s": self.interval_s}
        if not self.enabled:
            out["reason"] = self.reason
            return out
        out |= {
            "engine": self.engine,
            "samples": len(self.rows) - self._errors,
            "errors": self._errors,
            "path": self.out_path.name if self.out_path else None,
        }
        out |= summarize(self.rows)
        return out

    async def _loop(self) -> None:
        t0 = time.monotonic()
        k = 1
        while True:
            now = time.monotonic()
            k = max(k, math.ceil((now - t0) / self.interval_s))  # skip ticks a slow scrape missed
            await asyncio.sleep(max(0.0, t0 + k * self.interval_s - now))
            k += 1
            try:
                self._keep(await self._sample())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - never let a scrape take the run down
                self._keep({"t_ns": self.clock(), "wall_ns": time.time_ns(), "error": f"{type(e).__name__}: {e}"})

    async def _sample(self) -> dict[str, Any]:
        """One GET, parsed; a row with ``error`` instead when it fails."""
        assert self._http is not None
        t_sent = self.clock()
        wall = time.time_ns()
        try:
            async with self._http.get(self.url) as resp:
                if resp.status != 200:
                    return {"t_ns": t_sent, "wall_ns": wall, "error": f"HTTP {resp.status}"}
                body = await read_body(resp, self.max_bytes)
            t_done = self.clock()
            values = parse_engine_metrics(body.decode("utf-8", "replace"))
        except PrometheusTextError as e:
            return {"t_ns": t_sent, "wall_ns": wall, "error": str(e)}
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            return {"t_ns": t_sent, "wall_ns": wall, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        # the server's state was read somewhere between send and answer: stamp the midpoint
        return {
            "t_ns": (t_sent + t_done) // 2,
            "wall_ns": wall + (t_done - t_sent) // 2,
            "scrape_ms": round((t_done - t_sent) / 1e6, 3),
            **normalize(values),
            "raw": values,
        }

    def _keep(self, row: dict[str, Any]) -> None:
        if row.get("error"):
            self._errors += 1
        self.rows.append(row)
        if self._file is not None:
            try:
                self._file.write(orjson.dumps(row) + b"\n")
                self._file.flush()
            except OSError as e:  # a full disk loses server metrics, not the run
                self.reason = f"writing {self.out_path}: {e}"
                self._file.close()
                self._file = None


class ScraperThread:
    """``ServerMetricsScraper`` on its own thread and event loop, for synchronous callers.

    The runner's points run under ``asyncio.run`` (or in worker processes); a thread
    keeps one scraper across all of them without touching their loops. Its work is
    one GET and one parse of the engine's non-bucket sample lines per interval (a few
    ms for a vLLM server, bounded by ``prometheus.MAX_SAMPLE_BYTES`` for any), so it
    takes little from the client's own timing. ``start()`` returns after the first probe.
    """

    def __init__(
        self, url: str | None, interval_s: float = 1.0, out_path: Path | str | None = None, **kwargs: Any
    ) -> None:
        self.url = url
        self._scraper = ServerMetricsScraper(url, interval_s, out_path, **kwargs) if url else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] | None = None

    def __enter__(self) -> ScraperThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> bool:
        if self._scraper is None:
            return False
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="loadgen-server-metrics", daemon=True)
        self._thread.start()
        try:
            return asyncio.run_coroutine_threadsafe(self._scraper.start(), loop).result()
        except Exception as e:  # server metrics are an aid: their failure never stops a run
            self._scraper.reason = f"{type(e).__name__}: {e}"
            return False

    def stop(self) -> dict[str, Any]:
        """The summary (``{"enabled": False, "reason": "off"}`` when switched off)."""
        if self._result is not None:
            return self._result
        if self._scraper is None:
            self._result = {"enabled": False, "reason": "off"}
            return self._result
        assert self._loop is not None and self._thread is not None
        self._result = asyncio.run_coroutine_threadsafe(self._scraper.stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        return self._result


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counter deltas over the rows (last - first), and peaks and means of the gauges."""
    ok = [r for r in rows if not r.get("error")]
    out: dict[str, Any] = {}
    if not ok:
        return out
    deltas: dict[str, float] = {}
    for series in SERIES:
        if not series.endswith("_total"):
            continue
        vals = [r[series] for r in ok if r.get(series) is not None]
        if len(vals) >= 2:
            deltas[series] = vals[-1] - vals[0]
    gauges: dict[str, dict[str, float]] = {}
    for series in ("running", "waiting", "kv_cache_usage"):
        vals = [r[series] for r in ok if r.get(series) is not None]
        if vals:
            gauges[series] = {"max": max(vals), "mean": sum(vals) / len(vals)}
    out["deltas"] = deltas
    out["gauges"] = gauges
    out["span_s"] = (ok[-1]["t_ns"] - ok[0]["t_ns"]) / 1e9
    return out
