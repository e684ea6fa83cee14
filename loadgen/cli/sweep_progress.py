"""Where a sweep stands: the point running (i of n, its step) and an estimate of the time left.

A listed sweep knows its points: what is left is the planned sending time of the
points to come (warm-up and window each), plus, as a bound, every drain. An
automatic search does not know how many points it will send, so its estimate is
"about": the points it may still send (``points_after``, from the steps so far:
the rest of the ramp until saturation, the spread, the bisection) at the mean
time the points so far took. The step of the point running is the search's own
pure function of the history (``step_now``), so the view needs nothing from the
sweep but the points it reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.analysis.saturation import Observation, first_saturated
from loadgen.sweep.plan import SweepPlan
from loadgen.sweep.search import Step

__all__ = ["step_now", "points_after", "SweepEta", "sweep_eta", "step_label"]


def step_now(plan: SweepPlan, history: Sequence[tuple[Step, Observation]]) -> Step | None:
    """The step the sweep sends after ``history``: as ``sweep.run`` picks it (``SweepPlan.next_step``)."""
    return plan.next_step(list(history))


def points_after(plan: SweepPlan, history: Sequence[tuple[Step, Observation]], current: Step) -> int:
    """At most how many points come after ``current`` (listed: exactly how many)."""
    if plan.mode != "auto":
        return max(len(plan.arrivals) - len(history) - 1, 0)
    a = plan.auto
    phases = [s.phase for s, _ in history] + [current.phase]
    ramp = [o for s, o in history if s.phase == "ramp"]
    saturated = first_saturated(ramp, a.keep_up, a.min_gain) is not None
    ramp_left = a.max_ramp_points - phases.count("ramp") if current.phase == "ramp" and not saturated else 0
    spread_left = len(a.spread) - phases.count("spread")
    bisect_left = a.max_bisect - phases.count("bisect") if plan.has_slo else 0
    return max(ramp_left, 0) + max(spread_left, 0) + max(bisect_left, 0)


@dataclass(frozen=True)
class SweepEta:
    """Time left in the whole sweep: ``left_s`` (``about`` for a search), at most ``bound_s``
    (every drain used up; None for a search), over ``more`` points after the one running."""

    left_s: float
    bound_s: float | None
    more: int
    about: bool


def sweep_eta(
    plan: SweepPlan,
    history: Sequence[tuple[Step, Observation]],
    current: Step,
    point_left_s: float,
    drain_left_s: float,
    point_walls_s: Sequence[float],
) -> SweepEta:
    """The sweep's time left while ``current`` runs with ``point_left_s`` of sending (and at most
    ``drain_left_s`` of drain) left; ``point_walls_s``: how long each point so far took, drain
    and summary included (a search's estimate is their mean)."""
    more = points_after(plan, history, current)
    if plan.mode != "auto":
        rest = plan.fixed_steps(list(history))[len(history) + 1 :]
        send = sum(plan.warmup_s + s.duration_s for s in rest)
        left = point_left_s + send
        return SweepEta(left, left + drain_left_s + len(rest) * plan.drain_s, more, about=False)
    per = sum(point_walls_s) / len(point_walls_s) if point_walls_s else plan.warmup_s + plan.point_duration_s
    return SweepEta(point_left_s + more * per, None, more, about=True)


def step_label(step: Step, unit: str = "req/s") -> str:
    """ "8 req/s" or "16 users", and why the search chose it: "8 req/s (ramp: x2: ...)"; in the
    load's ``unit`` (``sessions/s`` for sessions of several turns, whose rate is of sessions)."""
    a = step.arrival
    load = f"{a.rate:g} {unit}" if a.rate is not None else f"{a.concurrency} users"
    why = step.why.replace(" req/s", f" {unit}")
    return load if step.phase == "list" else f"{load} ({step.phase}: {why})"
