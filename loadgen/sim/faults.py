"""Fault and quirk injection for the simulated server.

A ``FaultSpec`` is parsed from one CLI string, e.g.
``http500=0.05,http429=0.02:1.5,disconnect=0.05,stall=0.02:2.0,malformed=0.01,
usage_under=0.5,buffered,ignore_max_tokens,ignore_eos_ignored``. Rates are per
request; which request gets which fault is drawn from a seeded generator keyed by the
request's number in the run (its ``X-Loadgen-Seq``; the order of arrival for a client
that sends none), so a fault run is reproducible, and the same traffic meets the same
faults however its requests happen to interleave.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

import numpy as np

from loadgen.errors import ConfigError

__all__ = ["FaultSpec", "FaultPlan", "parse_faults", "FaultSpecError"]


class FaultSpecError(ConfigError):
    pass


@dataclass(frozen=True)
class FaultSpec:
    http500: float = 0.0  # answer 500 with an OpenAI-style error body
    http429: float = 0.0  # answer 429 with Retry-After
    retry_after_s: float = 1.0
    disconnect: float = 0.0  # close the connection mid-stream
    stall: float = 0.0  # pause mid-stream
    stall_s: float = 1.0
    malformed: float = 0.0  # send one non-JSON data line mid-stream
    usage_under: float = 1.0  # multiply reported completion_tokens (a liar when < 1)
    buffered: bool = False  # hold every chunk until the answer is complete
    ignore_max_tokens: bool = False  # generate max_tokens * 2
    ignore_eos_ignored: bool = False  # stop at the natural length even with ignore_eos
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("http500", "http429", "disconnect", "stall", "malformed"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise FaultSpecError(f"--faults {name}={v}: a rate must be within 0..1")
        if self.http500 + self.http429 > 1.0:
            raise FaultSpecError("--faults: http500 + http429 must not exceed 1")
        if self.usage_under < 0:
            raise FaultSpecError("--faults usage_under must be >= 0")

    @functools.cached_property
    def any(self) -> bool:
        """Some fault or quirk is on (cached: asked once per request, and the spec is frozen)."""
        return self != FaultSpec(seed=self.seed)


_FLAGS = {"buffered", "ignore_max_tokens", "ignore_eos_ignored"}
_WITH_ARG = {"http429": "retry_after_s", "stall": "stall_s"}


def parse_faults(text: str | None) -> FaultSpec:
    """Parse the ``--faults`` string; an unknown name or bad number names itself."""
    if not text:
        return FaultSpec()
    known = {f.name for f in fields(FaultSpec)}
    values: dict[str, float | bool | int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, raw = item.partition("=")
        if name in _FLAGS and not raw:
            values[name] = True
            continue
        if name not in known or name in _FLAGS or not raw:
            raise FaultSpecError(
                f"--faults: unknown or incomplete item {item!r}; known: "
                + ", ".join(sorted(known - {"retry_after_s", "stall_s"}))
            )
        rate, _, arg = raw.partition(":")
        try:
            values[name] = int(rate) if name == "seed" else float(rate)
            if arg and name in _WITH_ARG:
                values[_WITH_ARG[name]] = float(arg)
            elif arg:
                raise ValueError(arg)
        except ValueError:
            raise FaultSpecError(f"--faults: {item!r} is not a number") from None
        if any(isinstance(v, float) and not (math.isfinite(v) and v >= 0) for v in values.values()) or (
            isinstance(values.get("seed"), int) and int(values["seed"]) < 0
        ):
            raise FaultSpecError(f"--faults: {item!r}: rates, durations and the seed must be finite and >= 0")
    return FaultSpec(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What happens to one request."""

    status: int = 200  # 500 or 429 to fail up front
    disconnect_at: int = -1  # token index after which the connection is cut
    stall_at: int = -1  # token index before which the stream pauses
    malformed_at: int = -1  # token index before which a bad line is sent


def plan_for(spec: FaultSpec, seq: int, n_tokens: int) -> FaultPlan:
    """The fault plan of request ``seq``: a pure function of (spec, seq)."""
    if not spec.any:
        return FaultPlan()
    rng = np.random.default_rng([spec.seed, seq])
    u = rng.random(5)
    status = 500 if u[0] < spec.http500 else 429 if u[0] < spec.http500 + spec.http429 else 200
    where = int(rng.integers(0, max(n_tokens, 1)))
    return FaultPlan(
        status=status,
        disconnect_at=where if u[1] < spec.disconnect else -1,
        stall_at=where if u[2] < spec.stall else -1,
        malformed_at=where if u[3] < spec.malformed else -1,
    )
