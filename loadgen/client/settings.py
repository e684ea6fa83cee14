"""What a run is told: the settings that decide what it sends, and the engine config they give.

Validated at construction, so a contradictory run is refused before anything is sent;
run.json prints them (``settings_json``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadgen.client.config import Timeouts
from loadgen.errors import ConfigError
from loadgen.schedule import Arrival

__all__ = ["RunSettings", "RunResult", "api_key_from_env", "settings_json"]


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


def settings_json(settings: RunSettings) -> dict[str, Any]:
    d = asdict(settings)
    d["arrival"] = {**asdict(settings.arrival), "label": str(settings.arrival)}
    return d
