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
