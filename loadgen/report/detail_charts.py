"""The run's detail charts: latency distributions, the run over time, what the server said, failures.

Split from ``charts`` (the figures against load that a sweep and a comparison are
judged on) because these show one run from the inside: an empirical CDF per load
point, the whole run on a time axis, the server's own ``/metrics`` and the failed
requests. Each draws from plain numbers and returns a ``Figure``, styled by
``chart_style``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from loadgen.analysis.latency_samples import cdf_ranks
from loadgen.report.chart_style import (
    COLORS,
    apart,
    empty,
    legend_right,
    log_scale,
    new_axes,
    new_figure,
    styled,
    thin_ticks,
)

__all__ = ["cdf_chart", "timeseries_chart", "server_chart", "errors_chart"]

_MAX_LINE_POINTS = 400


# a sample too large to sort for a chart: (how many values are drawn, their values at given 0-based ranks)
CdfSteps = tuple[int, Callable[[np.ndarray], np.ndarray]]


def _ecdf(values: np.ndarray | CdfSteps) -> tuple[np.ndarray, np.ndarray, int]:
    """At most ``CDF_STEPS`` steps of the empirical CDF of the finite values > 0 (quantiles on a
    fixed grid), and how many values there are."""
    if isinstance(values, tuple):
        n, at = values
        idx = cdf_ranks(n)
        return (at(idx) if n else np.zeros(0)), (idx + 1) / max(n, 1), n
    v = np.asarray(values, dtype=float)
    v = np.sort(v[np.isfinite(v) & (v > 0)])
    idx = cdf_ranks(v.size)
    return v[idx], (idx + 1) / max(v.size, 1), v.size


@styled
def cdf_chart(
    samples: Mapping[str, np.ndarray | CdfSteps],
    *,
    x_label: str,
    bound: float | None = None,
    censored: dict[str, int] | None = None,
) -> Figure:
    """One empirical CDF per load point (log x), so tails can be compared across load.

    ``censored``: per point, samples known only to be at least some value (requests that
    never got a first token). They count in the curve's total but are not drawn, so the
    curve stops at 1 - k/n: what is drawn is then a lower bound of the true CDF."""
    fig = new_figure(h=3.6)
    ax = new_axes(fig)
    drawn = False
    for i, (name, vals) in enumerate(samples.items()):
        xs, ys, size = _ecdf(vals)
        k = (censored or {}).get(name, 0)
        if size == 0 and not k:
            continue
        drawn = True
        label = f"{name} (n={size + k:,}" + (f"; {k:,} censored)" if k else ")")  # the caption: not drawn
        if size == 0:
            ax.plot([], [], color=COLORS[i % len(COLORS)], lw=1.2, label=label)
            continue
        ax.step(xs, ys * size / (size + k), where="post", color=COLORS[i % len(COLORS)], lw=1.2, label=label)
    if not drawn:
        empty(ax, "no samples")
        return fig
    if bound is not None:
        ax.axvline(bound, ls="--", lw=1, color="#444", label=f"SLO bound {bound:g} ms")
    log_scale(ax, "x")
    ax.set_ylim(0, 1.01)
    ax.set_xlabel(x_label)
    ax.set_ylabel("fraction <= x")
    legend_right(ax)
    return fig


@styled
def timeseries_chart(rows: list[dict[str, Any]], *, marks: Sequence[tuple[float, str]] = ()) -> Figure:
    """The run over time: output tok/s and in-flight; TTFT/ITL p50 and p99; errors. Point starts are marked."""
    fig = new_figure(h=6.0, right=2.8)
    axes = fig.subplots(3, 1, sharex=True)
    if not rows:
        empty(axes[0], "no records")
        return fig
    rows = rows[:: max(1, math.ceil(len(rows) / _MAX_LINE_POINTS))]
    t = np.array([r["t_s"] for r in rows], dtype=float)

    def col(k: str) -> np.ndarray:
        return np.array([np.nan if r.get(k) is None else r[k] for r in rows], dtype=float)

    a0 = axes[0]
    a0.plot(t, col("output_tps"), color=COLORS[0], lw=1.2, label="output (tok/s)")
    a0.set_ylabel("output tok/s")
    tw = a0.twinx()
    tw.grid(False)
    tw.plot(t, col("in_flight"), color=COLORS[3], lw=1, alpha=0.8, label="in flight (requests)")
    tw.set_ylabel("in flight (requests)")
    tw.spines["right"].set_visible(True)
    h1, l1 = a0.get_legend_handles_labels()
    h2, l2 = tw.get_legend_handles_labels()
    legend_right(tw, h1 + h2, l1 + l2, x=1.12)
    a1 = axes[1]
    for i, k in enumerate(("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")):
        v = col(k)
        if np.isfinite(v).any():
            name = k.replace("_ms", "").replace("_", " ").replace("ttft", "TTFT").replace("itl", "ITL")
            a1.plot(t, v, lw=1, color=COLORS[i], label=f"{name} (ms)")
    log_scale(a1)
    a1.set_ylabel("ms (log)")
    legend_right(a1)
    a2 = axes[2]
    a2.bar(t, col("errors"), width=(t[1] - t[0]) if t.size > 1 else 1.0, color=COLORS[1], label="errors (requests)")
    a2.plot(t, col("completed"), color=COLORS[2], lw=1, label="completed ok (requests)")
    a2.set_ylabel("requests / interval")
    a2.set_xlabel("seconds since the first scheduled request")
    legend_right(a2)
    for ax in axes:
        for x0, _ in marks:
            ax.axvline(x0, color="#999", lw=0.6, ls=":")
    top = axes[0].get_ylim()[1]
    names = [label for _, label in marks]
    keep = apart(axes[0], [(x0, top) for x0, _ in marks], names, fontsize=6, offset_pt=(2.0, -8.0))
    for x0, label in (marks[i] for i in keep):  # a label that would overlap its neighbour is left out
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


@styled
def server_chart(
    t_s: Sequence[float],
    running: Sequence[float | None],
    waiting: Sequence[float | None],
    kv_usage: Sequence[float | None],
) -> Figure:
    """What the server reported over the run (its /metrics): requests running and waiting, KV-cache use."""
    fig = new_figure(h=2.8, right=2.8)
    ax = new_axes(fig)
    if not len(t_s):
        empty(ax, "the server exposed no metrics (or --server-metrics off)")
        return fig
    t = np.asarray(t_s, dtype=float)

    def arr(v: Sequence[float | None]) -> np.ndarray:
        return np.array([np.nan if x is None else x for x in v], dtype=float)

    ax.plot(t, arr(running), color=COLORS[0], lw=1.2, label="running (requests)")
    ax.plot(t, arr(waiting), color=COLORS[1], lw=1.2, label="waiting (requests)")
    ax.set_ylabel("requests")
    ax.set_xlabel("seconds since the first scheduled request")
    tw = ax.twinx()
    tw.grid(False)
    tw.plot(t, 100 * arr(kv_usage), color=COLORS[3], lw=1, ls="--", label="KV cache used (%)")
    tw.set_ylabel("KV cache used %")
    tw.spines["right"].set_visible(True)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = tw.get_legend_handles_labels()
    legend_right(tw, h1 + h2, l1 + l2, x=1.12)
    return fig


@styled
def errors_chart(labels: Sequence[str], by_status: Sequence[dict[str, int]]) -> Figure:
    """Failed requests per point, stacked by status (ok excluded)."""
    statuses = sorted({k for d in by_status for k, v in d.items() if v and k != "ok"})
    fig = new_figure(h=3.4 if statuses else 1.0, bottom=0.9 if statuses else 0.1)
    ax = new_axes(fig)
    if not statuses:
        empty(ax, "no failed or cancelled requests")
        return fig
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for i, st in enumerate(statuses):
        v = np.array([d.get(st, 0) for d in by_status], dtype=float)
        ax.bar(x, v, bottom=bottom, color=COLORS[(i + 1) % len(COLORS)], label=f"{st} (requests)")
        bottom += v
    thin_ticks(ax, list(x), list(labels), fontsize=7)
    ax.set_ylabel("requests in the window")
    legend_right(ax)
    return fig
