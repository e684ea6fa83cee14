"""How every chart looks and is written out: matplotlib set up once, for all of them.

No pyplot and no global backend: each chart is a ``Figure`` rendered by its own
canvas, so importing loadgen never changes the caller's matplotlib state and
charts can be drawn from any thread. Output is deterministic (a fixed
``svg.hashsalt``, no date in the metadata) so the same records give the same
report bytes, and text stays text (``svg.fonttype: none``), which keeps files
small; math-text parsing is off, so a ``$`` in a label is just a dollar sign.
Kept apart from ``charts`` and ``detail_charts`` (what each chart shows) because
this is the part every chart shares: the style (``RC``, ``COLORS``, ``styled``),
the figure and axes helpers, and ``to_svg`` / ``to_png``.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec

import matplotlib
import numpy as np
from matplotlib import ticker
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType  # matplotlib >= 3.9; only read by the type checker

__all__ = [
    "RC",
    "COLORS",
    "styled",
    "new_figure",
    "new_axes",
    "log_scale",
    "legend_right",
    "empty",
    "finite",
    "apart",
    "thin_ticks",
    "to_svg",
    "to_png",
]

RC: dict[RcKeyType, Any] = {
    "svg.hashsalt": "loadgen",
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "path.simplify": True,
}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
_PROLOG = re.compile(r"^.*?(?=<svg)", re.S)
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)
P = ParamSpec("P")


def styled(fn: Callable[P, Figure]) -> Callable[P, Figure]:
    """Draw under RC: matplotlib reads most style at artist creation, not at save time."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Figure:
        with matplotlib.rc_context(RC):
            return fn(*args, **kwargs)

    return wrapper


def new_figure(w: float = 9.0, h: float = 4.0, right: float = 2.3, bottom: float = 0.5) -> Figure:
    """Fixed margins in inches (``right`` leaves room for the legend): constrained layout would
    double the drawing time of every chart."""
    fig = Figure(figsize=(w, h))
    fig.subplots_adjust(left=0.75 / w, right=1 - right / w, bottom=bottom / h, top=1 - 0.3 / h, hspace=0.25)
    return fig


def to_svg(fig: Figure) -> str:
    """The figure as an inline SVG element (no XML prolog or RDF metadata)."""
    buf = io.StringIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "loadgen"})
    return _METADATA.sub("", _PROLOG.sub("", buf.getvalue(), count=1), count=1)


def to_png(fig: Figure, dpi: int = 120) -> bytes:
    buf = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": "loadgen"})
    return buf.getvalue()


def new_axes(fig: Figure) -> Axes:
    """The figure's one plot."""
    return fig.add_subplot()


def _plain(v: float, _pos: int | None = None) -> str:
    return f"{v:g}"


def log_scale(ax: Axes, axis: str = "y") -> None:
    """Log scale with plain tick labels (math text is off, so the default 10^k labels would show raw)."""
    a = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    a.set_major_formatter(ticker.FuncFormatter(_plain))
    a.set_minor_formatter(ticker.NullFormatter())


def legend_right(
    ax: Axes, handles: Sequence[Artist] | None = None, labels: Sequence[str] | None = None, x: float = 1.02
) -> None:
    """The legend beside the plot, where it cannot hide data (``x`` > 1.02 clears a right-hand axis)."""
    if handles is None or labels is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(x, 1.0), borderaxespad=0.0)


def empty(ax: Axes, text: str) -> None:
    """A plot with nothing to show says why, and has no axes ticks."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def finite(*arrays: ArrayLike) -> NDArray[np.bool_]:
    """Where every one of the equally long arrays is a finite number."""
    values = [np.asarray(a, dtype=float) for a in arrays]
    ok = np.ones(values[0].shape, dtype=bool)
    for v in values:
        ok &= np.isfinite(v)
    return ok


def _text_px(fig: Figure, text: str, fontsize: float) -> tuple[float, float]:
    """An upper estimate of a one-line label's (width, height) in pixels (DejaVu Sans's digits are
    0.64 em, its capitals and signs up to 0.84), cheap enough to judge overlaps without drawing."""
    scale = fig.dpi / 72.0
    return (0.72 * fontsize * len(text) + 2.0) * scale, 1.25 * fontsize * scale


def apart(
    ax: Axes,
    xy: Sequence[tuple[float, float]],
    labels: Sequence[str],
    *,
    fontsize: float,
    offset_pt: tuple[float, float] = (4.0, 4.0),
    order: Sequence[int] | None = None,
) -> list[int]:
    """Which labels can be written at ``xy`` (data coordinates, text at ``offset_pt`` up and right)
    without two overlapping: taken greedily in ``order`` (the most important first), each kept when
    its box clears every box kept before it. Call once the axes' limits are final."""
    ax.get_xlim(), ax.get_ylim()  # settle the autoscaled limits before transforming
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    pts = ax.transData.transform(np.asarray(xy, dtype=float).reshape(-1, 2)) if len(xy) else np.empty((0, 2))
    dx, dy = (o * fig.dpi / 72.0 for o in offset_pt)
    kept: list[int] = []
    boxes: list[tuple[float, float, float, float]] = []
    for i in order if order is not None else range(len(labels)):
        if not labels[i] or not np.isfinite(pts[i]).all():
            continue
        w, h = _text_px(fig, labels[i], fontsize)
        box = (pts[i][0] + dx, pts[i][1] + dy, pts[i][0] + dx + w, pts[i][1] + dy + h)
        if all(box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1] for b in boxes):
            kept.append(i)
            boxes.append(box)
    return sorted(kept)


def thin_ticks(ax: Axes, positions: Sequence[float], labels: Sequence[str], *, fontsize: float) -> None:
    """Category ticks on the x axis that cannot overlap: level when every label fits its slot, else
    upright (rotated 90°) with every k-th labelled so neighbouring labels keep a line apart."""
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    per = ax.get_position().width * fig.get_figwidth() * fig.dpi / max(len(labels), 1)  # px between ticks
    widest = max((_text_px(fig, t, fontsize)[0] for t in labels), default=0.0)
    if widest * 1.1 <= per:
        ax.set_xticks(list(positions), list(labels), fontsize=fontsize)
        return
    step = max(1, int(np.ceil(_text_px(fig, "x", fontsize)[1] * 1.2 / max(per, 1e-9))))
    shown = [t if i % step == 0 else "" for i, t in enumerate(labels)]
    ax.set_xticks(list(positions), shown, rotation=90, fontsize=fontsize)
