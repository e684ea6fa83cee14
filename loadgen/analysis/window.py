"""The measurement window: which requests a summary counts (DESIGN.md, "the contract").

A report counts the requests scheduled inside a window that leaves out warm-up
and cool-down; warm-up is chosen here, at report time, never dropped during the
run. ``choose_window`` is a pure function of the records' ``t_sched`` and the
trims, so the gate, the sweep and every report pick the same window from the
same options. Kept apart from ``metrics`` (which folds the requests inside a
window into numbers) because choosing it needs nothing of the fold.
``MetricsError`` lives here, the first place a figure can be refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa

from loadgen.analysis.columns import Ints, Mask, int_column
from loadgen.errors import ConfigError

__all__ = ["MetricsError", "Window", "choose_window"]


class MetricsError(ConfigError):
    """Records or options that cannot give a meaningful figure (e.g. an empty window)."""


@dataclass(frozen=True)
class Window:
    """The measurement window [start_ns, end_ns) in perf_counter_ns.

    A request is in the window when its t_sched is; throughput counts tokens
    whose chunks arrived in it. ``t0_ns`` (the first t_sched) is the origin for
    the relative times shown in reports.
    """

    start_ns: int
    end_ns: int
    t0_ns: int
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    warmup_requests: int = 0
    cooldown_requests: int = 0
    how: str = ""

    @property
    def length_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def contains(self, t_ns: Ints) -> Mask:
        return (t_ns >= self.start_ns) & (t_ns < self.end_ns)

    def __str__(self) -> str:
        a, b = (self.start_ns - self.t0_ns) / 1e9, (self.end_ns - self.t0_ns) / 1e9
        return f"window {a:.3f}-{b:.3f} s ({self.length_s:.3f} s): {self.how}"


def choose_window(
    table: pa.Table,
    *,
    warmup_s: float = 0.0,
    cooldown_s: float = 0.0,
    warmup_requests: int = 0,
    cooldown_requests: int = 0,
) -> Window:
    """Trim warm-up from the start and cool-down from the end of the schedule span.

    The span runs from the first t_sched to the last plus one mean gap, so with
    no trimming every request is inside and a constant rate r gives an offered
    rate of exactly r. Time and count trims combine (the stricter wins); count
    trims follow t_sched order. A zero span (one request) gives
    [t_sched, last completion]. When requests were scheduled after the last instant
    any record holds (a run stopped early: they are ``not_sent`` and nothing about
    them was observed), the window ends at that instant: a request scheduled inside
    it was observed for its whole wait, so it counts, censored, as a miss.
    """
    _check_trims(warmup_s, cooldown_s, warmup_requests, cooldown_requests)
    window = partial(  # every window records the trims asked for
        Window,
        warmup_s=warmup_s,
        cooldown_s=cooldown_s,
        warmup_requests=warmup_requests,
        cooldown_requests=cooldown_requests,
    )
    ts = np.sort(int_column(table, "t_sched")[0])
    n = ts.size
    if n == 0:
        return window(0, 0, 0, how="no requests")
    if warmup_requests + cooldown_requests >= n:
        raise MetricsError(
            f"warm-up ({warmup_requests}) + cool-down ({cooldown_requests}) requests "
            f"leave none of the {n} requests to measure"
        )
    first, last = int(ts[0]), int(ts[-1])
    if last == first:
        done = [int(v.max()) for k in ("t_done", "t_last") if (v := _valid(table, k)).size]
        return window(first, max([first + 1, *done]), first, how="one scheduled instant: until the last completion")
    span_end = last + (last - first) // (n - 1)
    start = first + round(warmup_s * 1e9)
    if warmup_requests:
        start = max(start, int(ts[warmup_requests]))
    end = span_end - round(cooldown_s * 1e9)
    if cooldown_requests:
        end = min(end, int(ts[n - cooldown_requests]))
    seen = _observed_end(table)
    cut = start < seen < min(last, end)  # (a cut that would leave no window is not made)
    if cut:
        end = seen
    if end <= start:
        raise MetricsError(
            f"warm-up and cool-down leave no measurement window: the schedule spans {(span_end - first) / 1e9:.3f} s"
        )
    how = (
        f"requests scheduled in the window; warm-up {warmup_s:g} s / {warmup_requests} req, "
        f"cool-down {cooldown_s:g} s / {cooldown_requests} req"
    )
    if cut:
        how += f"; cut at the end of observation ({int((ts >= seen).sum())} requests scheduled after it)"
    return window(start, end, first, how=how)


def _check_trims(warmup_s: float, cooldown_s: float, warmup_requests: int, cooldown_requests: int) -> None:
    for name, v in (("warmup_s", warmup_s), ("cooldown_s", cooldown_s)):
        if not (math.isfinite(v) and v >= 0):
            raise MetricsError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
    for name, k in (("warmup_requests", warmup_requests), ("cooldown_requests", cooldown_requests)):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise MetricsError(f"{name} must be an integer >= 0, got {k!r}")


def _observed_end(table: pa.Table) -> int:
    """The latest send, first/last chunk or end any record holds (0 when none)."""
    ends = [int(v.max()) for k in ("t_sent", "t_first", "t_last", "t_done") if (v := _valid(table, k)).size]
    return max(ends, default=0)


def _valid(table: pa.Table, name: str) -> Ints:
    vals, ok = int_column(table, name)
    return vals[ok]
