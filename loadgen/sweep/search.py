"""The sweep's automatic search: which load points to send, as pure functions of what was observed.

A sweep is a list of load points (rates or concurrencies) or an automatic search
(``--auto``) in the spirit of MLPerf's peak search:

1. **ramp**: from a light rate, multiply by ``factor`` until the endpoint saturates,
   i.e. achieved throughput stops keeping up with the offered rate (or stops
   rising while the offered rate still does), or the client itself falls behind.
   An endpoint already past saturation at the light rate (a slow one, or heavy
   requests such as a RAG pipeline's) is ramped *down* instead, dividing by
   ``factor`` (at most ``MAX_STEPS_DOWN`` times) until a point keeps up; the ramp's
   points are then judged in order of rate;
2. **spread**: place points at fractions of the capacity found, where the Pareto
   curve bends (the geometric ramp leaves that region sparse);
3. **bisect** (with an SLO): between the highest rate that meets the SLO
   attainment target and the lowest that misses it, until the bracket is within
   ``tolerance``. Bisection points run long enough that a clean pass can be
   *confirmed* (Clopper-Pearson lower bound of attainment >= target).

With a ``sizing.Sizing`` every point runs until its window holds the samples its p99
verdicts need (within a cap per point), and the search ends when the sweep's budget of
measured time is used up; without one, each runs a fixed ``point_duration_s``.

Only points whose validity allows a verdict count (``Observation.judgeable``, and for
capacity ``_trusted``): a suspect point is kept in the history (and the report shows it,
marked) but never called saturated, never sets the capacity found, and never brackets
the bisection. The ramp does stop at a suspect point that looks past saturation
(``overloaded_suspect``): going higher would only load the client and the endpoint more.

Nothing here sends or reads a clock: ``next_step`` maps the history of
(step, observation) pairs to the next step, so the search is tested with
made-up observations and a sweep is replayable from its run.json.

The SLO statistics it uses live in ``analysis.attainment`` and the saturation test in
``analysis.saturation`` (the report judges finished sweeps by the same test); the sweep's
plan (a fixed list or this search, timing per point) and list parsing in ``plan``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from loadgen.analysis.attainment import samples_to_confirm
from loadgen.analysis.points import PointJson
from loadgen.analysis.saturation import KEEP_UP, MIN_GAIN, Observation, first_saturated, saturation_reason
from loadgen.analysis.validity import VALID
from loadgen.errors import ConfigError
from loadgen.schedule import Arrival
from loadgen.sweep.sizing import Sizing

__all__ = [
    "MAX_STEPS_DOWN",
    "step_down",
    "AutoSearch",
    "Step",
    "served_rps",
    "capacity_estimate",
    "next_step",
    "search_end",
    "count_cv",
    "spent_s",
    "overloaded_suspect",
]

MAX_STEPS_DOWN = 4  # an endpoint past saturation at the start rate is ramped down at most this many times


@dataclass(frozen=True)
class AutoSearch:
    """Knobs of the automatic search (a bare ``loadgen sweep`` starts higher: ``sweep_cmd``)."""

    start_rate: float = 2.0
    factor: float = 2.0
    max_rate: float = 256.0
    max_ramp: int = 8
    spread: tuple[float, ...] = (0.5, 0.75, 0.9)  # fractions of the capacity found
    keep_up: float = KEEP_UP  # delivered / offered below this: the endpoint is not keeping up
    min_gain: float = MIN_GAIN  # throughput rising less than this while load rose 1.5x: saturated
    target_pct: float = 99.0  # SLO attainment target
    confidence: float = 0.95
    tolerance: float = 0.1  # bisection stops when hi / lo <= 1 + tolerance
    max_bisect: int = 4
    max_stretch: float = 3.0  # unsized: a bisection point may run this many point durations to gather samples

    def __post_init__(self) -> None:
        if not (self.start_rate > 0 and math.isfinite(self.start_rate)):
            raise ConfigError(f"--start-rate {self.start_rate}: must be > 0 req/s")
        if not self.factor > 1:
            raise ConfigError(f"ramp factor {self.factor}: must be > 1")
        if not self.max_rate >= self.start_rate:
            raise ConfigError(f"--max-rate {self.max_rate}: must be >= the start rate {self.start_rate}")
        if not 0 < self.target_pct < 100:
            raise ConfigError(f"--slo-target {self.target_pct}: must be a percentage strictly between 0 and 100")
        if not 0 < self.confidence < 1:
            raise ConfigError(f"confidence {self.confidence}: must be strictly between 0 and 1")
        if any(not 0 < f < 1 for f in self.spread):
            raise ConfigError("spread fractions must be strictly between 0 and 1")
        if self.max_ramp < 1 or self.max_bisect < 0 or self.max_stretch < 1:
            raise ConfigError("max_ramp >= 1, max_bisect >= 0 and max_stretch >= 1 are required")

    @property
    def max_ramp_points(self) -> int:
        """Ramp points the rate range allows (start, start*f, ... <= max_rate), at most max_ramp."""
        n = int(math.floor(math.log(self.max_rate / self.start_rate) / math.log(self.factor) + 1e-9)) + 1
        return max(1, min(self.max_ramp, n))


@dataclass(frozen=True)
class Step:
    """One load point to send: its arrival, how long, and why the planner chose it.

    A sized point (``sizing.Sizing``) also says how long its samples needed (``needed_s``)
    and which cap, if any, shortened it (``capped``: "point" or "sweep")."""

    arrival: Arrival
    phase: str  # "list" | "ramp" | "spread" | "bisect"
    why: str
    duration_s: float  # measurement window (warm-up comes on top)
    needed_s: float | None = None  # sized: the window its samples need (inf: unknown); None: not sized
    capped: str = ""

    @property
    def rate(self) -> float:
        return float(self.arrival.rate) if self.arrival.rate is not None else math.nan

    def sizing_json(self) -> dict[str, float | str | None] | None:
        """run.json's per-point ``sizing`` (None for a point of fixed length)."""
        if self.needed_s is None:
            return None
        needed = self.needed_s if math.isfinite(self.needed_s) else None
        return {"needed_s": needed, "capped": self.capped or None}

    def to_json(self) -> PointJson:
        """The step's part of its run.json point entry."""
        return {
            "phase": self.phase,
            "why": self.why,
            "duration_s": self.duration_s,
            "arrival": {
                "kind": self.arrival.kind,
                "rate": self.arrival.rate,
                "cv": self.arrival.cv,
                "concurrency": self.arrival.concurrency,
                "label": str(self.arrival),
            },
        }


# --------------------------------------------------------------------------- saturation


def _ramp(history: list[tuple[Step, Observation]]) -> list[Observation]:
    """The ramp's points by rising rate (a ramp that stepped down measured its lower rates last)."""
    return sorted((obs for step, obs in history if step.phase == "ramp"), key=lambda o: o.rate)


def _saturation(history: list[tuple[Step, Observation]], cfg: AutoSearch) -> tuple[int, str] | None:
    """(index by rising rate, reason) of the first saturated ramp point."""
    return first_saturated(_ramp(history), cfg.keep_up, cfg.min_gain)


def step_down(history: list[tuple[Step, Observation]], cfg: AutoSearch) -> float | None:
    """The rate to step down to while every ramp point was past saturation (called so, or
    looking so while suspect), or None: a point kept up, or the ramp may step no lower."""
    ramp = _ramp(history)
    if not ramp or len(ramp) >= cfg.max_ramp:
        return None
    if any(saturation_reason(None, replace(o, validity=VALID), cfg.keep_up, cfg.min_gain) is None for o in ramp):
        return None  # a point kept up (or could not be judged as overloaded): the ramp goes on upwards
    rate = _round_rate(ramp[0].rate / cfg.factor)
    return rate if rate >= cfg.start_rate / cfg.factor**MAX_STEPS_DOWN * (1 - 1e-9) else None


def overloaded_suspect(history: list[tuple[Step, Observation]], cfg: AutoSearch) -> str | None:
    """Why the last ramp point looks past saturation although it is suspect (so it is not
    *called* saturated), or None. The ramp stops there: a higher rate would only load the
    client and the endpoint more, and leave a backlog for the next point."""
    ramp = _ramp(history)
    if not ramp or not ramp[-1].validity.withholding.suspect:
        return None
    prev = next((o for o in reversed(ramp[:-1]) if o.judgeable), None)
    return saturation_reason(prev, replace(ramp[-1], validity=VALID), cfg.keep_up, cfg.min_gain)


def served_rps(obs: Observation) -> float:
    """Requests/s the endpoint served, from the tokens it delivered when known: at an overloaded
    point few requests *finish* inside a short window although the engine runs flat out."""
    ratio = obs.keep_up_ratio
    if obs.expected_output_tps > 0 and ratio == ratio:
        return ratio * obs.offered_rps
    return obs.completed_rps


def _trusted(obs: Observation) -> bool:
    """A point a capacity figure may rest on: not suspect (``few_samples`` aside: the
    attainment bounds judge sample size themselves)."""
    return not obs.validity.withholding.suspect


def capacity_estimate(history: list[tuple[Step, Observation]]) -> float:
    """Highest served request rate seen at a judgeable point: what the endpoint sustains at saturation."""
    return max((r for _, obs in history if obs.judgeable and (r := served_rps(obs)) == r), default=0.0)


# --------------------------------------------------------------------------- the search


def _near(rate: float, rates: list[float], rel: float = 0.1) -> bool:
    return any(abs(rate - r) <= rel * max(rate, r) for r in rates)


def _open(rate: float, kind: str, cv: float | None) -> Arrival:
    return Arrival(kind, rate=_round_rate(rate), cv=cv if kind == "gamma" else None)


def _round_rate(rate: float) -> float:
    """Three significant digits: readable labels, and replays give identical schedules."""
    return float(f"{rate:.3g}")


def count_cv(kind: str, cv: float | None) -> float:
    """CV of the gaps between arrivals of this kind (what a window's count varies by)."""
    return 0.0 if kind == "constant" else (cv if kind == "gamma" and cv is not None else 1.0)


def spent_s(history: list[tuple[Step, Observation]]) -> float:
    """Measured seconds the points so far were planned to run (a sized sweep's budget spent)."""
    return sum(step.duration_s for step, _ in history)


@dataclass(frozen=True)
class _Timing:
    """How long the search's next point runs: fixed, or sized after ``spent`` seconds of windows."""

    cfg: AutoSearch
    point_duration_s: float
    sizing: Sizing | None
    spent: float
    kind: str
    cv: float | None

    def step(self, rate: float, phase: str, why: str, confirm: bool = False) -> Step:
        """``confirm``: a bisection point, which (unsized) may stretch to confirm a clean pass."""
        arrival = _open(rate, kind=self.kind, cv=self.cv)
        r = float(arrival.rate or rate)
        if self.sizing is not None:
            s = self.sizing.sized(r, self.spent, count_cv(self.kind, self.cv))
            return Step(arrival, phase, why, s.duration_s, s.needed_s, s.capped)
        duration = self.point_duration_s
        if confirm:
            need = samples_to_confirm(self.cfg.target_pct, self.cfg.confidence)
            duration = round(min(max(duration, need / r), self.cfg.max_stretch * duration), 3)
        return Step(arrival, phase, why, duration)


def next_step(
    cfg: AutoSearch,
    history: list[tuple[Step, Observation]],
    *,
    point_duration_s: float,
    has_slo: bool,
    kind: str = "poisson",
    cv: float | None = None,
    sizing: Sizing | None = None,
) -> Step | None:
    """The next load point of the automatic search, or None when it is done.

    Unsized, every point runs ``point_duration_s`` (a bisection point up to ``max_stretch``
    times that, to confirm a pass); with ``sizing`` each runs until it holds its samples, within
    the caps, and the search ends when the sweep's budget of measured time is used up."""
    if sizing is not None and sizing.exhausted(spent_s(history)):
        return None
    t = _Timing(cfg, point_duration_s, sizing, spent_s(history), kind, cv)
    ramp = _ramp(history)
    if (down := step_down(history, cfg)) is not None:
        return t.step(down, "ramp", f"/{cfg.factor:g}: already past saturation at {ramp[0].rate:g} req/s")
    sat = _saturation(history, cfg)
    if sat is None and ramp:
        last = ramp[-1]
        nxt = last.rate * cfg.factor
        more = not last.client_limited and overloaded_suspect(history, cfg) is None
        if more and nxt <= cfg.max_rate * (1 + 1e-9) and len(ramp) < cfg.max_ramp:
            return t.step(nxt, "ramp", f"x{cfg.factor:g}: still keeping up at {last.rate:g} req/s")
    elif not ramp:
        return t.step(cfg.start_rate, "ramp", "light load")
    rates = [o.rate for _, o in history]
    cap = capacity_estimate(history)
    if sat is not None and cap > 0:
        for f in sorted(cfg.spread):
            r = _round_rate(f * cap)
            if r > 0 and not _near(r, rates):
                return t.step(r, "spread", f"{f:.0%} of the capacity found ({cap:.3g} req/s)")
    if has_slo:
        return _bisect_step(cfg, history, t)
    return None


def search_end(cfg: AutoSearch, history: list[tuple[Step, Observation]], sizing: Sizing | None = None) -> str:
    """Why the ramp stopped, in words (for the report when saturation was not reached)."""
    sat = _saturation(history, cfg)
    if sat is not None:
        return f"saturated: {sat[1]}"
    ramp = _ramp(history)
    if not ramp:
        return "no ramp point was measured"
    last = ramp[-1]
    if last.client_limited:
        return (
            f"stopped at {last.rate:g} req/s: the client fell behind its schedule "
            f"(lag p99 {last.lag_p99_ms:.1f} ms); the endpoint was not saturated by then"
        )
    if (looks := overloaded_suspect(history, cfg)) is not None:
        return (
            f"stopped at {last.rate:g} req/s: it looked past saturation ({looks}) but was suspect "
            f"({', '.join(last.validity.withholding.codes)}), so it is not called saturated"
        )
    unjudged = [o for o in ramp if not o.judgeable]
    note = ""
    if unjudged:
        rates = ", ".join(f"{o.rate:g}" for o in unjudged)
        s = "s" if len(unjudged) > 1 else ""
        note = f" ({len(unjudged)} ramp point{s} at {rates} req/s could not be judged: suspect or too few requests)"
    if sizing is not None and sizing.exhausted(spent_s(history)):
        return (
            f"stopped at {last.rate:g} req/s: the sweep's {sizing.max_total_s:g} s of measured time "
            f"(--max-sweep-duration) was used up before saturation{note}"
        )
    if len(ramp) >= cfg.max_ramp:
        return f"stopped after {len(ramp)} ramp points without saturating (raise max_ramp){note}"
    return f"reached --max-rate {cfg.max_rate:g} req/s without saturating the endpoint{note}"


def _bisect_step(cfg: AutoSearch, history: list[tuple[Step, Observation]], t: _Timing) -> Step | None:
    if sum(1 for s, _ in history if s.phase == "bisect") >= cfg.max_bisect:
        return None
    target = cfg.target_pct / 100.0
    pts = sorted((o.rate, o.attainment) for _, o in history if o.attainment is not None and _trusted(o))
    if not pts:
        return None
    misses = [r for r, a in pts if a is not None and a < target]
    if not misses:
        return None  # every point met the SLO: capacity at SLO >= the highest rate sent
    hi = min(misses)
    passes = [r for r, a in pts if a is not None and a >= target and r < hi]
    if passes:
        lo = max(passes)
        if hi / lo <= 1 + cfg.tolerance:
            return None
        rate, why = math.sqrt(lo * hi), f"bisect: met at {lo:g}, missed at {hi:g} req/s"
    else:
        rate, why = hi / cfg.factor, f"every point missed the SLO; stepping below {hi:g} req/s"
        if rate < cfg.start_rate / cfg.factor**2:
            return None
    rate = _round_rate(rate)
    if _near(rate, [r for r, _ in pts], rel=0.01):
        return None
    again = [o for _, o in history if _near(rate, [o.rate], rel=0.01)]  # sent there, but suspect
    if len(again) > 1:
        return None  # one retry of a suspect point; a second suspect one at that rate ends the bisection
    if again:
        why = f"{why} (again: the point at {again[0].rate:g} req/s was suspect: {', '.join(again[0].validity.codes)})"
    return t.step(rate, "bisect", why, confirm=True)
