"""Charts as inline SVG (and PNG), drawn with matplotlib's object API.

Each function draws one kind of chart from plain numbers and returns a
``Figure``; ``to_svg`` makes it an SVG string without the XML prolog, ready to
sit inside ``<figure class="chart">``. How every chart looks and how a figure
is written out (deterministic bytes, text kept as text, no global matplotlib
state) is ``chart_style``; its ``to_svg``, ``to_png``, ``RC`` and ``COLORS``
are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from loadgen.report.chart_style import (
    COLORS,
    _axes,
    _empty,
    _figure,
    _finite,
    _legend_right,
    _log,
    _styled,
)

__all__ = [
    "Series",
    "pareto_chart",
    "goodput_chart",
    "latency_chart",
    "cdf_chart",
    "timeseries_chart",
    "errors_chart",
    "overlay_chart",
]

_MAX_LINE_POINTS = 400


@dataclass
class Series:
    """One run's points for the Pareto chart (several series overlay in a comparison)."""

    name: str
    x: list[float]
    y: list[float]
    frontier: list[int]
    labels: list[str] = field(default_factory=list)
    y_err: list[tuple[float, float]] = field(default_factory=list)


@_styled
def pareto_chart(series: Sequence[Series], *, y_label: str, x_min_slo: float | None = None, title: str = "") -> Figure:
    """Aggregate output tok/s against per-user tok/s: every point, the frontier as a line,
    and the region an SLO's TPOT bound allows (per-user >= 1000 / TPOT) shaded."""
    fig = _figure()
    ax = _axes(fig)
    drawn = False
    for i, s in enumerate(series):
        c = COLORS[i % len(COLORS)]
        x, y = np.asarray(s.x, dtype=float), np.asarray(s.y, dtype=float)
        ok = _finite(x, y)
        if not ok.any():
            continue
        drawn = True
        if s.y_err and len(s.y_err) == len(s.y):
            lo = np.array([v - e[0] for v, e in zip(y, s.y_err, strict=True)])
            hi = np.array([e[1] - v for v, e in zip(y, s.y_err, strict=True)])
            err = np.nan_to_num(np.vstack([lo, hi])[:, ok], nan=0.0).clip(min=0)
            ax.errorbar(x[ok], y[ok], yerr=err, fmt="none", ecolor=c, alpha=0.35, lw=1)
        ax.scatter(
            x[ok],
            y[ok],
            color=c,
            alpha=0.55,
            s=22,
            label=f"{s.name}: points" if len(series) > 1 else "load points",
            zorder=3,
        )
        fr = [j for j in s.frontier if ok[j]]
        if fr:
            ax.plot(
                x[fr],
                y[fr],
                "-o",
                color=c,
                lw=2,
                ms=5,
                label=f"{s.name}: frontier" if len(series) > 1 else "Pareto frontier",
                zorder=4,
            )
        if len(series) == 1:
            for j in np.flatnonzero(ok):
                if j < len(s.labels) and s.labels[j]:
                    ax.annotate(
                        s.labels[j], (x[j], y[j]), textcoords="offset points", xytext=(4, 4), fontsize=7, color="#444"
                    )
    if not drawn:
        _empty(ax, "no point has a per-user speed and a throughput")
        return fig
    xs = np.concatenate([np.asarray(s.x, dtype=float) for s in series])
    xs = xs[np.isfinite(xs)]
    slo = x_min_slo is not None and math.isfinite(x_min_slo)
    lo, hi = float(xs.min()), float(xs.max())
    if slo:
        lo, hi = min(lo, x_min_slo), max(hi, x_min_slo)  # type: ignore[type-var]
    pad = max(hi - lo, hi * 0.05, 1e-9) * 0.08
    ax.set_xlim(max(0.0, lo - pad), hi + pad)
    if slo:
        ax.axvspan(x_min_slo, hi + pad, color="#2ca02c", alpha=0.08, label=f"TPOT SLO met (>= {x_min_slo:.3g})")
        ax.axvline(x_min_slo, color="#2ca02c", lw=1, ls="--")
    ax.set_xlabel("interactivity: per-user output tok/s (median of 1/TPOT)")
    ax.set_ylabel(y_label)
    ax.set_ylim(bottom=0)
    _legend_right(ax)
    if title:
        ax.set_title(title)
    return fig


@_styled
def goodput_chart(
    load: Sequence[float],
    offered: Sequence[float],
    completed: Sequence[float],
    goodput: Sequence[float | None],
    goodput_ci: Sequence[tuple[float, float] | None],
    attainment: Sequence[float | None],
    attainment_ci: Sequence[tuple[float, float] | None],
    *,
    load_label: str,
    target_pct: float | None,
    capacity: float | None,
) -> Figure:
    """Completed and good requests/s against load, with SLO attainment % on the right axis."""
    fig = _figure(right=2.8)
    ax = _axes(fig)
    order = np.argsort(np.asarray(load, dtype=float))
    x = np.asarray(load, dtype=float)[order]
    ax.plot(x, np.asarray(offered, dtype=float)[order], ":", color="#7f7f7f", label="offered req/s")
    ax.plot(x, np.asarray(completed, dtype=float)[order], "-o", color=COLORS[0], ms=4, label="completed req/s")
    if any(g is not None for g in goodput):
        g = np.array([np.nan if goodput[i] is None else goodput[i] for i in order], dtype=float)
        ci = [goodput_ci[i] for i in order]
        lo = np.array([c[0] if c else np.nan for c in ci])
        hi = np.array([c[1] if c else np.nan for c in ci])
        ax.plot(x, g, "-s", color=COLORS[2], ms=4, label="goodput req/s (met SLO)")
        ax.fill_between(x, lo, hi, color=COLORS[2], alpha=0.15, lw=0)
        ax2 = ax.twinx()
        ax2.grid(False)
        a = np.array([np.nan if attainment[i] is None else attainment[i] for i in order], dtype=float)
        aci = [attainment_ci[i] for i in order]
        ax2.plot(x, a, "-^", color=COLORS[1], ms=4, label="SLO attainment %")
        ax2.fill_between(
            x,
            [c[0] * 100 if c else np.nan for c in aci],
            [c[1] * 100 if c else np.nan for c in aci],
            color=COLORS[1],
            alpha=0.1,
            lw=0,
        )
        if target_pct is not None:
            ax2.axhline(target_pct, color=COLORS[1], ls="--", lw=1, label=f"target {target_pct:g}%")
        ax2.set_ylim(0, 102)
        ax2.set_ylabel("SLO attainment %")
        ax2.spines["right"].set_visible(True)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        _legend_right(ax2, h1 + h2, l1 + l2, x=1.12)
    else:
        _legend_right(ax)
    if capacity is not None:
        ax.axvline(capacity, color="#444", lw=1, ls="-.")
        ax.annotate(
            f"capacity at SLO {capacity:g}", (capacity, 0), textcoords="offset points", xytext=(3, 3), fontsize=7
        )
    ax.set_xlabel(load_label)
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    return fig


@_styled
def latency_chart(
    load: Sequence[float],
    metrics: dict[str, tuple[list[float], list[tuple[float, float]]]],
    *,
    load_label: str,
    bounds: dict[str, float] | None = None,
) -> Figure:
    """Latency percentiles (ms, log scale) against load, each with its 95% interval band."""
    fig = _figure()
    ax = _axes(fig)
    x = np.asarray(load, dtype=float)
    order = np.argsort(x)
    drawn = False
    for i, (name, (vals, cis)) in enumerate(metrics.items()):
        v = np.asarray(vals, dtype=float)[order]
        if not np.isfinite(v).any():
            continue
        drawn = True
        c = COLORS[i % len(COLORS)]
        ax.plot(x[order], v, "-o", ms=3, color=c, label=name)
        lo = np.array([cis[j][0] for j in order], dtype=float)
        hi = np.array([cis[j][1] for j in order], dtype=float)
        hi = np.where(np.isfinite(hi), hi, np.nan)
        ax.fill_between(x[order], np.where(lo > 0, lo, np.nan), hi, color=c, alpha=0.12, lw=0)
    if not drawn:
        _empty(ax, "no successful request to time")
        return fig
    for name, b in (bounds or {}).items():
        ax.axhline(b, ls="--", lw=1, color="#444")
        ax.annotate(f"{name} bound {b:g} ms", (x.min(), b), textcoords="offset points", xytext=(2, 2), fontsize=7)
    _log(ax)
    ax.set_xlabel(load_label)
    ax.set_ylabel("ms (log scale)")
    _legend_right(ax)
    return fig


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most _MAX_LINE_POINTS steps of the empirical CDF (quantiles on a fixed grid)."""
    v = np.sort(np.asarray(values, dtype=float))
    n = v.size
    if n <= _MAX_LINE_POINTS:
        return v, np.arange(1, n + 1) / n
    q = np.unique(np.concatenate([np.linspace(0, 1, _MAX_LINE_POINTS - 20), 1 - np.logspace(-4, -1, 20)]))
    idx = np.clip(np.ceil(q * n).astype(int) - 1, 0, n - 1)
    return v[idx], (idx + 1) / n


@_styled
def cdf_chart(samples: dict[str, np.ndarray], *, x_label: str, bound: float | None = None) -> Figure:
    """One empirical CDF per load point (log x), so tails can be compared across load."""
    fig = _figure(h=3.6)
    ax = _axes(fig)
    drawn = False
    for i, (name, vals) in enumerate(samples.items()):
        v = np.asarray(vals, dtype=float)
        v = v[np.isfinite(v) & (v > 0)]
        if v.size == 0:
            continue
        drawn = True
        xs, ys = _ecdf(v)
        ax.step(xs, ys, where="post", color=COLORS[i % len(COLORS)], lw=1.2, label=f"{name} (n={v.size})")
    if not drawn:
        _empty(ax, "no samples")
        return fig
    if bound is not None:
        ax.axvline(bound, ls="--", lw=1, color="#444", label=f"SLO bound {bound:g} ms")
    _log(ax, "x")
    ax.set_ylim(0, 1.01)
    ax.set_xlabel(x_label)
    ax.set_ylabel("fraction <= x")
    _legend_right(ax)
    return fig


@_styled
def timeseries_chart(rows: list[dict[str, Any]], *, marks: Sequence[tuple[float, str]] = ()) -> Figure:
    """The run over time: output tok/s and in-flight; TTFT/ITL p50 and p99; errors. Point starts are marked."""
    fig = _figure(h=6.0, right=2.8)
    axes = fig.subplots(3, 1, sharex=True)
    if not rows:
        _empty(axes[0], "no records")
        return fig
    rows = rows[:: max(1, math.ceil(len(rows) / _MAX_LINE_POINTS))]
    t = np.array([r["t_s"] for r in rows], dtype=float)

    def col(k: str) -> np.ndarray:
        return np.array([np.nan if r.get(k) is None else r[k] for r in rows], dtype=float)

    a0 = axes[0]
    a0.plot(t, col("output_tps"), color=COLORS[0], lw=1.2, label="output tok/s")
    a0.set_ylabel("output tok/s")
    tw = a0.twinx()
    tw.grid(False)
    tw.plot(t, col("in_flight"), color=COLORS[3], lw=1, alpha=0.8, label="in flight")
    tw.set_ylabel("in flight")
    tw.spines["right"].set_visible(True)
    h1, l1 = a0.get_legend_handles_labels()
    h2, l2 = tw.get_legend_handles_labels()
    _legend_right(tw, h1 + h2, l1 + l2, x=1.12)
    a1 = axes[1]
    for i, k in enumerate(("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")):
        v = col(k)
        if np.isfinite(v).any():
            a1.plot(t, v, lw=1, color=COLORS[i], label=k.replace("_ms", "").replace("_", " "))
    _log(a1)
    a1.set_ylabel("ms (log)")
    _legend_right(a1)
    a2 = axes[2]
    a2.bar(t, col("errors"), width=(t[1] - t[0]) if t.size > 1 else 1.0, color=COLORS[1], label="errors")
    a2.plot(t, col("completed"), color=COLORS[2], lw=1, label="completed ok")
    a2.set_ylabel("requests / interval")
    a2.set_xlabel("seconds since the first scheduled request")
    _legend_right(a2)
    for ax in axes:
        for x0, _ in marks:
            ax.axvline(x0, color="#999", lw=0.6, ls=":")
    for x0, label in marks:
        axes[0].annotate(
            label,
            (x0, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=6,
            color="#666",
            xytext=(2, -8),
            textcoords="offset points",
        )
    return fig


@_styled
def server_chart(
    t_s: Sequence[float],
    running: Sequence[float | None],
    waiting: Sequence[float | None],
    kv_usage: Sequence[float | None],
) -> Figure:
    """What the server reported over the run (its /metrics): requests running and waiting, KV-cache use."""
    fig = _figure(h=2.8, right=2.8)
    ax = _axes(fig)
    if not len(t_s):
        _empty(ax, "the server exposed no metrics (or --server-metrics off)")
        return fig
    t = np.asarray(t_s, dtype=float)

    def arr(v: Sequence[float | None]) -> np.ndarray:
        return np.array([np.nan if x is None else x for x in v], dtype=float)

    ax.plot(t, arr(running), color=COLORS[0], lw=1.2, label="running")
    ax.plot(t, arr(waiting), color=COLORS[1], lw=1.2, label="waiting")
    ax.set_ylabel("requests")
    ax.set_xlabel("seconds since the first scheduled request")
    tw = ax.twinx()
    tw.grid(False)
    tw.plot(t, 100 * arr(kv_usage), color=COLORS[3], lw=1, ls="--", label="KV cache %")
    tw.set_ylabel("KV cache used %")
    tw.spines["right"].set_visible(True)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = tw.get_legend_handles_labels()
    _legend_right(tw, h1 + h2, l1 + l2, x=1.12)
    return fig


@_styled
def errors_chart(labels: Sequence[str], by_status: Sequence[dict[str, int]]) -> Figure:
    """Failed requests per point, stacked by status (ok excluded)."""
    statuses = sorted({k for d in by_status for k, v in d.items() if v and k != "ok"})
    fig = _figure(h=3.4 if statuses else 1.0, bottom=0.9 if statuses else 0.1)
    ax = _axes(fig)
    if not statuses:
        _empty(ax, "no failed or cancelled requests")
        return fig
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for i, st in enumerate(statuses):
        v = np.array([d.get(st, 0) for d in by_status], dtype=float)
        ax.bar(x, v, bottom=bottom, color=COLORS[(i + 1) % len(COLORS)], label=st)
        bottom += v
    ax.set_xticks(x, list(labels), rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("requests in the window")
    _legend_right(ax)
    return fig


@_styled
def overlay_chart(
    series: dict[str, tuple[list[float], list[float], list[tuple[float, float]]]],
    *,
    x_label: str,
    y_label: str,
    log_y: bool = False,
) -> Figure:
    """One line per run (x, y and a 95% band) on shared axes: a comparison at matched load."""
    fig = _figure()
    ax = _axes(fig)
    drawn = False
    for i, (name, (xs, ys, cis)) in enumerate(series.items()):
        x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        ok = _finite(x, y)
        if not ok.any():
            continue
        drawn = True
        order = np.argsort(x[ok])
        c = COLORS[i % len(COLORS)]
        ax.plot(x[ok][order], y[ok][order], "-o", ms=3, color=c, label=name)
        if cis and len(cis) == len(ys):
            lo = np.array([v[0] for v in cis], dtype=float)[ok][order]
            hi = np.array([v[1] for v in cis], dtype=float)[ok][order]
            hi = np.where(np.isfinite(hi), hi, np.nan)
            ax.fill_between(x[ok][order], np.where(np.isfinite(lo), lo, np.nan), hi, color=c, alpha=0.12, lw=0)
    if not drawn:
        _empty(ax, "nothing to compare")
        return fig
    if log_y:
        _log(ax)
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    _legend_right(ax)
    return fig
