"""Bake-off: the same traffic against several endpoints, compared with intervals.

``compare_runs`` reads run folders (sweeps or single runs), checks that they
sent the same traffic (``traffic``: by the request fingerprints the runs recorded,
else by workload, seed, API and ignore_eos; and the load points) and says so
first, loudly when they did not, then compares: overlaid Pareto frontiers, capacity
and goodput at the SLO, cost per million output tokens there, peak throughput,
and latency at matched load (points with the same offered rate or concurrency).
A winner is declared only where the intervals separate: the best run's interval
lies entirely on the better side of every other run's; otherwise the verdict is
"no clear winner", however different the point estimates look.

And only between valid data: a verdict that rests on a suspect point (client lag, an
interrupted run, a late simulator, ...) or on runs that sent different traffic names no
winner and says which run is suspect and why (``Verdict.withheld``); ``Comparison.suspects``
lists them, to be shown before any table. ``few_samples`` withholds nothing here: the
intervals already widen with few samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadgen.analysis.metrics import SLO
from loadgen.analysis.pareto import cost_per_million
from loadgen.analysis.point_figures import PointFigures
from loadgen.analysis.points import RunAnalysis, analyze_run
from loadgen.analysis.traffic import TrafficCheck, check_traffic, traffic_mismatches
from loadgen.analysis.validity import Validity
from loadgen.errors import ConfigError

__all__ = ["Side", "Verdict", "Comparison", "compare_runs", "separated_winner"]


@dataclass
class Side:
    name: str
    analysis: RunAnalysis


@dataclass
class Verdict:
    """One compared quantity: each run's value and interval, and the winner if the intervals separate."""

    metric: str
    better: str  # "higher" | "lower"
    values: dict[str, tuple[float, float, float]]  # run -> (estimate, lo, hi)
    winner: str | None
    detail: str
    unit: str = ""
    group: str = "headline"  # "headline" or "matched load"
    withheld: str = ""  # why no winner may be named on these figures (a suspect run or point), else ""
    key: str = ""  # a stable name for the figure ("ttft_p99", "peak_output_tps", ...), for machines
    at: str = ""  # the matched load ("10 req/s"), for a matched-load figure
    # run -> (estimate is a lower bound, interval's low end is one): censored samples make them so
    lower_bounds: dict[str, tuple[bool, bool]] = field(default_factory=dict)


@dataclass
class Comparison:
    sides: list[Side]
    mismatches: list[str]
    verdicts: list[Verdict]
    slo: SLO | None
    target_pct: float
    notes: list[str] = field(default_factory=list)
    suspects: list[str] = field(default_factory=list)  # shown first: interrupted, then suspect runs and points
    traffic: Validity = field(default_factory=Validity)  # traffic_differs when the runs sent different traffic
    same_traffic: TrafficCheck | None = None  # whether they sent identical traffic, and the evidence

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sides]


def separated_winner(values: dict[str, tuple[float, float, float]], better: str) -> tuple[str | None, str]:
    """(winner, why): the best estimate wins only if its interval clears every other interval."""
    ok = {k: v for k, v in values.items() if all(isinstance(x, (int, float)) for x in v) and v[0] == v[0]}
    if len(ok) < 2:
        return None, "fewer than two runs have this figure"
    sign = 1.0 if better == "higher" else -1.0
    best = max(ok, key=lambda k: sign * ok[k][0])
    _, b_lo, b_hi = ok[best]
    for k, (_, lo, hi) in ok.items():
        if k == best:
            continue
        clear = b_lo > hi if better == "higher" else b_hi < lo
        if not clear:
            return None, f"no clear winner: the intervals of {best} and {k} overlap"
    return best, f"{best}: its interval clears every other run's"


# --------------------------------------------------------------------------- what withholds winners


def _suspects(sides: Sequence[Side], traffic: Validity) -> list[str]:
    """What withholds winners, to be shown first: interrupted runs, traffic, suspect runs and points."""
    out = [
        f"INTERRUPTED: {s.name}: {line.removeprefix('INTERRUPTED: ')}"
        for s in sides
        if (line := s.analysis.interruption)
    ]
    if traffic.suspect:
        out.append(f"SUSPECT: {traffic.why()}: no winner is named")
    for s in sides:
        a = s.analysis
        run = a.validity.withholding
        if run.suspect:
            out.append(f"SUSPECT: {s.name} ({', '.join(run.codes)}): {run.why()}")
            continue
        for p in a.points:
            v = p.validity.withholding
            if v.suspect:
                out.append(f"SUSPECT: {_where(s, p)} ({', '.join(v.codes)}): {v.why()}")
    if out:
        out.append("no winner is named on figures from a suspect run or point")
    return out


def _few(sides: Sequence[Side]) -> list[str]:
    """A note per run with points short of samples (judged by the intervals, which widen)."""
    out = []
    for s in sides:
        few = [p.short_label for p in s.analysis.points if "few_samples" in p.validity.codes]
        if few:
            out.append(
                f"{s.name} has few samples at {', '.join(few)} (few_samples): its intervals are wide, "
                "and a winner is named only where they separate"
            )
    return out


# --------------------------------------------------------------------------- the comparison


def _names(run_dirs: Sequence[Path], names: Sequence[str] | None) -> list[str]:
    if names:
        if len(names) != len(run_dirs):
            raise ConfigError(f"--name given {len(names)} times for {len(run_dirs)} runs")
        if len(set(names)) != len(names):
            raise ConfigError("--name values must be distinct")
        return list(names)
    base = [Path(d).resolve().name for d in run_dirs]
    return [n if base.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(base)]


def compare_runs(
    run_dirs: Sequence[Path],
    *,
    names: Sequence[str] | None = None,
    slo: SLO | None = None,
    slo_name: str | None = None,
    target_pct: float | None = None,
) -> Comparison:
    """Analyse every run under one SLO (given, else the first run's) and compare them."""
    if len(run_dirs) < 2:
        raise ConfigError("compare needs at least two run folders")
    labels = _names(run_dirs, names)
    first = analyze_run(Path(run_dirs[0]), slo=slo, slo_name=slo_name, target_pct=target_pct)
    slo = first.slo
    target = first.target_pct
    sides = [Side(labels[0], first)]
    for label, d in zip(labels[1:], run_dirs[1:], strict=True):
        sides.append(Side(label, analyze_run(Path(d), slo=slo, slo_name=first.slo_name, target_pct=target)))
    mismatches = traffic_mismatches(sides)
    notes = []
    own = {s.name: s.analysis.meta.get("sweep", {}).get("slo") for s in sides}
    if len({str(v) for v in own.values()}) > 1:
        notes.append(
            f"the runs recorded different SLOs; all are judged against {slo} ({target:g}%)"
            if slo
            else "the runs recorded different SLOs and none was given: SLO figures are not compared (use --slo)"
        )
    gpus = {s.name: s.analysis.gpus for s in sides}
    if any(g is None for g in gpus.values()) and any(g is not None for g in gpus.values()):
        mismatches.append(
            "only some runs give --gpus: per-GPU figures are not comparable; aggregate figures are compared instead"
        )
    same = check_traffic(sides)
    traffic = same.validity
    verdicts = _headline(sides, slo, target) + _matched(sides)
    for v in verdicts:
        if traffic.suspect:
            v.withheld = traffic.why()
        if v.withheld:
            v.winner, v.detail = None, f"withheld: {v.withheld} (on the intervals alone: {v.detail})"
    suspects = _suspects(sides, traffic)
    return Comparison(sides, mismatches, verdicts, slo, target, notes + _few(sides), suspects, traffic, same)


def _withheld(sides: Sequence[Side], picks: dict[str, PointFigures | None]) -> str:
    """Why no winner may be named on the points a verdict rests on (one per run), '' when all are trusted."""
    out = []
    for s in sides:
        p = picks.get(s.name)
        if p is None:
            continue
        v = s.analysis.point_validity(p).withholding
        if v.suspect:
            where = s.name if s.analysis.validity.withholding.suspect else _where(s, p)
            out.append(f"{where} is suspect ({v.why()})")
    return "; ".join(out)


def _where(s: Side, p: PointFigures) -> str:
    """A run's name, and a sweep's point in it."""
    return f"{s.name} at {p.short_label}" if s.analysis.is_sweep else s.name


def _per_gpu_ok(sides: Sequence[Side]) -> bool:
    return all(s.analysis.gpus is not None for s in sides)


def _headline(sides: Sequence[Side], slo: SLO | None, target: float) -> list[Verdict]:
    out = []
    per_gpu = _per_gpu_ok(sides)
    unit = "output tok/s per GPU" if per_gpu else "output tok/s"

    def tps(p: PointFigures) -> tuple[float, float, float]:
        lo, hi = p.output_tps_ci
        g = (p.gpus or 1.0) if per_gpu else 1.0
        return (p.summary.output_tps / g, lo / g, hi / g)

    peak = {}
    at: dict[str, PointFigures | None] = {}
    for s in sides:
        if s.analysis.points:
            at[s.name] = top = max(s.analysis.points, key=lambda p: _nan_low(p.summary.output_tps))
            est, lo, hi = tps(top)
            # A run that never saturated may go higher: its peak is only a lower bound.
            peak[s.name] = (est, lo, hi if s.analysis.saturation else math.inf)
    v = _verdict("peak throughput", "higher", peak, unit, key="peak_output_tps")
    v.withheld = _withheld(sides, at)
    if any(not s.analysis.saturation for s in sides):
        v.detail += "; runs that did not saturate count as 'could be higher' (upper bound ∞)"
    out.append(v)
    if slo is None:
        return out
    cap = {}
    for s in sides:
        c = s.analysis.capacity
        if c is not None and c.rate is not None:
            cap[s.name] = (c.rate, c.lower, c.upper)
    v = _verdict(f"capacity at SLO ({target:g}% attainment)", "higher", cap, "req/s", key="capacity_at_slo")
    v.detail += " (interval: highest rate confirmed to meet the SLO .. lowest confirmed to miss it)"
    # capacity rests on each run's trusted points only; a run with none has no capacity to compare
    none = [s.name for s in sides if s.analysis.points and not s.analysis.trusted]
    v.withheld = "; ".join(f"{n} has no point that is not suspect" for n in none)
    out.append(v)
    good = {}
    best_at: dict[str, PointFigures | None] = {}
    for s in sides:
        best = max(s.analysis.points, key=lambda p: _nan_low(p.summary.goodput_rps), default=None)
        if best is not None and best.goodput_ci is not None and best.summary.goodput_rps is not None:
            good[s.name] = (best.summary.goodput_rps, *best.goodput_ci)
            best_at[s.name] = best
    v = _verdict("best goodput at SLO", "higher", good, "req/s", key="best_goodput_at_slo")
    v.withheld = _withheld(sides, best_at)
    out.append(v)
    out += _cost_at_capacity(sides, per_gpu)
    return out


def _cost_at_capacity(sides: Sequence[Side], per_gpu: bool) -> list[Verdict]:
    """$/M output tokens at each run's capacity point, with each run's own (first) price and GPUs."""
    cost: dict[str, tuple[float, float, float]] = {}
    for s in sides:
        a = s.analysis
        at = a.point_at(a.capacity.rate) if a.capacity is not None else None
        if at is None or not a.prices:
            continue
        price = next(iter(a.prices.values()))
        g = a.gpus or 1.0
        lo, hi = at.output_tps_ci
        cost[s.name] = (
            cost_per_million(at.summary.output_tps, price, g),
            cost_per_million(hi, price, g),
            cost_per_million(lo, price, g),
        )
    if len(cost) < 2:
        return []
    v = _verdict("$/M output tokens at capacity", "lower", cost, "$", key="cost_at_capacity")
    none = [s.name for s in sides if s.analysis.points and not s.analysis.trusted]
    v.withheld = "; ".join(f"{n} has no point that is not suspect" for n in none)
    return [v]


def _nan_low(v: float | None) -> float:
    return -math.inf if v is None or v != v else v


def _verdict(
    metric: str,
    better: str,
    values: dict[str, tuple[float, float, float]],
    unit: str,
    group: str = "headline",
    withheld: str = "",
    *,
    key: str,
) -> Verdict:
    winner, why = separated_winner(values, better)
    return Verdict(metric, better, values, winner, why, unit, group, withheld, key)


def _matched(sides: Sequence[Side]) -> list[Verdict]:
    """Latency and throughput at each load that every run measured (same rate or concurrency, within 1%)."""
    loads = [p.load for p in sides[0].analysis.points]
    out = []
    for load in sorted(set(loads)):
        per: dict[str, PointFigures] = {}
        for s in sides:
            match = [p for p in s.analysis.points if abs(p.load - load) <= 0.01 * max(load, 1e-9)]
            if match:
                per[s.name] = match[0]
        if len(per) < len(sides):
            continue
        label = next(iter(per.values())).short_label
        withheld = _withheld(sides, dict(per))
        for metric, attr, pct in (("TTFT p99", "ttft", 99), ("TPOT p50", "tpot", 50), ("E2E p99", "e2e", 99)):
            dists = {n: d for n, p in per.items() if (d := getattr(p.summary, attr)).n}
            vals = {n: d.pct(pct) for n, d in dists.items()}
            flags = {n: (d.pct_flags(pct).value, d.pct_flags(pct).lo) for n, d in dists.items()}
            v = _verdict(f"{metric} at {label}", "lower", vals, "ms", "matched load", withheld, key=f"{attr}_p{pct}")
            v.at, v.lower_bounds = label, flags
            out.append(v)
        vals = {n: (p.summary.output_tps, *p.output_tps_ci) for n, p in per.items()}
        v = _verdict(f"output tok/s at {label}", "higher", vals, "tok/s", "matched load", withheld, key="output_tps")
        v.at = label
        out.append(v)
    return out
