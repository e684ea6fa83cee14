"""What a run is told: the settings that decide what it sends, and the engine config they give.

``RunSettings`` is frozen and validated at construction, so a contradictory or
out-of-range run is refused, with a message naming the flag and its value, before
anything is sent (``dataclasses.replace`` validates again, so every sweep point is
checked too). Its field defaults are the command line's defaults: ``loadgen run``
reads them from here rather than repeating them. ``engine_config`` is the one place
an engine's config is derived from a run's settings; run.json prints the settings
(``settings_json``).

Importing this module imports nothing heavy (the parsers of ``loadgen run`` read
its defaults and limits while ``loadgen --help`` must stay fast).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from loadgen.client.config import APIS, DEFAULT_MAX_INFLIGHT, MAX_INFLIGHT, TRANSPORTS, EngineConfig, Timeouts
from loadgen.client.endpoint import endpoint_label
from loadgen.client.endpoint_options import MAX_TOKENS_FIELDS, EndpointOptions
from loadgen.client.stages import StageEndpoint
from loadgen.errors import ConfigError

if TYPE_CHECKING:
    from loadgen.schedule import Arrival

__all__ = [
    "RunSettings",
    "RunResult",
    "api_key_from_env",
    "settings_json",
    "engine_config",
    "check_url",
    "DEFAULT_DURATION_S",
    "DEFAULT_CLOSED_REQUESTS",
    "MAX_RATE",
    "MAX_CONCURRENCY",
    "MAX_REQUESTS",
    "MAX_DURATION_S",
    "MAX_WORKERS",
    "MAX_SEED",
    "PER_CHUNK_USAGE",
]

DEFAULT_DURATION_S = 10.0  # a run given neither a duration nor a request count sends for this long...
DEFAULT_CLOSED_REQUESTS = 100  # ...except a closed loop, which sends this many requests

# Limits: far beyond any sensible run, near enough to catch a typo before it costs
# memory or a night. One client process times a few thousand requests per second
# (benchmarks/client_capacity.py); ten million records are gigabytes of Parquet.
MAX_RATE = 1e6  # requests (sessions) per second
MAX_CONCURRENCY = 100_000  # closed-loop users
MAX_REQUESTS = 10_000_000  # per run: --requests, or rate x duration when no count is given
MAX_DURATION_S = 30 * 86_400.0  # 30 days
MAX_WORKERS = 256
MAX_SEED = 2**64 - 1
PER_CHUNK_USAGE = ("auto", "on", "off")  # --per-chunk-usage


def _default_arrival() -> Arrival:
    from loadgen.schedule import Arrival  # numpy comes with it: not at import time (see the docstring)

    return Arrival("poisson", rate=4.0)


@dataclass(frozen=True)
class RunSettings:
    """Everything that decides what a run sends; printed in run.json and reports."""

    endpoint: str | None  # OpenAI base URL; None = the built-in simulator
    model: str | None  # None: the first model the endpoint's /v1/models lists
    api: str = "chat"
    arrival: Arrival = field(default_factory=_default_arrival)
    duration_s: float | None = DEFAULT_DURATION_S
    requests: int | None = None
    seed: int = 0
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    timeouts: Timeouts = field(default_factory=Timeouts)
    ignore_eos: bool = True
    keep_text: bool = False
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    drain_s: float = 60.0
    lag_limit_ms: float = 10.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    point: int = 0
    workers: int = 1  # client processes, each sending a shard of the schedule
    server_metrics: str | None = None  # None/"auto": the endpoint's /metrics when it answers; "off"; a URL
    # Per-chunk token counts (client.usage_probe): "auto" asks for running usage on every chunk
    # where a probe finds the endpoint offers it, "on" asks without probing, "off" never asks. The
    # runner resolves "auto" to "on" or "off" before an engine is configured; run.json's
    # settings keep what was given, its ``per_chunk_usage`` what was decided and how.
    per_chunk_usage: str = "auto"
    tokenizer: str | None = None  # counts each chunk's text without running usage: a tokenizer.json or "builtin"
    # How requests reach the endpoint (-H, --api-key-header, TLS, proxies): run.json shows header names only
    http: EndpointOptions = field(default_factory=EndpointOptions)
    max_tokens_field: str = "max_tokens"  # the body field of the answer's length: max_completion_tokens, or both
    preflight: bool = True  # GET /models and one tiny request before the schedule (--no-preflight: neither)
    transport: str = "lean"  # the wire (--transport): loadgen's own HTTP/1.1, or aiohttp's client
    # a pipeline's stages sent to services of their own (--endpoint-embed, --model-rerank, ...: client.stages)
    stage_endpoints: dict[str, str] = field(default_factory=dict)
    stage_models: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_target()
        self._check_load()
        self._check_limits()

    def _check_target(self) -> None:
        if self.endpoint is not None:
            check_url("--endpoint", self.endpoint, "an OpenAI base URL like http://127.0.0.1:8000/v1")
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ConfigError(f"--model {self.model!r}: give a model name (or leave it out to ask the endpoint)")
        if self.api not in APIS:
            raise ConfigError(f"--api {self.api!r}: use one of {', '.join(APIS)}")
        if self.server_metrics not in (None, "auto", "off"):
            check_url("--server-metrics", str(self.server_metrics), "auto, off or a URL like http://host:8000/metrics")
        if not isinstance(self.extra_body, dict):
            raise ConfigError(f"--extra-body {self.extra_body!r}: must be a JSON object")
        if self.per_chunk_usage not in PER_CHUNK_USAGE:
            raise ConfigError(f"--per-chunk-usage {self.per_chunk_usage!r}: use auto, on or off")
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer.strip()):
            raise ConfigError(f"--tokenizer {self.tokenizer!r}: give a tokenizer.json path or builtin, or leave it out")
        if not isinstance(self.http, EndpointOptions):
            raise ConfigError(f"RunSettings.http {self.http!r}: must be an EndpointOptions")
        if self.max_tokens_field not in MAX_TOKENS_FIELDS:
            raise ConfigError(f"--max-tokens-field {self.max_tokens_field!r}: use {', '.join(MAX_TOKENS_FIELDS)}")
        if self.transport not in TRANSPORTS:
            raise ConfigError(f"--transport {self.transport!r}: use {' or '.join(TRANSPORTS)}")
        for stage, url in self.stage_endpoints.items():
            check_url(f"--endpoint-{stage}", url, "an OpenAI base URL like http://127.0.0.1:8001/v1")
        for stage, name in self.stage_models.items():
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"--model-{stage} {name!r}: give a model name")

    def _check_load(self) -> None:
        a = self.arrival
        if a.rate is not None:
            _check("--rate", a.rate, 0, MAX_RATE, above=True, unit=" requests/s")
        if a.concurrency is not None:
            _check("--concurrency", a.concurrency, 1, MAX_CONCURRENCY, integer=True)
        if self.duration_s is None and self.requests is None:
            raise ConfigError("give --duration or --requests (or both: whichever ends first)")
        if self.duration_s is not None:
            _check("--duration", self.duration_s, 0, MAX_DURATION_S, above=True, unit=" seconds")
        if self.requests is not None:
            _check("--requests", self.requests, 1, MAX_REQUESTS, integer=True)
        elif a.rate is not None and self.duration_s is not None and a.rate * self.duration_s > MAX_REQUESTS:
            raise ConfigError(
                f"--rate {a.rate:g} for --duration {self.duration_s:g} is ~{a.rate * self.duration_s:.3g} "
                f"requests, more than a run's limit of {MAX_REQUESTS:,}; check the rate and duration"
            )
        _check("--seed", self.seed, 0, MAX_SEED, integer=True)
        _check("--warmup", self.warmup_s, 0, MAX_DURATION_S, unit=" seconds")
        _check("--cooldown", self.cooldown_s, 0, MAX_DURATION_S, unit=" seconds")
        if self.duration_s and self.warmup_s + self.cooldown_s >= self.duration_s:
            raise ConfigError(
                f"--warmup {self.warmup_s:g} + --cooldown {self.cooldown_s:g} leave no measurement "
                f"window in --duration {self.duration_s:g}"
            )

    def _check_limits(self) -> None:
        _check("--max-inflight", self.max_inflight, 1, MAX_INFLIGHT, integer=True)
        _check("--drain", self.drain_s, 0, MAX_DURATION_S, unit=" seconds")
        _check("--lag-limit-ms", self.lag_limit_ms, 0, 3.6e6, above=True, unit=" ms")
        _check("--workers", self.workers, 1, MAX_WORKERS, integer=True)
        _check("point", self.point, 0, MAX_REQUESTS, integer=True)
        if self.arrival.kind == "closed" and self.workers > (self.arrival.concurrency or 1):
            raise ConfigError(f"--workers {self.workers} exceeds --concurrency {self.arrival.concurrency}")


def _check(
    flag: str, value: object, lo: float, hi: float, *, above: bool = False, integer: bool = False, unit: str = ""
) -> None:
    """``value`` is a finite number (an integer if asked) in [lo, hi], or (lo, hi] when ``above``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (isinstance(value, int) or not integer):
        if math.isfinite(value) and (value > lo if above else value >= lo) and value <= hi:
            return
    what = "an integer" if integer else "a finite number"
    raise ConfigError(f"{flag} {value!r}: must be {what} in {'(' if above else '['}{_fmt(lo)}, {_fmt(hi)}]{unit}")


def _fmt(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.0f}" if x.is_integer() else f"{x:g}"


def check_url(flag: str, url: str, expected: str) -> str:
    """``url`` if it is an http(s) URL with a host and a usable port; else a ConfigError naming ``flag``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:  # an unclosed [IPv6 literal, a port that is no number or out of range
        raise ConfigError(f"{flag} {url!r}: not a valid URL ({str(e).lower()})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{flag} {url!r}: expected {expected}")
    if port == 0:
        raise ConfigError(f"{flag} {url!r}: port 0 cannot be connected to")
    return url


def engine_config(
    settings: RunSettings,
    url: str,
    model: str,
    run_id: str,
    *,
    shard: int = 0,
    shards: int = 1,
    stages: tuple[str, ...] = (),
) -> EngineConfig:
    """What the engine of one shard (of ``shards``) of this run is told; ``stages``: the pooled
    stages of a pipeline workload, each to its own endpoint and model, else the run's."""
    routes = tuple(
        StageEndpoint(s, u, settings.stage_models.get(s, model), endpoint_label(u))
        for s in stages
        for u in [settings.stage_endpoints.get(s, url)]
    )
    return EngineConfig(
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
        continuous_usage=settings.per_chunk_usage == "on",  # "auto" unresolved: not asked
        tokenizer=settings.tokenizer,
        http=settings.http,
        max_tokens_field=settings.max_tokens_field,
        transport=settings.transport,
        stages=routes,
    )


@dataclass
class RunResult:
    """What a run did, as the command that started it reports it (and picks its exit code by)."""

    run_dir: Path
    run_id: str
    records: int
    client: dict[str, Any]
    interrupted: bool = False
    stop_reason: str | None = None  # what stopped it first: "SIGINT", "SIGTERM"
    drain_cut: bool = False  # a second interrupt ended the drain
    cut_inflight: int = 0  # requests in flight at the cut, recorded as cancelled
    failure: str | None = None  # when every request failed: the most common failure and its count


def api_key_from_env(name: str | None) -> str | None:
    """The API key: from ``$NAME`` when given (which must exist), else $OPENAI_API_KEY."""
    if name:
        value = os.environ.get(name)
        if not value:
            raise ConfigError(f"--api-key-env {name}: that environment variable is not set")
        return value
    return os.environ.get("OPENAI_API_KEY") or None


def settings_json(settings: RunSettings) -> dict[str, Any]:
    """The settings as run.json keeps them: URLs without credentials (``endpoint_label``), the
    endpoint options without a header's value (``EndpointOptions.json``: names, TLS files, insecure)."""
    d = {k: v for k, v in asdict(settings).items() if k != "http"}
    d.update(settings.http.json())
    d["arrival"] = {**asdict(settings.arrival), "label": str(settings.arrival)}
    for key in ("endpoint", "server_metrics"):
        if d[key] not in (None, "auto", "off"):
            d[key] = endpoint_label(d[key])
    d["stage_endpoints"] = {stage: endpoint_label(url) for stage, url in settings.stage_endpoints.items()}
    return d
