"""How much of a timed trace a run replays: all of it, unless ``--duration`` or ``--requests`` cut it.

A trace workload (mooncake, azure, burstgpt: ``Workload.offsets_ns()`` is not None)
carries its own arrival times, already scaled by the spec's ``speed``. A run replays
its whole span by default; ``--duration S`` keeps the requests due before S seconds,
``--requests N`` the first N (both: whichever ends first). ``cut_trace`` is that rule,
used by the plan the engine sends (``client.point.build_plan``) and by the line the
command prints ("replaying 738 of 8,819 requests (cut by --duration 10)"), so the two
never disagree. ``check_trace_limits`` keeps a run's limits (``client.settings``) honest
for a trace: a trace past them is one error naming the flag that cuts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from loadgen.client.settings import MAX_DURATION_S, MAX_REQUESTS
from loadgen.errors import ConfigError

__all__ = ["TraceCut", "cut_trace", "check_trace_limits"]


@dataclass(frozen=True)
class TraceCut:
    """The part of a trace a run replays: ``offsets_ns`` of ``total``; ``cut_by`` names the
    flag that ended it early (``"--duration 10"``, ``"--requests 500"``), None when whole."""

    total: int
    offsets_ns: npt.NDArray[np.int64]
    cut_by: str | None = None

    @property
    def replayed(self) -> int:
        return len(self.offsets_ns)

    @property
    def span_s(self) -> float:
        """Seconds from the first replayed arrival to the last (the sending span)."""
        return float(self.offsets_ns[-1] - self.offsets_ns[0]) / 1e9 if self.replayed else 0.0

    @property
    def mean_rate(self) -> float | None:
        """Mean arrival rate of the replayed part in requests/s (None: fewer than 2, or no span)."""
        span = self.span_s
        return (self.replayed - 1) / span if span > 0 else None

    def line(self, speed: float | None = None) -> str:
        """What the run replays, in words, e.g. ``replaying 738 of 8,819 requests (cut by --duration 10)``."""
        at = f" at {speed:g}x speed" if speed is not None else ""
        over = f" over {self.span_s:,.1f} s{at}"
        if self.cut_by is None:
            return f"replaying all {self.replayed:,} requests{over}"
        return f"replaying {self.replayed:,} of {self.total:,} requests{over} (cut by {self.cut_by})"


def cut_trace(offsets_ns: npt.ArrayLike, duration_s: float | None = None, requests: int | None = None) -> TraceCut:
    """The requests of a trace (sorted int64 ns offsets from 0) that a run replays: those due
    before ``duration_s`` seconds, at most the first ``requests`` (whichever ends first)."""
    offs = np.asarray(offsets_ns, dtype=np.int64)
    total, cut_by = len(offs), None
    if duration_s is not None:
        kept = offs[offs < round(duration_s * 1e9)]
        if len(kept) < len(offs):
            cut_by = f"--duration {duration_s:g}"
        offs = kept
    if requests is not None and requests < len(offs):
        offs, cut_by = offs[:requests], f"--requests {requests:,}"
    return TraceCut(total, offs, cut_by)


def check_trace_limits(cut: TraceCut, *, warmup_s: float = 0.0, cooldown_s: float = 0.0) -> None:
    """A ``ConfigError`` (one line naming the flag that helps) when the replayed part of a trace is
    empty, or longer than a run may be, or its span leaves no measurement window."""
    if not cut.replayed:
        why = f" (cut by {cut.cut_by})" if cut.cut_by else ""
        raise ConfigError(f"no request of the trace's {cut.total:,} is replayed{why}; give a longer --duration")
    if cut.replayed > MAX_REQUESTS:
        raise ConfigError(
            f"the trace holds {cut.replayed:,} requests, more than a run's limit of {MAX_REQUESTS:,}; "
            f"cut it with --requests N or --duration S (or the spec's max_requests / window)"
        )
    if cut.span_s > MAX_DURATION_S:
        raise ConfigError(
            f"the trace spans {cut.span_s / 86_400:,.1f} days, longer than a run's limit of "
            f"{MAX_DURATION_S / 86_400:g} days; cut it with --duration S or replay it faster with --speed X"
        )
    if cut.span_s > 0 and warmup_s + cooldown_s >= cut.span_s:
        raise ConfigError(
            f"--warmup {warmup_s:g} + --cooldown {cooldown_s:g} leave no measurement window "
            f"in the trace's {cut.span_s:.3g} s span"
        )
