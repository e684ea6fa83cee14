"""report.html's charts, each drawn from a run's analysis (``RunAnalysis``).

The bridge between the figures (``analysis.points``) and the chart functions
(``charts``, ``detail_charts``), which take plain numbers: this picks the numbers
for each chart of the run report (which load points, which samples, which SLO
bounds) and returns the ``Figure``; ``html`` places them on the page.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.figure import Figure

from loadgen.analysis.latency_samples import latency_samples
from loadgen.analysis.point_figures import PointFigures
from loadgen.analysis.points import RunAnalysis
from loadgen.analysis.stats import Dist
from loadgen.analysis.timeseries import chart_interval, timeseries
from loadgen.report.charts import Series, goodput_chart, latency_chart, pareto_chart
from loadgen.report.detail_charts import cdf_chart, errors_chart, server_chart, timeseries_chart
from loadgen.report.markup import esc, fmt
from loadgen.run_folder import load_server_metrics

__all__ = [
    "pareto_figure",
    "pareto_caption",
    "goodput_figure",
    "latency_figure",
    "cdf_figure",
    "timeseries_figure",
    "server_figure",
    "errors_figure",
]

_MAX_CDF_POINTS = 8


def pareto_figure(a: RunAnalysis) -> Figure:
    s = Series(
        "run",
        [p.x for p in a.points],
        [p.y for p in a.points],
        a.frontier,
        [p.short_label.replace(" req/s", "") for p in a.points],
        [p.y_ci for p in a.points],
    )
    tpot = a.slo.tpot_ms if a.slo is not None else None
    return pareto_chart(
        [s],
        y_label="output tok/s per GPU" if a.gpus else "output tok/s (aggregate)",
        x_min_slo=1000.0 / tpot if tpot else None,
    )


def pareto_caption(a: RunAnalysis) -> str:
    per = f" per GPU ({fmt(a.gpus)} GPUs)" if a.gpus else ""
    slo = (
        f" The shaded region meets the TPOT bound of {esc(fmt(a.slo.tpot_ms))} ms."
        if a.slo is not None and a.slo.tpot_ms
        else ""
    )
    return (
        f"Aggregate output tokens/s{per} against per-user speed (median 1/TPOT, measured per request); "
        f"the line joins the non-dominated points, bars are 95% batch-means intervals.{slo}"
    )


def goodput_figure(a: RunAnalysis) -> Figure:
    ps = a.points
    cap = a.capacity.rate if a.capacity else None
    return goodput_chart(
        [p.load for p in ps],
        [p.summary.offered_rps for p in ps],
        [p.summary.completed_rps for p in ps],
        [p.summary.goodput_rps for p in ps],
        [p.goodput_ci for p in ps],
        [p.summary.slo_attainment_pct for p in ps],
        [p.attainment_ci for p in ps],
        load_label=a.load_unit,
        target_pct=a.target_pct if a.slo else None,
        capacity=cap,
    )


def latency_figure(a: RunAnalysis) -> Figure:
    ps = a.points
    series: dict[str, tuple[list[float], list[tuple[float, float]]]] = {}
    lower: dict[str, list[bool]] = {}
    for name, attr, pct in (
        ("TTFT p50", "ttft", 50),
        ("TTFT p99", "ttft", 99),
        ("TPOT p50", "tpot", 50),
        ("TPOT p99", "tpot", 99),
        ("ITL p99", "itl", 99),
        ("E2E p99", "e2e", 99),
    ):
        vals, cis, flags = [], [], []
        for p in ps:
            d: Dist = getattr(p.summary, attr)
            v, lo, hi = d.pct(pct) if d.n else (math.nan, math.nan, math.nan)
            vals.append(v)
            cis.append((lo, hi))
            flags.append(d.n > 0 and d.lower_bound(pct))
        series[f"{name} (ms)"] = (vals, cis)
        lower[f"{name} (ms)"] = flags
    bounds = {}
    if a.slo is not None:
        bounds = {k: v for k, v in (("TTFT", a.slo.ttft_ms), ("TPOT", a.slo.tpot_ms)) if v}
    return latency_chart([p.load for p in ps], series, load_label=a.load_unit, bounds=bounds, lower=lower)


def _cdf_points(a: RunAnalysis) -> list[PointFigures]:
    ps = sorted(a.points, key=lambda p: p.load)
    if len(ps) <= _MAX_CDF_POINTS:
        return ps
    pick = np.unique(np.linspace(0, len(ps) - 1, _MAX_CDF_POINTS).round().astype(int))
    return [ps[i] for i in pick]


def cdf_figure(a: RunAnalysis, which: str) -> Figure:
    """One CDF per point of ``which`` ("ttft" or "itl"); TTFT's censored requests (never a first
    token) are counted in each curve's total but not drawn, so its curve stops short of 1."""
    samples, censored = {}, {}
    for p in _cdf_points(a):
        sub = a.table.filter(pc.equal(a.table.column("point"), pa.scalar(p.index))) if a.is_sweep else a.table
        got = latency_samples(sub, p.summary.window)
        name = p.short_label or f"point {p.index}"
        samples[name] = (got.positive_count(which), partial(got.positive_at, which))  # ranks, never a sort
        censored[name] = int(got["ttft_censored"].size) if which == "ttft" else 0
    bound = None
    if a.slo is not None:
        bound = a.slo.ttft_ms if which == "ttft" else a.slo.tpot_ms
    label = "TTFT ms (log)" if which == "ttft" else "inter-token latency ms (log)"
    return cdf_chart(samples, x_label=label, bound=bound, censored=censored)


def timeseries_figure(a: RunAnalysis) -> Figure:
    t = a.table
    if t.num_rows == 0:
        return timeseries_chart([])
    t0 = int(pc.min(t.column("t_sched")).as_py())
    interval = chart_interval(t)  # the interval the summary's pass already binned
    marks = []
    if a.is_sweep:
        for p in a.points:
            sub = t.filter(pc.equal(t.column("point"), pa.scalar(p.index)))
            if sub.num_rows:
                marks.append(((int(pc.min(sub.column("t_sched")).as_py()) - t0) / 1e9, f"#{p.index}"))
    return timeseries_chart(timeseries(t, interval), marks=marks)


def server_figure(a: RunAnalysis) -> Figure:
    rows = [r for r in load_server_metrics(a.run_dir) or [] if "error" not in r and r.get("t_ns")]
    if not rows or a.table.num_rows == 0:
        return server_chart([], [], [], [])
    t0 = int(pc.min(a.table.column("t_sched")).as_py())
    return server_chart(
        [(r["t_ns"] - t0) / 1e9 for r in rows],
        [r.get("running") for r in rows],
        [r.get("waiting") for r in rows],
        [r.get("kv_cache_usage") for r in rows],
    )


def errors_figure(a: RunAnalysis) -> Figure:
    return errors_chart([p.short_label for p in a.points], [p.summary.by_status for p in a.points])
