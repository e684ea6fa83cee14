"""Sweep planning: a sweep's shape (``SweepPlan``) and its load-point lists (``parse_list``).

A sweep is a fixed list of load points (rates or concurrencies, parsed by ``parse_list``) or
an automatic search; ``SweepPlan`` holds either, with the timing of each point, and says
before anything is sent how long the sweep can take. The search itself (ramp, spread,
bisect; ``next_step``) is in ``sweep.search`` and the SLO attainment statistics in
``analysis.attainment``. Nothing here sends or reads a clock (``sweep.run`` sends the points).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from loadgen.errors import ConfigError
from loadgen.schedule import Arrival
from loadgen.sweep.search import AutoSearch, Step, _round_rate

__all__ = ["SweepPlan", "parse_list"]


@dataclass(frozen=True)
class SweepPlan:
    """A sweep's shape: a fixed list of arrivals, or an automatic search; timing per point."""

    mode: str  # "rates" | "concurrency" | "auto"
    arrivals: tuple[Arrival, ...] = ()
    point_duration_s: float = 6.0
    warmup_s: float = 2.0
    drain_s: float = 15.0
    auto: AutoSearch = field(default_factory=AutoSearch)
    has_slo: bool = False
    kind: str = "poisson"
    cv: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("rates", "concurrency", "auto"):
            raise ConfigError(f"sweep mode {self.mode!r}: use rates, concurrency or auto")
        if self.mode != "auto" and not self.arrivals:
            raise ConfigError("a sweep needs at least one load point")
        if not self.point_duration_s > 0:
            raise ConfigError(f"--point-duration {self.point_duration_s}: must be > 0 seconds")
        if self.warmup_s < 0 or self.drain_s < 0:
            raise ConfigError("--warmup and --drain must be >= 0 seconds")

    def fixed_steps(self) -> list[Step]:
        return [Step(a, "list", "given", self.point_duration_s) for a in self.arrivals]

    def max_points(self) -> int:
        if self.mode != "auto":
            return len(self.arrivals)
        a = self.auto
        return a.max_ramp_points + len(a.spread) + (a.max_bisect if self.has_slo else 0)

    def time_bound_s(self) -> tuple[float, float]:
        """(sending time without drains, upper bound with every drain used up), in seconds."""
        per = self.warmup_s + self.point_duration_s
        if self.mode != "auto":
            n = len(self.arrivals)
            return n * per, n * (per + self.drain_s)
        a = self.auto
        fixed = a.max_ramp_points + len(a.spread)
        bisect = a.max_bisect if self.has_slo else 0
        send = fixed * per + bisect * (self.warmup_s + a.max_stretch * self.point_duration_s)
        return send, send + (fixed + bisect) * self.drain_s

    def describe(self) -> str:
        """The plan in one paragraph, printed before anything is sent."""
        send, bound = self.time_bound_s()
        per = f"{self.warmup_s:g} s warm-up + {self.point_duration_s:g} s measured + drain (<= {self.drain_s:g} s)"
        if self.mode != "auto":
            labels = ", ".join(str(a.rate) if a.rate is not None else str(a.concurrency) for a in self.arrivals)
            unit = "req/s" if self.mode == "rates" else "concurrent users"
            return (
                f"{len(self.arrivals)} points ({labels} {unit}); each {per}; "
                f"{send:.0f} s of sending, at most {bound:.0f} s"
            )
        a = self.auto
        parts = [
            f"ramp from {a.start_rate:g} req/s x{a.factor:g} until saturation "
            f"(<= {a.max_ramp_points} points, <= {a.max_rate:g} req/s)",
            f"{len(a.spread)} points at {', '.join(f'{f:.0%}' for f in a.spread)} of the capacity found",
        ]
        if self.has_slo:
            parts.append(
                f"<= {a.max_bisect} bisection points for capacity at {a.target_pct:g}% SLO attainment "
                f"(each up to {a.max_stretch:g}x longer to confirm)"
            )
        return (
            f"auto search: {'; '.join(parts)}; each point {per}; at most {self.max_points()} points, "
            f"typically ~{send * 0.8:.0f} s, at most {bound:.0f} s"
        )


_MAX_RANGE_POINTS = 100  # a START:STOP:STEP range longer than this is a typo, not a sweep


def parse_list(text: str, what: str, integer: bool = False) -> list[float]:
    """``1,2,4`` or ``1:16:x2`` (geometric) or ``4:20:+4`` (linear) -> values, validated.

    Every error names the flag, the list and the value at fault, in one line: an empty
    value (``1,,2``), a value that is not a finite number, not > 0, not whole (``integer``)
    or repeated, and a range that is malformed or longer than 100 points."""
    if not text.strip():
        raise ConfigError(f"{what} {text!r}: give at least one value")
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ConfigError(f"{what} {text!r}: an empty value (two commas in a row, or one at an end)")
        out.extend(_parse_range(part, what) if ":" in part else [_number(part, what, text)])
    for v in out:
        if not v > 0:
            raise ConfigError(f"{what} {text!r}: {v:g} must be > 0")
        if integer and not v.is_integer():
            raise ConfigError(f"{what} {text!r}: {v:g} is not a whole number")
    values = [float(int(v)) if integer else float(_round_rate(v)) for v in out]
    seen: set[float] = set()
    for v in values:  # after rounding: 1.001 and 1.002 would be the same point
        if v in seen:
            raise ConfigError(f"{what} {text!r}: {v:g} is repeated")
        seen.add(v)
    return values


def _number(s: str, what: str, text: str) -> float:
    """One value of ``text`` (a list, or a range's bound): a finite number, else a one-line ConfigError."""
    try:
        value = float(s)
    except ValueError:
        raise ConfigError(f"{what} {text!r}: {s!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{what} {text!r}: {s!r} is not a finite number")
    return value


def _parse_range(part: str, what: str) -> list[float]:
    bits = part.split(":")
    if len(bits) != 3 or bits[2][:1] not in ("x", "+"):
        raise ConfigError(f"{what} {part!r}: a range is START:STOP:xFACTOR or START:STOP:+STEP")
    start, stop, step = (_number(b, what, part) for b in (bits[0], bits[1], bits[2][1:]))
    geometric = bits[2][0] == "x"
    if start <= 0 or stop < start or (step <= 1 if geometric else step <= 0):
        raise ConfigError(f"{what} {part!r}: need 0 < START <= STOP and a growing step")
    vals: list[float] = []
    v = start
    while v <= stop * (1 + 1e-9):
        if len(vals) == _MAX_RANGE_POINTS:
            raise ConfigError(f"{what} {part!r}: the range has more than {_MAX_RANGE_POINTS} points")
        vals.append(v)
        v = v * step if geometric else v + step
    return vals
