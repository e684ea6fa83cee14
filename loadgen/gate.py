"""``loadgen gate``: judge a run folder against an SLO profile, and against a baseline run.

A criterion PASSes only when its one-sided confidence bound lies on the right
side of the limit, FAILs when the opposite bound lies on the wrong side, and is
INCONCLUSIVE otherwise: a short run must never pass a release by luck, and a
long one must not fail it on noise. The bounds, per kind of metric:

- percentiles: distribution-free order statistics (``stats.percentile_ci``). The
  upper bound is under the limit exactly when MLPerf's early-stopping rule is
  met, so an INCONCLUSIVE says how many samples would decide it
  (``stats.binomial_min_samples``). Per-token metrics (ITL, ICL) are clustered
  by request, so their ranks are taken as if there were one sample per request.
- means: Student's t.
- proportions (success rate, SLO attainment): exact Clopper-Pearson.
- rates (throughput, goodput): batch means over equal slices of the window.

Against a baseline, a regression beyond the tolerance must be shown with
confidence too: the current run's optimistic bound must be worse than the
baseline's pessimistic bound times the tolerance (each bound at half the error
rate, so a false alarm is at most 1 - confidence). Noise cannot trip it.

Everything here is a pure function of the records; only ``gate_run`` reads files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import stats as _sps

from .ci_outputs import Case, Outcome, overall_status
from .columns import Cols, itl_icl, ms  # the samples come from the same code as summarize()'s
from .errors import ConfigError
from .metrics import (
    SLO,
    MetricsError,
    Summary,
    Window,
    choose_window,
    summarize,
    validity_warnings,
)
from .records import read_records
from .runner import read_run_meta
from .slo import Criterion, Profile
from .stats import binomial_min_samples, mean_ci, percentile_ci

__all__ = [
    "EXIT_PASS",
    "EXIT_FAIL",
    "EXIT_USAGE",
    "EXIT_INCONCLUSIVE",
    "Measurement",
    "Point",
    "load_points",
    "measure",
    "verdict",
    "compare",
    "gate_run",
    "exit_code",
    "parse_tolerance",
    "add_gate_options",
    "gate_after_run",
]

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3
_INF = math.inf
_NAN = math.nan
_MAX_BATCHES = 20


@dataclass(frozen=True)
class Measurement:
    """A statistic with one-sided confidence bounds (``lo``, ``hi``), in the metric's unit.

    ``over``: samples on the wrong side of the bound (percentiles, proportions);
    ``needed``: the sample count at which, with no further such samples, it would
    PASS; ``n_eff``: the sample count the interval was computed as if from.
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


# --------------------------------------------------------------------------- load points


@dataclass
class Point:
    """One load point of a run folder: its records, window and what was offered."""

    index: int
    label: str
    rate: float | None
    concurrency: int | None
    table: pa.Table
    window: Window
    slo: SLO | None = None
    lag_limit_ms: float = 10.0
    warning: str | None = None  # the configured window could not be used
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- samples, each by the definitions of metrics.summarize ------------------------
    def _base(self) -> dict[str, Any]:
        if "base" not in self._cache:
            c = Cols.of(self.table)
            w = self.window
            inwin = w.contains(c.t_sched)
            (sent, has_sent), (first, has_first), (last, has_last), (done, has_done) = (
                c.t[k] for k in ("t_sent", "t_first", "t_last", "t_done"))
            nan = np.full(c.n, np.nan)
            ttft, tpot, e2e = nan.copy(), nan.copy(), nan.copy()
            a = c.ok & has_first & (c.out >= 1)
            ttft[a] = ms(first[a], c.t_sched[a])
            a = c.ok & has_first & has_last & (c.out >= 2)
            tpot[a] = ms(last[a], first[a]) / (c.out[a] - 1)
            a = c.ok & has_done
            e2e[a] = ms(done[a], c.t_sched[a])
            self._cache["base"] = dict(c=c, inwin=inwin, sent=sent, has_sent=has_sent, first=first,
                                       has_first=has_first, done=done, has_done=has_done, ttft=ttft, tpot=tpot,
                                       e2e=e2e)
        return self._cache["base"]

    def samples(self, metric: str) -> np.ndarray:
        """The per-request (per-token, per-session) samples of a "dist" metric, in its unit."""
        key = f"s:{metric}"
        if key not in self._cache:
            self._cache[key] = self._samples(metric)
        return self._cache[key]

    def _samples(self, metric: str) -> np.ndarray:
        b = self._base()
        c, inwin = b["c"], b["inwin"]
        if metric in ("ttft", "tpot", "e2e"):
            x = b[metric][inwin]
            return x[~np.isnan(x)]
        if metric == "ttft_sent":
            m = inwin & ~np.isnan(b["ttft"]) & b["has_sent"]
            return ms(b["first"][m], b["sent"][m])
        if metric == "per_user_tps":
            x = b["tpot"][inwin]
            x = x[~np.isnan(x)]
            return 1000.0 / x[x > 0]
        if metric == "schedule_lag":
            m = inwin & b["has_sent"]
            return ms(b["sent"][m], c.t_sched[m])
        if metric in ("itl", "icl"):
            itl, icl = itl_icl(c, inwin & c.ok)
            return itl if metric == "itl" else icl
        if metric == "session_duration":
            return self._sessions()
        raise ValueError(f"{metric} has no per-sample values")

    def _sessions(self) -> np.ndarray:
        """Seconds from a session's first intended send to its last turn's end, for
        sessions whose first turn is in the window and whose every turn succeeded."""
        b = self._base()
        c = b["c"]
        if c.n == 0:
            return np.empty(0)
        sess = np.asarray(pc.fill_null(self.table.column("session"), -1).to_numpy(), dtype=np.int64)
        u, inv = np.unique(sess, return_inverse=True)
        start = np.full(u.size, np.iinfo(np.int64).max)
        np.minimum.at(start, inv, c.t_sched)
        end = np.zeros(u.size, dtype=np.int64)
        np.maximum.at(end, inv, np.where(b["has_done"], b["done"], 0))
        bad = np.zeros(u.size, dtype=bool)
        np.logical_or.at(bad, inv, ~(c.ok & b["has_done"]))
        keep = ~bad & self.window.contains(start)
        return (end[keep] - start[keep]).astype(np.float64) / 1e9

    def clusters(self, metric: str) -> int:
        """Requests that contributed per-token samples (the effective sample size)."""
        b = self._base()
        c = b["c"]
        return int((b["inwin"] & c.ok & (c.c_len >= 2)).sum())

    def proportion(self, metric: str) -> tuple[int, int]:
        """(requests that count as a success, requests in the window)."""
        b = self._base()
        c, inwin = b["c"], b["inwin"]
        good = c.ok
        if metric == "attainment":
            good = good & self._met()
        return int((good & inwin).sum()), int(inwin.sum())

    def _met(self) -> np.ndarray:
        b = self._base()
        if self.slo is None:
            raise ConfigError("this criterion needs the profile's `slo:` bounds")
        return b["c"].ok & self.slo.met(b["ttft"], b["tpot"], b["e2e"])

    def events(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(time ns, weight) of what a rate counts: output tokens, completions, good completions."""
        b = self._base()
        c = b["c"]
        if metric == "output_tps":
            return c.c_ns, c.c_tok.astype(np.float64)
        good = c.ok & b["has_done"]
        if metric == "goodput":
            good = good & self._met()
        return b["done"][good], np.ones(int(good.sum()))

    def summary(self) -> Summary:
        if "summary" not in self._cache:
            self._cache["summary"] = summarize(self.table, self.window, self.slo)
        return self._cache["summary"]


def _point_entries(meta: dict[str, Any]) -> list[dict[str, Any]]:
    pts = meta.get("points")
    if isinstance(pts, list) and pts:
        return [p if isinstance(p, dict) else {} for p in pts]
    settings = meta.get("settings") or {}
    return [{"index": settings.get("point", 0), "settings": settings, "single": True}]


def load_points(run_dir: Path, slo: SLO | None = None) -> tuple[dict[str, Any], list[Point]]:
    """The run's metadata and its load points (one for a run, several for a sweep).

    A sweep's ``run.json`` lists ``points``; each may give its settings (arrival,
    warm-up, cool-down) under ``settings`` or flat, and its index as ``index`` or
    ``point`` (else its position). Records are split by their ``point`` column.
    """
    meta = read_run_meta(run_dir)
    try:
        table = read_records(run_dir)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    entries = _point_entries(meta)
    multi = len(entries) > 1
    points = []
    for i, entry in enumerate(entries):
        settings = entry.get("settings") if isinstance(entry.get("settings"), dict) else entry
        index = int(entry.get("index", entry.get("point", settings.get("point", i))))
        arrival = settings.get("arrival") or {}
        closed = arrival.get("kind") == "closed"
        rate = entry.get("rate", None if closed else arrival.get("rate"))
        conc = entry.get("concurrency", arrival.get("concurrency"))
        part = table.filter(pc.equal(table.column("point"), index)) if multi else table
        warning = None
        try:
            window = choose_window(part, warmup_s=float(settings.get("warmup_s") or 0.0),
                                   cooldown_s=float(settings.get("cooldown_s") or 0.0))
        except MetricsError as e:  # as the reports do: the whole span, said out loud
            window, warning = choose_window(part), f"{e}; judged the whole point, warm-up included"
        label = ""
        if multi:
            label = f"rate {rate:g}" if rate is not None else f"concurrency {conc}" if conc else f"point {index}"
        points.append(Point(index, label, None if rate is None else float(rate),
                            None if conc is None else int(conc), part, window, slo,
                            float(settings.get("lag_limit_ms") or 10.0), warning))
    return meta, points


def select(points: list[Point], criterion: Criterion, run_dir: Path) -> list[Point]:
    """The points a criterion applies to: the one its ``at`` names, else every point."""
    at = criterion.at
    if at is None:
        return points
    for p in points:
        if at.point is not None and p.index == at.point:
            return [p]
        if at.rate is not None and p.rate is not None and math.isclose(p.rate, at.rate, rel_tol=1e-3):
            return [p]
        if at.concurrency is not None and p.concurrency == at.concurrency:
            return [p]
    have = ", ".join(p.label or _offered(p) for p in points)
    raise ConfigError(f"criterion {criterion.name!r} is for {at}, but {run_dir} has no such load point ({have})")


def _offered(p: Point) -> str:
    if p.rate is not None:
        return f"rate {p.rate:g}"
    if p.concurrency is not None:
        return f"concurrency {p.concurrency}"
    return f"point {p.index}"


# --------------------------------------------------------------------------- statistics


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
    n_eff = point.clusters(criterion.metric) if info.clustered else None
    if criterion.statistic == "mean":
        return mean_bounds(x, confidence, criterion.bound, n_eff)
    q = criterion.percentile
    assert q is not None
    return percentile(x, q, confidence, criterion.bound, criterion.op, n_eff)


def percentile(x: np.ndarray, p: float, confidence: float, bound: float, op: str,
               n_eff: int | None = None) -> Measurement:
    """Percentile ``p`` of sorted ``x`` with one-sided bounds from order statistics.

    A two-sided interval at 2c - 1 has one-sided bounds at c. ``n_eff`` (per-token
    metrics) takes the ranks as for ``n_eff`` independent samples and maps them
    onto the ``x.size`` observed ones (Kish's design effect: tokens of one request
    share its fate, so they are worth about one sample).
    """
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
    return Measurement(est, float(lo), float(hi), n, f"order statistics, clustered by {m} requests", confidence,
                       over, n_eff=m)


def mean_bounds(x: np.ndarray, confidence: float, bound: float, n_eff: int | None = None) -> Measurement:
    """Mean with one-sided Student-t bounds; ``needed`` from the observed spread.

    With ``n_eff`` (per-token metrics) the standard error is that of ``n_eff``
    samples, not ``x.size``: the same design effect as for percentiles.
    """
    n = int(x.size)
    m, lo, hi = mean_ci(x, 2 * confidence - 1)
    if n_eff is not None and n_eff < n:
        if n_eff < 2:
            return Measurement(m, -_INF, _INF, n, "Student t, clustered", confidence, n_eff=n_eff)
        s = float(np.std(x, ddof=1))
        half = float(_sps.t.ppf(confidence, n_eff - 1)) * s / math.sqrt(n_eff)
        return Measurement(m, m - half, m + half, n, f"Student t, clustered by {n_eff} requests", confidence,
                           n_eff=n_eff)
    needed = None
    if n >= 2 and math.isfinite(m) and m != bound:
        s = float(np.std(x, ddof=1))
        needed = max(math.ceil((float(_sps.norm.ppf(confidence)) * s / abs(bound - m)) ** 2), 2)
    return Measurement(m, lo, hi, n, "Student t", confidence, needed=needed)


def proportion(k: int, n: int, confidence: float, share: float, op: str) -> Measurement:
    """k of n in %, with exact one-sided Clopper-Pearson bounds.

    For ">= share" its lower bound clears ``share`` exactly when MLPerf's binomial
    rule does, so ``needed`` comes from ``binomial_min_samples`` too.
    """
    if n == 0:
        return Measurement(_NAN, _NAN, _NAN, 0, "Clopper-Pearson", confidence)
    alpha = 1 - confidence
    lo = 0.0 if k == 0 else float(_sps.beta.ppf(alpha, k, n - k + 1))
    hi = 1.0 if k == n else float(_sps.beta.ppf(confidence, k + 1, n - k))
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


def batch_rate(times: np.ndarray, weights: np.ndarray, window: Window, confidence: float,
               batch_s: float = 1.0) -> Measurement:
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
    """PASS when the pessimistic bound is inside the limit, FAIL when the optimistic one is outside."""
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
            return "fail", (f"regressed: lower bound {_num(cur.lo)} > baseline upper bound {_num(base.hi)} "
                            f"{_tol(tolerance, '+')}")
        return "pass", f"no regression beyond {_pct(tolerance)} shown"
    limit = base.lo * (1 - tolerance) if base.lo >= 0 else base.lo * (1 + tolerance)
    if not (math.isfinite(limit) and math.isfinite(cur.hi)):
        return "inconclusive", "too few samples to bound the change"
    if cur.hi < limit:
        return "fail", (f"regressed: upper bound {_num(cur.hi)} < baseline lower bound {_num(base.lo)} "
                        f"{_tol(tolerance, '-')}")
    return "pass", f"no regression beyond {_pct(tolerance)} shown"


def _tol(t: float, sign: str) -> str:
    return f"{sign} {_pct(t)}"


def _pct(t: float) -> str:
    return f"{100 * t:g}%"


def exit_code(status: str, inconclusive: str | None = None) -> int:
    """0 pass, 1 fail, 3 inconclusive (or as ``inconclusive`` = "pass" / "fail" maps it)."""
    if status == "fail":
        return EXIT_FAIL
    if status == "inconclusive":
        return {"pass": EXIT_PASS, "fail": EXIT_FAIL}.get(inconclusive or "", EXIT_INCONCLUSIVE)
    return EXIT_PASS


def parse_tolerance(text: str) -> float:
    """``"5%"`` or ``"5"`` -> 0.05 (always percent)."""
    s = str(text).strip().removesuffix("%").strip()
    try:
        v = float(s) / 100.0
    except ValueError:
        raise ConfigError(f"--tolerance {text!r}: give a percentage like 5%") from None
    if not (math.isfinite(v) and 0 <= v < 10):
        raise ConfigError(f"--tolerance {text!r}: must be between 0% and 1000%")
    return v


# --------------------------------------------------------------------------- the gate


def _num(v: float) -> str:
    if v != v:
        return "-"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    a = abs(v)
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def _bounds(m: Measurement) -> str:
    return f"[{_num(m.lo)}, {_num(m.hi)}]"


def _reason(status: str, m: Measurement, c: Criterion) -> str:
    conf, limit = f"{m.confidence:.0%}", f"{c.bound:g} {c.unit}"
    if m.n == 0 or math.isnan(m.value):
        return "no samples in the window (no successful requests?)"
    if status == "pass":
        return f"{conf} bound {_num(m.hi if c.op == '<=' else m.lo)} {c.op} {limit}"
    if status == "fail":
        return f"{conf} bound {_num(m.lo if c.op == '<=' else m.hi)} {'>' if c.op == '<=' else '<'} {limit}"
    out = f"{conf} bounds {_bounds(m)} straddle {limit}"
    if m.needed is not None and m.over is not None and m.needed > m.n:
        if c.info.kind == "proportion":
            bad = "none failing" if m.over == 0 else f"at most {m.over} failing"
            return out + f"; needs >= {m.needed} requests with {bad}, has {m.n}"
        side = "over" if c.op == "<=" else "under"
        bad = f"none {side} it" if m.over == 0 else f"at most {m.over} {side} it"
        return out + f"; needs >= {m.needed} samples with {bad}, has {m.n}"
    if m.needed is not None and m.needed > m.n:
        return out + f"; about {m.needed} samples at this spread would decide it, has {m.n}"
    if m.n_eff is not None:
        return out + f" (per-token samples counted as {m.n_eff} requests)"
    return out


def _case(c: Criterion, p: Point, suite: str, status: str, m: Measurement, message: str, limit: str,
          extra: dict[str, Any] | None = None) -> Case:
    name = c.name + (f" @ {p.label}" if p.label else "")
    n = str(m.n) if m.n_eff is None else f"{m.n} ({m.n_eff} req)"
    if m.method.startswith("batch means"):
        n = f"{m.n} slices"
    data = {"metric": c.metric, "statistic": c.statistic, "op": c.op, "bound": c.bound, "unit": c.unit,
            "point": p.index, "value": _j(m.value), "lo": _j(m.lo), "hi": _j(m.hi), "n": m.n, "n_eff": m.n_eff,
            "confidence": m.confidence, "method": m.method, "over": m.over, "needed": m.needed, **(extra or {})}
    return Case(name=name + (" vs baseline" if suite == "baseline" else ""), status=status, message=message,
                suite=suite, data=data,
                cells=(("measured", f"{_num(m.value)} {c.unit}"), ("bounds", _bounds(m)), ("limit", limit),
                       ("n", n)))


def _j(v: float) -> float | str | None:
    if v != v:
        return None
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def _too_short(profile: Profile, p: Point) -> str | None:
    s = p.summary()
    if s.requests < profile.min_samples:
        return f"{s.requests} requests in the window < min_samples {profile.min_samples}"
    if s.window_s < profile.min_duration_s:
        return f"{s.window_s:.1f} s window < min_duration_s {profile.min_duration_s:g} s"
    return None


def judge(profile: Profile, points: list[Point], run_dir: Path) -> list[tuple[Criterion, Point, str, Measurement, str]]:
    """(criterion, point, status, measurement, reason) for every criterion and point it applies to."""
    out = []
    for c in profile.criteria:
        for p in select(points, c, run_dir):
            m = measure(c, p, profile.confidence)
            status = verdict(m, c.op, c.bound)
            reason = _reason(status, m, c)
            short = _too_short(profile, p) if status == "pass" else None
            if short:
                status, reason = "inconclusive", f"would pass ({reason}), but {short}"
            out.append((c, p, status, m, reason))
    return out


def gate_run(
    run_dir: Path,
    profile: Profile,
    *,
    baseline: Path | None = None,
    tolerance: float = 0.05,
    inconclusive: str | None = None,
) -> Outcome:
    """Judge ``run_dir`` (and, with ``baseline``, its change from that run) against ``profile``."""
    run_dir, notes = Path(run_dir), []
    meta, points = load_points(run_dir, profile.slo)
    results = judge(profile, points, run_dir)
    cases = [_case(c, p, "slo", status, m, reason, c.limit) for c, p, status, m, reason in results]
    for p in points:
        prefix = f"{p.label}: " if p.label else ""
        notes += [prefix + w for w in ([p.warning] if p.warning else [])]
        notes += [prefix + w for w in validity_warnings(p.summary(), lag_p99_limit_ms=p.lag_limit_ms)]
    if any(c.info.clustered for c in profile.criteria):
        notes.append("ITL/ICL samples are clustered by request; their bounds count one sample per request")
    header = [("run", str(run_dir)), ("endpoint", str(meta.get("endpoint", "?"))),
              ("model", str(meta.get("model", "?"))), ("profile", f"{profile.name} ({profile.source})"),
              ("confidence", f"{profile.confidence:.0%} one-sided per bound")]
    if baseline is not None:
        bmeta, bpoints = load_points(Path(baseline), profile.slo)
        header.append(("baseline", f"{baseline} (tolerance {_pct(tolerance)})"))
        notes += _comparability(meta, bmeta)
        cases += _baseline_cases(profile, results, bpoints, Path(baseline), tolerance)
    status = overall_status([c.status for c in cases])
    return Outcome(kind="gate", title=f"SLO gate: {profile.name}", status=status,
                   exit_code=exit_code(status, inconclusive), header=header, cases=cases, notes=notes,
                   columns=("measured", "bounds", "limit", "n"))


def _baseline_cases(profile: Profile, results: list[tuple[Criterion, Point, str, Measurement, str]],
                    bpoints: list[Point], baseline: Path, tolerance: float) -> list[Case]:
    conf2 = 1 - (1 - profile.confidence) / 2  # each side at half the error: a false alarm <= 1 - confidence
    cases = []
    for c, p, _, _, _ in results:
        match = [b for b in bpoints if (b.label == p.label if p.label else True)]
        if c.at is not None:
            try:
                match = select(bpoints, c, baseline)
            except ConfigError:
                match = []
        cur = measure(c, p, conf2)
        if len(match) != 1:
            cases.append(_case(c, p, "baseline", "inconclusive", cur, "no matching load point in the baseline",
                               "baseline: -"))
            continue
        base = measure(c, match[0], conf2)
        status, why = compare(cur, base, c.op, tolerance)
        change = (cur.value - base.value) / abs(base.value) * 100 if base.value else _NAN
        msg = f"{change:+.1f}% vs baseline {_num(base.value)} {c.unit}; {why}" if change == change else why
        limit = f"baseline {_num(base.value)} {_bounds(base)} {'+' if c.op == '<=' else '-'}{_pct(tolerance)}"
        cases.append(_case(c, p, "baseline", status, cur, msg, limit,
                           {"baseline_value": _j(base.value), "baseline_lo": _j(base.lo), "baseline_hi": _j(base.hi),
                            "baseline_n": base.n, "change_pct": _j(change), "tolerance": tolerance}))
    return cases


def _comparability(meta: dict[str, Any], bmeta: dict[str, Any]) -> list[str]:
    """Differences that make a baseline comparison compare different traffic."""
    out = []
    for key, what in (("workload", "workload"),):
        if meta.get(key) != bmeta.get(key):
            out.append(f"the baseline ran a different {what}: a change may come from the traffic, not the endpoint")
    a, b = meta.get("settings") or {}, bmeta.get("settings") or {}
    for key in ("arrival", "api", "seed", "ignore_eos", "warmup_s", "cooldown_s"):
        if a.get(key) != b.get(key):
            out.append(f"the baseline's {key} differs ({b.get(key)!r} vs {a.get(key)!r})")
    return out


# --------------------------------------------------------------------------- hooks for run / sweep


def add_gate_options(parser: Any, standalone: bool = False) -> None:
    """``--slo``, ``--gate``, ``--baseline``, ... on a run/sweep parser (see cli/gate_cmd.py)."""
    from .cli.gate_cmd import add_gate_options as add

    add(parser, standalone)


def gate_after_run(run_dir: Path, args: Any) -> int:
    """Judge a finished run folder when ``--gate`` was given; the exit code (else 0)."""
    from .cli.gate_cmd import gate_after_run as after

    return after(Path(run_dir), args)
