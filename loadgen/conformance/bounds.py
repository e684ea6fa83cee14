"""The gate's statistics: a criterion's value with one-sided confidence bounds, and the verdicts on them.

A criterion PASSes only when its one-sided confidence bound lies on the right
side of the limit, FAILs when the opposite bound lies on the wrong side, and is
INCONCLUSIVE otherwise: a short run must never pass a release by luck, and a
long one must not fail it on noise. The bounds, per kind of metric:

- percentiles: distribution-free order statistics (``stats.percentile_ci``). The
  upper bound is under the limit exactly when MLPerf's early-stopping rule is
  met, so an INCONCLUSIVE says how many samples would decide it
  (``stats.binomial_min_samples``). Per-token metrics (ITL, ICL) are clustered
  by request, so their ranks are taken as if there were one sample per request.
  Censored samples (a request that never got its first token, or never finished,
  counts as at least its elapsed time): the lower bound is taken with them at
  their censored values, the upper bound over the exact samples at the same rank,
  as if every censored sample were infinitely late (unbounded when too few exact
  ones remain). So a percentile that reaches censored samples (``lower_bound``)
  PASSes only if it would even with every censored request never answering, FAILs
  when its lower bound is over the limit, and is INCONCLUSIVE otherwise.
- means: Student's t.
- proportions (success rate, SLO attainment): exact Clopper-Pearson.
- rates (throughput, goodput): batch means over equal slices of the window.

Against a baseline, a regression beyond the tolerance must be shown with
confidence too: the current run's optimistic bound must be worse than the
baseline's pessimistic bound times the tolerance (each bound at half the error
rate, so a false alarm is at most 1 - confidence). Noise cannot trip it.

Pure functions of samples; the samples come from ``samples`` (``Point``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from loadgen.analysis.attainment import attainment_interval
from loadgen.analysis.distributions import norm_ppf, t_ppf
from loadgen.analysis.stats import binomial_min_samples, describe, mean_ci, percentile_ci
from loadgen.analysis.window import Window

if TYPE_CHECKING:
    from loadgen.conformance.samples import Point
    from loadgen.conformance.slo import Criterion

__all__ = [
    "Measurement",
    "measure",
    "percentile",
    "mean_bounds",
    "proportion",
    "batch_rate",
    "verdict",
    "compare",
    "fmt_num",
    "fmt_pct",
]

_INF = math.inf
_NAN = math.nan
_MAX_BATCHES = 20


@dataclass(frozen=True)
class Measurement:
    """A statistic with one-sided confidence bounds (``lo``, ``hi``), in the metric's unit.

    ``over``: samples on the wrong side of the bound (percentiles, proportions; a
    censored sample that may be on it counts);
    ``needed``: the sample count at which, with no further such samples, it would
    PASS; ``n_eff``: the sample count the interval was computed as if from.
    ``lower_bound``: the value is only a lower bound (censored samples rank at or
    below it: shown ``>= value``); ``censored``: how many of the ``n`` samples are.
    """

    value: float
    lo: float
    hi: float
    n: int
    method: str
    confidence: float
    over: int | None = None
    needed: int | None = None
    n_eff: int | None = None
    lower_bound: bool = False
    censored: int = 0


def measure(criterion: Criterion, point: Point, confidence: float) -> Measurement:
    """The criterion's statistic at ``point`` with one-sided ``confidence`` bounds."""
    info = criterion.info
    if info.kind == "proportion":
        k, n = point.proportion(criterion.metric)
        return proportion(k, n, confidence, criterion.bound / 100.0, criterion.op)
    if info.kind == "rate":
        times, weights = point.events(criterion.metric)
        return batch_rate(times, weights, point.window, confidence, _batch_s(point))
    x = np.sort(point.samples(criterion.metric))
    cens = point.censored(criterion.metric)
    n_eff = point.clusters(criterion.metric) if info.clustered else None
    if criterion.statistic == "mean":
        return mean_bounds(x, confidence, criterion.bound, n_eff, cens)
    q = criterion.percentile
    assert q is not None
    return percentile(x, q, confidence, criterion.bound, criterion.op, n_eff, cens)


def percentile(
    x: np.ndarray,
    p: float,
    confidence: float,
    bound: float,
    op: str,
    n_eff: int | None = None,
    censored: np.ndarray | None = None,
) -> Measurement:
    """Percentile ``p`` of sorted ``x`` with one-sided bounds from order statistics.

    A two-sided interval at 2c - 1 has one-sided bounds at c. ``n_eff`` (per-token
    metrics) takes the ranks as for ``n_eff`` independent samples and maps them
    onto the ``x.size`` observed ones (Kish's design effect: tokens of one request
    share its fate, so they are worth about one sample). ``censored``: samples
    known only to be at least their value (``describe``'s rule, see the module's
    docstring); with them ``over`` counts those already past the bound and
    ``needed`` counts every other one as a possible miss too.
    """
    if censored is not None and censored.size:
        return _censored_percentile(x, censored, p, confidence, bound, op)
    n = x.size
    over = int((x > bound).sum()) if op == "<=" else int((x < bound).sum())
    if n == 0:
        return Measurement(_NAN, _NAN, _NAN, 0, "order statistics", confidence, over)
    if n_eff is None or n_eff >= n:
        est, lo, hi = percentile_ci(x, p, 2 * confidence - 1)
        q = p / 100.0 if op == "<=" else 1 - p / 100.0
        needed = binomial_min_samples(q, over, confidence)
        return Measurement(est, lo, hi, n, "order statistics", confidence, over, needed)
    m = max(n_eff, 1)
    est = percentile_ci(x, p, 0.5)[0]
    _, lo_m, hi_m = percentile_ci(np.arange(1, m + 1, dtype=np.float64), p, 2 * confidence - 1)
    lo = x[max(math.ceil(lo_m / m * n) - 1, 0)] if math.isfinite(lo_m) else -_INF
    hi = x[min(math.ceil(hi_m / m * n) - 1, n - 1)] if math.isfinite(hi_m) else _INF
    return Measurement(
        est, float(lo), float(hi), n, f"order statistics, clustered by {m} requests", confidence, over, n_eff=m
    )


def _censored_percentile(
    x: np.ndarray, c: np.ndarray, p: float, confidence: float, bound: float, op: str
) -> Measurement:
    d = describe(x, 2 * confidence - 1, (p,), censored=c)
    est, lo, hi = d.pct(p)
    # ``over`` counts every sample that may be on the wrong side: a censored one is only known to be
    # at least its value, so for "<=" one under the bound may still be over it, for ">=" one under it
    if op == "<=":
        over = d.n - int((x <= bound).sum())
    else:
        over = int((x < bound).sum()) + int((c < bound).sum())
    q = p / 100.0 if op == "<=" else 1 - p / 100.0
    needed = binomial_min_samples(q, over, confidence)
    method = f"order statistics, {d.censored} censored (upper bound as if never answered)"
    return Measurement(est, lo, hi, d.n, method, confidence, over, needed, None, d.lower_bound(p), d.censored)


def mean_bounds(
    x: np.ndarray, confidence: float, bound: float, n_eff: int | None = None, censored: np.ndarray | None = None
) -> Measurement:
    """Mean with one-sided Student-t bounds; ``needed`` from the observed spread.

    With ``n_eff`` (per-token metrics) the standard error is that of ``n_eff``
    samples, not ``x.size``: the same design effect as for percentiles. With
    ``censored`` samples the mean is a lower bound (taken with them at their
    censored values) and its upper bound is unbounded.
    """
    if censored is not None and censored.size:
        y = np.concatenate([x, censored])
        m, lo, _ = mean_ci(y, 2 * confidence - 1)
        method = f"Student t, {censored.size} censored (a lower bound)"
        return Measurement(m, lo, _INF, int(y.size), method, confidence, lower_bound=True, censored=int(censored.size))
    n = int(x.size)
    m, lo, hi = mean_ci(x, 2 * confidence - 1)
    if n_eff is not None and n_eff < n:
        if n_eff < 2:
            return Measurement(m, -_INF, _INF, n, "Student t, clustered", confidence, n_eff=n_eff)
        s = float(np.std(x, ddof=1))
        half = float(t_ppf(confidence, n_eff - 1)) * s / math.sqrt(n_eff)
        return Measurement(
            m, m - half, m + half, n, f"Student t, clustered by {n_eff} requests", confidence, n_eff=n_eff
        )
    needed = None
    if n >= 2 and math.isfinite(m) and m != bound:
        s = float(np.std(x, ddof=1))
        needed = max(math.ceil((float(norm_ppf(confidence)) * s / abs(bound - m)) ** 2), 2)
    return Measurement(m, lo, hi, n, "Student t", confidence, needed=needed)


def proportion(k: int, n: int, confidence: float, share: float, op: str) -> Measurement:
    """k of n in %, with exact one-sided Clopper-Pearson bounds (``attainment_interval``'s).

    For ">= share" its lower bound clears ``share`` exactly when MLPerf's binomial
    rule does, so ``needed`` comes from ``binomial_min_samples`` too.
    """
    if n == 0:
        return Measurement(_NAN, _NAN, _NAN, 0, "Clopper-Pearson", confidence)
    lo, hi = attainment_interval(k, n, confidence)
    misses = n - k if op == ">=" else k
    needed = None
    if op == ">=" and 0 < share < 1:
        needed = binomial_min_samples(share, misses, confidence)
    elif op == "<=" and 0 < share < 1:
        needed = binomial_min_samples(1 - share, misses, confidence)
    return Measurement(100.0 * k / n, 100.0 * lo, 100.0 * hi, n, "Clopper-Pearson", confidence, misses, needed)


def _batch_s(point: Point) -> float:
    """Batch length for rates: long against a request's life, so batches are nearly independent."""
    e2e = point.samples("e2e")
    return max(1.0, 2.0 * float(np.median(e2e)) / 1e3) if e2e.size else 1.0


def batch_rate(
    times: np.ndarray, weights: np.ndarray, window: Window, confidence: float, batch_s: float = 1.0
) -> Measurement:
    """Events per second in the window, bounded by batch means (t over equal slices)."""
    length = window.length_s
    if length <= 0:
        return Measurement(_NAN, _NAN, _NAN, 0, "batch means", confidence)
    inside = window.contains(times)
    value = float(weights[inside].sum()) / length
    k = min(_MAX_BATCHES, int(length // batch_s))
    if k < 2:
        return Measurement(value, -_INF, _INF, 1, "batch means (window too short for 2 batches)", confidence)
    sums, _ = np.histogram(times[inside], bins=k, range=(window.start_ns, window.end_ns), weights=weights[inside])
    _, lo, hi = mean_ci(sums / (length / k), 2 * confidence - 1)
    return Measurement(value, lo, hi, k, f"batch means over {k} slices", confidence)


def verdict(m: Measurement, op: str, bound: float) -> str:
    """PASS when the pessimistic bound is inside the limit, FAIL when the optimistic one is outside.

    On censored samples the pessimistic bound takes each of them as never answered (unbounded
    when they reach the rank), so a lower-bound percentile is FAIL or INCONCLUSIVE unless even that passes.
    """
    if m.n == 0 or math.isnan(m.value):
        return "inconclusive"
    if op == "<=":
        return "pass" if m.hi <= bound else "fail" if m.lo > bound else "inconclusive"
    return "pass" if m.lo >= bound else "fail" if m.hi < bound else "inconclusive"


def compare(cur: Measurement, base: Measurement, op: str, tolerance: float) -> tuple[str, str]:
    """Regression test of ``cur`` against ``base`` (bounds at the comparison confidence).

    "fail" when even the current run's optimistic bound is worse than the
    baseline's pessimistic bound by more than ``tolerance``; "inconclusive" when a
    needed bound does not exist (too few samples); else "pass".
    """
    if cur.n == 0 or base.n == 0 or math.isnan(cur.value) or math.isnan(base.value):
        return "inconclusive", "no samples in one of the runs"
    if op == "<=":
        limit = base.hi * (1 + tolerance) if base.hi >= 0 else base.hi * (1 - tolerance)
        if not (math.isfinite(limit) and math.isfinite(cur.lo)):
            return "inconclusive", "too few samples to bound the change"
        if cur.lo > limit:
            return "fail", (
                f"regressed: lower bound {fmt_num(cur.lo)} > baseline upper bound {fmt_num(base.hi)} "
                f"{_tol(tolerance, '+')}"
            )
        return "pass", f"no regression beyond {fmt_pct(tolerance)} shown"
    limit = base.lo * (1 - tolerance) if base.lo >= 0 else base.lo * (1 + tolerance)
    if not (math.isfinite(limit) and math.isfinite(cur.hi)):
        return "inconclusive", "too few samples to bound the change"
    if cur.hi < limit:
        return "fail", (
            f"regressed: upper bound {fmt_num(cur.hi)} < baseline lower bound {fmt_num(base.lo)} {_tol(tolerance, '-')}"
        )
    return "pass", f"no regression beyond {fmt_pct(tolerance)} shown"


def _tol(t: float, sign: str) -> str:
    return f"{sign} {fmt_pct(t)}"


def fmt_pct(t: float) -> str:
    """A tolerance as a percentage: 0.05 -> "5%"."""
    return f"{100 * t:g}%"


def fmt_num(v: float) -> str:
    """A measured value or bound for a message: "-" for NaN, ∞ for an open bound, else 3-4 digits."""
    if v != v:
        return "-"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    a = abs(v)
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"
