"""What the live views show, as figures: counters merged over worker processes, and where a point stands.

An engine counts (``LiveCounters``); with ``--workers`` each worker process sends a
``LiveCounters.snapshot()`` to its parent twice a second, and ``merge_live`` sums
them into one ``LiveSnapshot``, as it does the one engine of a run in one process.
``progress`` says how far the point is (elapsed, remaining, or draining) from a
``Horizon``, the plan's length: the engine's last scheduled send when it knows it,
else the run's duration, or its request count at its rate. Every figure here is
provisional; the records decide the final ones. Nothing here reads a clock: the
views pass ``now_ns`` (``perf_counter_ns``, the engines' clock).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from loadgen.client.config import LiveCounters
from loadgen.client.settings import RunSettings

__all__ = [
    "LiveSnapshot",
    "merge_live",
    "Horizon",
    "horizon_of",
    "Progress",
    "progress",
    "duration_text",
    "pct",
    "pcts",
]


@dataclass(frozen=True)
class LiveSnapshot:
    """The counters of one point, summed over the engines (worker processes) that send it."""

    engines: int = 0  # how many engines this merges (workers that have reported)
    scheduled: int = 0
    sent: int = 0
    inflight: int = 0
    done: int = 0
    errors: int = 0
    not_sent: int = 0
    capped: int = 0
    output_tokens: int = 0
    troubles: int = 0  # housekeeping, writer and internal errors of the engines
    last_error: str = ""
    loop_lag_max_ms: float = 0.0
    start_ns: int = 0  # the shared start instant (0: not started)
    span_ns: int | None = None  # the last scheduled send's offset, when every engine knows it
    stop_ns: int = 0  # the first engine.stop() (0: not stopped)
    ttft_ms: tuple[float, ...] = ()
    itl_ms: tuple[float, ...] = ()
    lag_ms: tuple[float, ...] = ()


def merge_live(snapshots: Iterable[LiveCounters]) -> LiveSnapshot:
    """One snapshot of several engines: counts summed, recent samples pooled, the latest span and
    the earliest start and stop."""
    snaps = list(snapshots)
    if not snaps:
        return LiveSnapshot()
    starts = [s.start_ns for s in snaps if s.start_ns]
    stops = [s.stop_ns for s in snaps if s.stop_ns]
    spans = [s.span_ns for s in snaps]
    return LiveSnapshot(
        engines=len(snaps),
        scheduled=sum(s.scheduled for s in snaps),
        sent=sum(s.sent for s in snaps),
        inflight=sum(s.inflight for s in snaps),
        done=sum(s.done for s in snaps),
        errors=sum(s.errors for s in snaps),
        not_sent=sum(s.not_sent for s in snaps),
        capped=sum(s.capped for s in snaps),
        output_tokens=sum(s.output_tokens for s in snaps),
        troubles=sum(s.housekeeping_errors + s.writer_errors + s.internal_errors for s in snaps),
        last_error=next((s.last_error for s in reversed(snaps) if s.last_error), ""),
        loop_lag_max_ms=max(s.loop_lag_max_ms for s in snaps),
        start_ns=min(starts, default=0),
        span_ns=None if any(x is None for x in spans) else max(x for x in spans if x is not None),
        stop_ns=min(stops, default=0),
        ttft_ms=tuple(x for s in snaps for x in list(s.recent_ttft_ms)),
        itl_ms=tuple(x for s in snaps for x in list(s.recent_itl_ms)),
        lag_ms=tuple(x for s in snaps for x in list(s.recent_lag_ms)),
    )


@dataclass(frozen=True)
class Horizon:
    """How long a point sends, as planned: ``send_s`` of sending (None: unknown, or a closed
    loop that ends at ``requests``), then at most ``drain_s``. ``exact`` is False when
    ``send_s`` is an estimate (a request count at a random arrival rate)."""

    send_s: float | None
    drain_s: float
    requests: int | None = None
    exact: bool = True


def horizon_of(settings: RunSettings) -> Horizon:
    """The plan's length from a run's settings: its duration, or its request count at its rate
    (whichever ends first); a closed loop given only a count ends at the count."""
    a, duration, count = settings.arrival, settings.duration_s, settings.requests
    by_count = count / a.rate if count is not None and a.rate else None
    if by_count is not None and (duration is None or by_count < duration):
        return Horizon(by_count, settings.drain_s, count, exact=a.kind == "constant")
    return Horizon(duration, settings.drain_s, count)


@dataclass(frozen=True)
class Progress:
    """Where a point stands: ``phase`` is "starting", "sending", "draining" or "stopping" (a stop
    was asked); ``left_s`` is what remains of that phase (None: unknown), ``about`` when estimated,
    and a drain's ``left_s`` is an upper bound (it ends when the last answer does)."""

    phase: str
    elapsed_s: float
    left_s: float | None
    about: bool = False
    send_s: float | None = None  # the sending span it is measured against

    @property
    def fraction(self) -> float | None:
        if self.phase != "sending" or not self.send_s:
            return None
        return min(max(self.elapsed_s / self.send_s, 0.0), 1.0)


def progress(snap: LiveSnapshot, horizon: Horizon, now_ns: int) -> Progress:
    """Elapsed and remaining time of the point ``snap`` counts, planned as ``horizon``."""
    if not snap.start_ns or now_ns < snap.start_ns:
        return Progress("starting", 0.0, None)
    elapsed = (now_ns - snap.start_ns) / 1e9
    if snap.stop_ns:
        drained = max(now_ns - snap.stop_ns, 0) / 1e9
        return Progress("stopping", elapsed, max(horizon.drain_s - drained, 0.0))
    span = snap.span_ns / 1e9 if snap.span_ns is not None else horizon.send_s
    exact = snap.span_ns is not None or horizon.exact
    if span is not None:
        if elapsed < span:
            return Progress("sending", elapsed, span - elapsed, about=not exact, send_s=span)
        return Progress("draining", elapsed, max(horizon.drain_s - (elapsed - span), 0.0), send_s=span)
    if horizon.requests and snap.done:  # a closed loop that ends at its count: at the pace so far
        left = max(horizon.requests - snap.done, 0) * elapsed / snap.done
        return Progress("sending", elapsed, left, about=True, send_s=elapsed + left)
    return Progress("sending", elapsed, None)


def duration_text(seconds: float | None) -> str:
    """12.3 s, 4 min 05 s, 2 h 03 min; "?" when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(seconds, 0.0)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def pct(values: tuple[float, ...], p: float) -> float | None:
    """The p-th percentile of recent samples (None with none)."""
    return float(np.percentile(np.asarray(values, dtype=float), p)) if values else None


def pcts(values: tuple[float, ...], *ps: float) -> str:
    """ "p50 / p99" of recent samples, to 0.1 (ms); "-" with none."""
    if not values:
        return "-"
    return " / ".join(f"{pct(values, p):.1f}" for p in ps)
