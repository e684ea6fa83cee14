"""Sweep planning: a sweep's shape (``SweepPlan``) and its load-point lists (``parse_list``).

A sweep is a fixed list of load points (rates or concurrencies, parsed by ``parse_list``) or
an automatic search; ``SweepPlan`` holds either, with the timing of each point, and says
before anything is sent how long the sweep can take. A point runs a fixed window, or with
``sizing`` (``sweep.sizing``) until it holds the samples its p99 verdicts need, within caps.
The search itself (ramp, spread, bisect; ``next_step``) is in ``sweep.search`` and the SLO
attainment statistics in ``analysis.attainment``. Nothing here sends or reads a clock
(``sweep.run`` sends the points): the plan's next step is a pure function of its settings
and of the points measured so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadgen.analysis.saturation import Observation
from loadgen.errors import ConfigError
from loadgen.schedule import Arrival
from loadgen.sweep.search import AutoSearch, Step, _round_rate, count_cv
from loadgen.sweep.search import next_step as search_step
from loadgen.sweep.sizing import Sizing

__all__ = ["SweepPlan", "parse_list"]

History = Sequence[tuple[Step, Observation]]


@dataclass(frozen=True)
class SweepPlan:
    """A sweep's shape: a fixed list of arrivals, or an automatic search; timing per point.

    ``point_duration_s`` is every point's window when ``sizing`` is None; with ``sizing`` each
    point's window is sized (``sizing.min_s`` to ``sizing.max_point_s``)."""

    mode: str  # "rates" | "concurrency" | "auto"
    arrivals: tuple[Arrival, ...] = ()
    point_duration_s: float = 6.0
    warmup_s: float = 2.0
    drain_s: float = 15.0
    auto: AutoSearch = field(default_factory=AutoSearch)
    has_slo: bool = False
    kind: str = "poisson"
    cv: float | None = None
    sizing: Sizing | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("rates", "concurrency", "auto"):
            raise ConfigError(f"sweep mode {self.mode!r}: use rates, concurrency or auto")
        if self.mode != "auto" and not self.arrivals:
            raise ConfigError("a sweep needs at least one load point")
        if not self.point_duration_s > 0:
            raise ConfigError(f"--point-duration {self.point_duration_s}: must be > 0 seconds")
        if self.warmup_s < 0 or self.drain_s < 0:
            raise ConfigError("--warmup and --drain must be >= 0 seconds")

    def next_step(self, history: History = ()) -> Step | None:
        """The point sent after ``history``: the next listed one, or the search's next step."""
        if self.mode != "auto":
            steps = self.fixed_steps(history)
            return steps[len(history)] if len(history) < len(steps) else None
        return search_step(
            self.auto,
            list(history),
            point_duration_s=self.point_duration_s,
            has_slo=self.has_slo,
            kind=self.kind,
            cv=self.cv,
            sizing=self.sizing,
        )

    def fixed_steps(self, history: History = ()) -> list[Step]:
        """The listed points with their windows (those in ``history`` as they were sent).

        Sized, a rate point is a pure function of the settings; a concurrency point has no
        rate before it runs, so it is sized by the completed rate of the point before it
        (scaled down when it has fewer users: Little's law), and the first runs its cap."""
        if self.sizing is None:
            return [Step(a, "list", "given", self.point_duration_s) for a in self.arrivals]
        steps = [s for s, _ in history][: len(self.arrivals)]
        spent = sum(s.duration_s for s in steps)
        for a in self.arrivals[len(steps) :]:
            sized = self.sizing.sized(_rate_estimate(a, history), spent, count_cv(a.kind, a.cv))
            steps.append(Step(a, "list", "given", sized.duration_s, sized.needed_s, sized.capped))
            spent += sized.duration_s
        return steps

    def max_points(self) -> int:
        if self.mode != "auto":
            return len(self.arrivals)
        a = self.auto
        return a.max_ramp_points + len(a.spread) + (a.max_bisect if self.has_slo else 0)

    def time_bound_s(self) -> tuple[float, float]:
        """(sending time without drains, upper bound with every drain used up), in seconds."""
        if self.mode != "auto":
            steps = self.fixed_steps()
            send = sum(self.warmup_s + s.duration_s for s in steps)
            return send, send + len(steps) * self.drain_s
        a = self.auto
        fixed = a.max_ramp_points + len(a.spread)
        bisect = a.max_bisect if self.has_slo else 0
        if self.sizing is not None:
            z = self.sizing
            send = min(z.max_total_s, (fixed + bisect) * z.max_point_s) + (fixed + bisect) * self.warmup_s
        else:
            per = self.warmup_s + self.point_duration_s
            send = fixed * per + bisect * (self.warmup_s + a.max_stretch * self.point_duration_s)
        return send, send + (fixed + bisect) * self.drain_s

    def describe(self) -> str:
        """The plan in one paragraph, printed before anything is sent."""
        send, bound = self.time_bound_s()
        measured = f"{self.point_duration_s:g} s measured"
        if self.sizing is not None:
            measured = self.sizing.describe(count_cv(self.kind, self.cv))
        per = f"{self.warmup_s:g} s warm-up + {measured} + drain (<= {self.drain_s:g} s)"
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
            longer = "" if self.sizing is not None else f" (each up to {a.max_stretch:g}x longer to confirm)"
            parts.append(f"<= {a.max_bisect} bisection points for capacity at {a.target_pct:g}% SLO attainment{longer}")
        return (
            f"auto search: {'; '.join(parts)}; each point {per}; at most {self.max_points()} points, "
            f"typically ~{send * 0.8:.0f} s, at most {bound:.0f} s"
        )


def _rate_estimate(a: Arrival, history: History) -> float | None:
    """The rate a listed point will see: its own, or for a closed loop a lower estimate from the
    point before (throughput does not fall with more users; with fewer, at most in proportion)."""
    if a.rate is not None:
        return float(a.rate)
    if not history or a.concurrency is None:
        return None
    step, obs = history[-1]
    before = step.arrival.concurrency
    if before is None or not (obs.completed_rps > 0 and math.isfinite(obs.completed_rps)):
        return None
    return obs.completed_rps * min(1.0, a.concurrency / before)


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
