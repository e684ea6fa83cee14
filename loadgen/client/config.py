"""What an engine is told (its config, timeouts and plan) and what it shows while it runs.

Plain data, apart from the engine so that the runner, the CLI and worker processes
can build and pass it without importing the HTTP client.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import astuple, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from loadgen.client.endpoint import endpoint_path
from loadgen.client.endpoint_options import MAX_TOKENS_FIELDS, EndpointOptions
from loadgen.client.stages import StageEndpoint
from loadgen.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from loadgen.workload.session import Session

__all__ = [
    "APIS",
    "api_path",
    "Timeouts",
    "TIMEOUT_FLAGS",
    "EngineConfig",
    "Route",
    "Plan",
    "LiveCounters",
    "MAX_TIMEOUT_S",
    "TRANSPORTS",
    "MAX_INFLIGHT",
    "DEFAULT_MAX_INFLIGHT",
]

# Limits: far beyond any sensible run, near enough to catch a typo (or a unit mistake)
# before it costs memory or a night.
MAX_TIMEOUT_S = 30 * 86_400.0  # 30 days
MAX_INFLIGHT = 1_000_000
DEFAULT_MAX_INFLIGHT = 10_000  # a safety cap; reaching it is reported, never silent
_BUFSIZE = (4 * 1024, 1 << 30)  # a read buffer from 4 KiB to 1 GiB
_MAX_SHARDS = 4096
TRANSPORTS = ("lean", "aiohttp")  # --transport
# chat and completions stream chunks, responses streams typed events (the Responses API), and
# embeddings and rerank answer one JSON body (pooled: prefill only, no output tokens)
APIS = ("chat", "completions", "responses", "embeddings", "rerank")
_PATHS = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "responses": "/responses",
    "embeddings": "/embeddings",
    "rerank": "/rerank",
}


def api_path(api: str) -> str:
    """The route a request of ``api`` goes to, below the base URL (``/chat/completions``, ...)."""
    return _PATHS[api]


def _positive(flag: str, value: object, hi: float, unit: str) -> None:
    """``value`` is a finite number in (0, hi]; else a ConfigError naming ``flag``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= hi:
        return
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > hi:
        raise ConfigError(f"{flag} {value!r}: more than {hi:,.0f} {unit}: check the unit")
    raise ConfigError(f"{flag} {value!r}: must be a finite number of {unit} > 0")


def _integer(flag: str, value: object, lo: int, hi: int) -> None:
    """``value`` is an integer in [lo, hi]; else a ConfigError naming ``flag``."""
    if not (isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi):
        raise ConfigError(f"{flag} {value!r}: must be an integer from {lo:,} to {hi:,}")


@dataclass(frozen=True)
class Timeouts:
    """Per-request limits, in seconds, each enforced by a timer of the request's own, to within
    a millisecond or two (the loop's timer resolution) of its time; ``first_byte`` and ``total``
    count from the request's intended instant.

    ``first_byte`` runs until the first output-carrying event (the first token: TTFT, queueing
    included); SSE comments, keep-alives, role-only deltas and tool-call headers do not end it,
    so a server that sends keep-alives and nothing else is cut off at it. ``idle`` is the longest
    gap allowed between two reads once the body's first read came (any bytes count, comments
    included: a server that keeps a slow answer alive with comments is not idle). ``total``
    bounds the whole request. ``connect`` bounds opening a connection."""

    connect: float = 10.0
    first_byte: float = 600.0
    idle: float = 60.0
    total: float = 3600.0

    def __post_init__(self) -> None:
        for flag, value in zip(TIMEOUT_FLAGS, astuple(self), strict=True):
            _positive(flag, value, MAX_TIMEOUT_S, "seconds")


TIMEOUT_FLAGS = ("--connect-timeout", "--first-byte-timeout", "--idle-timeout", "--request-timeout")  # field order


@dataclass(frozen=True)
class EngineConfig:
    """What one engine (one shard of one load point) is told; validated here, so a worker
    process refuses a bad config as the command line does."""

    url: str  # OpenAI base URL, ending in /v1
    model: str
    api: str = "chat"  # chat | completions
    run_id: str = ""
    endpoint_label: str = ""
    point: int = 0
    shard: int = 0
    shards: int = 1
    timeouts: Timeouts = field(default_factory=Timeouts)
    ignore_eos: bool = True
    keep_text: bool = False
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    read_bufsize: int = 4 * 1024 * 1024
    flush_interval_s: float = 0.2  # how often records are flushed (timeouts have timers of their own)
    extra_body: dict[str, Any] = field(default_factory=dict)
    # Per-chunk token counts (issue 15): ask for running usage on every chunk (vLLM's
    # ``stream_options.continuous_usage_stats``), else count each chunk's text with ``tokenizer``
    # (a tokenizer.json path or "builtin", loaded by the engine: a config crosses to workers).
    continuous_usage: bool = False
    tokenizer: str | None = None
    # How requests reach the endpoint (headers, key header, TLS, proxy): the transport's and headers'
    http: EndpointOptions = field(default_factory=EndpointOptions)
    max_tokens_field: str = "max_tokens"  # max_tokens | max_completion_tokens | both
    # A pipeline's stages with endpoints of their own (client.stages); a stage not here is the run's
    stages: tuple[StageEndpoint, ...] = ()
    transport: str = "lean"  # the wire: loadgen's own HTTP/1.1 ("lean") or aiohttp's client (client.wire.choice)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"--endpoint {self.url!r}: expected an OpenAI base URL like http://127.0.0.1:8000/v1")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"--model {self.model!r}: give a model name")
        if self.api not in APIS:
            raise ConfigError(f"--api {self.api!r}: use one of {', '.join(APIS)}")
        if not isinstance(self.timeouts, Timeouts):
            raise ConfigError(f"EngineConfig.timeouts {self.timeouts!r}: must be a Timeouts")
        _integer("--max-inflight", self.max_inflight, 1, MAX_INFLIGHT)
        _integer("--workers", self.shards, 1, _MAX_SHARDS)
        _integer("EngineConfig.shard", self.shard, 0, self.shards - 1)
        _integer("EngineConfig.point", self.point, 0, 1 << 62)
        _integer("EngineConfig.read_bufsize", self.read_bufsize, *_BUFSIZE)
        _positive("EngineConfig.flush_interval_s", self.flush_interval_s, 60.0, "seconds")
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer.strip()):
            raise ConfigError(f"--tokenizer {self.tokenizer!r}: give a tokenizer.json path, or leave it out")
        if not isinstance(self.extra_body, dict):
            raise ConfigError(f"--extra-body {self.extra_body!r}: must be a JSON object")
        if not isinstance(self.http, EndpointOptions):
            raise ConfigError(f"EngineConfig.http {self.http!r}: must be an EndpointOptions")
        if self.max_tokens_field not in MAX_TOKENS_FIELDS:
            raise ConfigError(f"--max-tokens-field {self.max_tokens_field!r}: use {', '.join(MAX_TOKENS_FIELDS)}")
        if not all(isinstance(s, StageEndpoint) for s in self.stages):
            raise ConfigError(f"EngineConfig.stages {self.stages!r}: must be StageEndpoints")
        if self.transport not in TRANSPORTS:
            raise ConfigError(f"--transport {self.transport!r}: use {' or '.join(TRANSPORTS)}")

    @property
    def path(self) -> str:
        return api_path(self.api)

    @property
    def request_url(self) -> str:
        """Where requests go: the base URL's path and ``path``, its query (a key, say) kept after them."""
        return endpoint_path(self.url, self.path)

    def route(self, stage: str, api: str) -> Route:
        """Where a request of ``stage`` ("" outside a pipeline) and ``api`` ("" = the run's) goes."""
        api = api or self.api
        own = next((s for s in self.stages if s.stage == stage), None)
        if own is None:
            return Route(stage, api, endpoint_path(self.url, api_path(api)), self.model, self.endpoint_label)
        return Route(stage, api, endpoint_path(own.url, api_path(api)), own.model, own.label or self.endpoint_label)


class Route(NamedTuple):
    """A request's destination: its stage, API, full URL, model and endpoint label (client.stages)."""

    stage: str
    api: str
    url: str
    model: str
    label: str


@dataclass
class Plan:
    """What to send. Open loop: ``offsets_ns[i]`` is session i's start offset and
    ``indices`` the sessions this shard sends. Closed loop: ``concurrency`` users
    take session indices in order until ``count`` or ``duration_s`` is reached."""

    session: Callable[[int], Session]
    offsets_ns: np.ndarray | None = None
    indices: np.ndarray | None = None
    concurrency: int | None = None
    count: int | None = None
    duration_s: float | None = None


@dataclass
class LiveCounters:
    """What the live view shows; the engine only counts, the view summarises."""

    scheduled: int = 0
    sent: int = 0
    inflight: int = 0
    done: int = 0
    errors: int = 0
    capped: int = 0  # sends delayed because max_inflight was reached
    recent_ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2048))
    recent_itl_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2048))
    recent_lag_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2048))
    loop_lag_max_ms: float = 0.0
    not_sent: int = 0  # scheduled requests never written to the wire (recorded ``not_sent``)
    housekeeping_errors: int = 0  # passes of the engine's housekeeping that raised (the next went on)
    writer_errors: int = 0  # records the writer refused (``add``) or batches it failed to flush
    internal_errors: int = 0  # sessions whose task raised (a bug; their turns still got records)
    last_error: str = ""  # the latest of those, as text (cleaned and redacted)
    # for the live view's progress (elapsed, remaining, tok/s); perf_counter_ns instants, 0 = not yet
    output_tokens: int = 0  # output tokens of every answer recorded so far, however it ended
    start_ns: int = 0  # the shared start instant of the schedule
    span_ns: int | None = None  # open loop: offset of this shard's last scheduled send
    stop_ns: int = 0  # when engine.stop() was first called (sending stopped, the drain began)

    def snapshot(self, recent: int = 256) -> LiveCounters:
        """A copy small enough to send to another process twice a second: every counter, and the
        latest ``recent`` samples of each kind (a worker sends these to its parent's live view)."""
        samples = ("recent_ttft_ms", "recent_itl_ms", "recent_lag_ms")
        trimmed = {k: deque(list(getattr(self, k))[-recent:], maxlen=recent) for k in samples}
        return LiveCounters(**{**vars(self), **trimmed})

    def health(self) -> dict[str, int | str]:
        """What the run's client health (run.json) says of the engine's own troubles."""
        return {
            "not_sent": self.not_sent,
            "housekeeping_errors": self.housekeeping_errors,
            "writer_errors": self.writer_errors,
            "internal_errors": self.internal_errors,
            "last_engine_error": self.last_error,
        }
