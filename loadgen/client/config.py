"""What an engine is told (its config, timeouts and plan) and what it shows while it runs.

Plain data, apart from the engine so that the runner, the CLI and worker processes
can build and pass it without importing the HTTP client.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from loadgen.workload.session import Session

__all__ = ["Timeouts", "EngineConfig", "Plan", "LiveCounters", "redact"]

_ERROR_CHARS = 300
_KEYLIKE = re.compile(r"(sk-|Bearer\s+)[A-Za-z0-9_\-.]{6,}")


@dataclass(frozen=True)
class Timeouts:
    """Per-request limits, in seconds. ``first_byte`` runs until the first data
    after the request is sent (that is TTFT, queueing included); ``idle`` is the
    longest gap allowed between reads after that."""

    connect: float = 10.0
    first_byte: float = 600.0
    idle: float = 60.0
    total: float = 3600.0


@dataclass(frozen=True)
class EngineConfig:
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
    max_inflight: int = 10_000  # a safety cap; reaching it is reported, never silent
    read_bufsize: int = 4 * 1024 * 1024
    flush_interval_s: float = 0.2
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return "/chat/completions" if self.api == "chat" else "/completions"


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


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Short, single-line error text with secrets and key-like tokens removed."""
    for s in secrets:
        if s:
            text = text.replace(s, "[REDACTED]")
    text = _KEYLIKE.sub(lambda m: m.group(1) + "[REDACTED]", text)
    text = " ".join(text.split())
    return text[:_ERROR_CHARS]


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
