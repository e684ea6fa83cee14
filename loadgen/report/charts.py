"""The charts against load, drawn with matplotlib's object API: Pareto, goodput, latency, overlays.

These are the figures a sweep and a bake-off are judged on. Each function draws
one kind of chart from plain numbers and returns a ``Figure``; ``chart_style``'s
``to_svg`` makes it an SVG string without the XML prolog, ready to sit inside
``<figure class="chart">``. How every chart looks and how a figure is written out
(deterministic bytes, text kept as text, no global matplotlib state) is
``chart_style``; the run's detail charts (distributions, over time, server,
errors) are ``detail_charts``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from loadgen.analysis.columns import Floats
from loadgen.report.chart_style import (
    COLORS,
    apart,
    empty,
    finite,
    legend_right,
    log_scale,
    new_axes,
    new_figure,
    styled,
)

__all__ = ["Series", "pareto_chart", "goodput_chart", "latency_chart", "overlay_chart"]


@dataclass
class Series:
    """One run's points for the Pareto chart (several series overlay in a comparison)."""

    name: str
    x: list[float]
    y: list[float]
    frontier: list[int]
    labels: list[str] = field(default_factory=list)
    y_err: list[tuple[float, float]] = field(default_factory=list)


@styled
def pareto_chart(series: Sequence[Series], *, y_label: str, x_min_slo: float | None = None, title: str = "") -> Figure:
    """Aggregate output tok/s against per-user tok/s: every point, the frontier as a line,
    and the region an SLO's TPOT bound allows (per-user >= 1000 / TPOT) shaded."""
    fig = new_figure()
    ax = new_axes(fig)
    drawn = [_pareto_series(ax, s, COLORS[i % len(COLORS)], len(series) > 1) for i, s in enumerate(series)]
    if not any(drawn):
        empty(ax, "no point has a per-user speed and a throughput")
        return fig
    xs = np.concatenate([np.asarray(s.x, dtype=float) for s in series])
    xs = xs[np.isfinite(xs)]
    slo = x_min_slo if x_min_slo is not None and math.isfinite(x_min_slo) else None
    lo, hi = float(xs.min()), float(xs.max())
    if slo is not None:
        lo, hi = min(lo, slo), max(hi, slo)
    pad = max(hi - lo, hi * 0.05, 1e-9) * 0.08
    ax.set_xlim(max(0.0, lo - pad), hi + pad)
    if slo is not None:
        ax.axvspan(slo, hi + pad, color="#2ca02c", alpha=0.08, label=f"TPOT SLO met (>= {slo:.3g} tok/s)")
        ax.axvline(slo, color="#2ca02c", lw=1, ls="--")
    ax.set_xlabel("interactivity: per-user output tok/s (median of 1/TPOT)")
    ax.set_ylabel(y_label)
    ax.set_ylim(bottom=0)
    if len(series) == 1:
        _point_labels(ax, series[0])
    legend_right(ax)
    if title:
        ax.set_title(title)
    return fig


def _pareto_series(ax: Axes, s: Series, color: str, overlaid: bool) -> bool:
    """One run's points (with their intervals), its frontier and, alone, the points' labels; False if none drawn."""
    x, y = np.asarray(s.x, dtype=float), np.asarray(s.y, dtype=float)
    ok = finite(x, y)
    if not ok.any():
        return False
    if s.y_err and len(s.y_err) == len(s.y):
        lo = np.array([v - e[0] for v, e in zip(y, s.y_err, strict=True)])
        hi = np.array([e[1] - v for v, e in zip(y, s.y_err, strict=True)])
        err = np.nan_to_num(np.vstack([lo, hi])[:, ok], nan=0.0).clip(min=0)
        ax.errorbar(x[ok], y[ok], yerr=err, fmt="none", ecolor=color, alpha=0.35, lw=1)
    points = f"{s.name}: points" if overlaid else "load points"
    ax.scatter(x[ok], y[ok], color=color, alpha=0.55, s=22, label=points, zorder=3)
    fr = [j for j in s.frontier if ok[j]]
    if fr:
        frontier = f"{s.name}: frontier" if overlaid else "Pareto frontier"
        ax.plot(x[fr], y[fr], "-o", color=color, lw=2, ms=5, label=frontier, zorder=4)
    return True


_LABEL_PT = 7.0


def _point_labels(ax: Axes, s: Series) -> None:
    """Each point's load beside it, frontier points first, leaving out a label that would overlap
    one already written (close points at high load otherwise print over each other)."""
    labels = [s.labels[j] if j < len(s.labels) else "" for j in range(len(s.x))]
    order = list(dict.fromkeys([*s.frontier, *range(len(s.x))]))
    xy = list(zip(s.x, s.y, strict=True))
    for j in apart(ax, xy, labels, fontsize=_LABEL_PT, order=order):
        ax.annotate(labels[j], xy[j], textcoords="offset points", xytext=(4, 4), fontsize=_LABEL_PT, color="#444")


@styled
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
    fig = new_figure(right=2.8)
    ax = new_axes(fig)
    order = np.argsort(np.asarray(load, dtype=float))
    x = np.asarray(load, dtype=float)[order]
    ax.plot(x, np.asarray(offered, dtype=float)[order], ":", color="#7f7f7f", label="offered req/s")
    ax.plot(x, np.asarray(completed, dtype=float)[order], "-o", color=COLORS[0], ms=4, label="completed req/s")
    if any(g is not None for g in goodput):
        good, good_ci = [goodput[i] for i in order], [goodput_ci[i] for i in order]
        _band(ax, x, good, good_ci, "goodput req/s (met SLO)", COLORS[2], "-s", alpha=0.15)
        ax2 = ax.twinx()
        ax2.grid(False)
        att, att_ci = [attainment[i] for i in order], [attainment_ci[i] for i in order]
        _band(ax2, x, att, att_ci, "SLO attainment %", COLORS[1], "-^", alpha=0.1, ci_scale=100.0)
        if target_pct is not None:
            ax2.axhline(target_pct, color=COLORS[1], ls="--", lw=1, label=f"target {target_pct:g}%")
        ax2.set_ylim(0, 102)
        ax2.set_ylabel("SLO attainment %")
        ax2.spines["right"].set_visible(True)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        legend_right(ax2, h1 + h2, l1 + l2, x=1.12)
    else:
        legend_right(ax)
    if capacity is not None:
        ax.axvline(capacity, color="#444", lw=1, ls="-.")
        ax.annotate(
            f"capacity at SLO {capacity:g}", (capacity, 0), textcoords="offset points", xytext=(3, 3), fontsize=7
        )
    ax.set_xlabel(load_label)
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    return fig


def _band(
    ax: Axes,
    x: Floats,
    values: Sequence[float | None],
    cis: Sequence[tuple[float, float] | None],
    label: str,
    color: str,
    style: str,
    *,
    alpha: float,
    ci_scale: float = 1.0,
) -> None:
    """A line of ``values`` (None: a gap) over its interval band; ``ci_scale`` brings the interval to their unit."""
    v = np.array([np.nan if a is None else a for a in values], dtype=float)
    lo = np.array([c[0] * ci_scale if c else np.nan for c in cis], dtype=float)
    hi = np.array([c[1] * ci_scale if c else np.nan for c in cis], dtype=float)
    ax.plot(x, v, style, color=color, ms=4, label=label)
    ax.fill_between(x, lo, hi, color=color, alpha=alpha, lw=0)


@styled
def latency_chart(
    load: Sequence[float],
    metrics: dict[str, tuple[list[float], list[tuple[float, float]]]],
    *,
    load_label: str,
    bounds: dict[str, float] | None = None,
    lower: dict[str, list[bool]] | None = None,
) -> Figure:
    """Latency percentiles (ms, log scale) against load, each with its 95% interval band.

    An unbounded upper end (too few exact samples) draws the band to the top of the plot;
    a value that is only a lower bound (``lower``: censored samples reach it) is marked ▲."""
    fig = new_figure()
    ax = new_axes(fig)
    x = np.asarray(load, dtype=float)
    order = np.argsort(x)
    bands = []
    for i, (name, (vals, cis)) in enumerate(metrics.items()):
        v = np.asarray(vals, dtype=float)[order]
        if not np.isfinite(v).any():
            continue
        c = COLORS[i % len(COLORS)]
        ax.plot(x[order], v, "-o", ms=3, color=c, label=name)
        lb = np.asarray((lower or {}).get(name, [False] * len(vals)), dtype=bool)[order]
        if lb.any():
            ax.plot(x[order][lb], v[lb], "^", ms=7, mfc="none", color=c, ls="none")
        lo = np.array([cis[j][0] for j in order], dtype=float)
        hi = np.array([cis[j][1] for j in order], dtype=float)
        bands.append((np.where(lo > 0, lo, np.nan), hi, c))
    if not bands:
        empty(ax, "no successful request to time")
        return fig
    if any(np.asarray(f, dtype=bool).any() for f in (lower or {}).values()):
        ax.plot([], [], "^", mfc="none", color="#444", ls="none", label=">= lower bound (censored)")
    for k, (name, b) in enumerate((bounds or {}).items()):
        ax.axhline(b, ls="--", lw=1, color="#444")
        right = k % 2 == 1  # alternate sides so two close bounds' labels do not overlap
        ax.annotate(
            f"{name} bound {b:g} ms",
            (float(x.max() if right else x.min()), b),
            textcoords="offset points",
            xytext=(-2 if right else 2, 2),
            ha="right" if right else "left",
            fontsize=7,
        )
    log_scale(ax)
    finite_hi = [float(np.max(hi[np.isfinite(hi)])) for _, hi, _ in bands if np.isfinite(hi).any()]
    top = max([ax.get_ylim()[1], *finite_hi])  # an unbounded end reaches the top of the plot
    for lo, hi, c in bands:
        ax.fill_between(x[order], lo, np.where(np.isposinf(hi), top, hi), color=c, alpha=0.12, lw=0)
    ax.set_ylim(top=top)
    ax.set_xlabel(load_label)
    ax.set_ylabel("ms (log scale)")
    legend_right(ax)
    return fig


@styled
def overlay_chart(
    series: dict[str, tuple[list[float], list[float], list[tuple[float, float]]]],
    *,
    x_label: str,
    y_label: str,
    log_y: bool = False,
) -> Figure:
    """One line per run (x, y and a 95% band) on shared axes: a comparison at matched load."""
    fig = new_figure()
    ax = new_axes(fig)
    drawn = False
    for i, (name, (xs, ys, cis)) in enumerate(series.items()):
        x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        ok = finite(x, y)
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
        empty(ax, "nothing to compare")
        return fig
    if log_y:
        log_scale(ax)
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    legend_right(ax)
    return fig
