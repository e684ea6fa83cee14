"""Where a load point is past saturation: the endpoint no longer delivers what is offered.

One test, used twice: the sweep's search stops ramping on it, and the report of a
finished sweep names the first saturated point with it. Both read a point through
``observe``, a pure function of its Summary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadgen.analysis.metrics import Summary

__all__ = ["KEEP_UP", "MIN_GAIN", "Observation", "observe", "saturation_reason", "first_saturated"]

KEEP_UP = 0.9  # delivered / offered below this: the endpoint is not keeping up
MIN_GAIN = 0.1  # throughput rising less than this while the load rose 1.5x: saturated


@dataclass(frozen=True)
class Observation:
    """What the search needs from one measured point (built from its Summary by ``observe``)."""

    rate: float  # target offered rate, req/s
    offered_rps: float
    completed_rps: float
    output_tps: float
    expected_output_tps: float  # offered x mean requested output tokens; NaN when unknown
    ttft_p50_ms: float
    lag_p99_ms: float
    failed_pct: float
    met: int | None = None  # requests that met every SLO bound (None without an SLO)
    n: int = 0  # requests scheduled in the window
    client_limited: bool = False

    @property
    def keep_up_ratio(self) -> float:
        """Fraction of the offered load the endpoint delivered (tokens when known, else requests)."""
        if self.expected_output_tps > 0 and math.isfinite(self.expected_output_tps):
            return self.output_tps / self.expected_output_tps
        if self.offered_rps > 0:
            return self.completed_rps / self.offered_rps
        return math.nan

    @property
    def attainment(self) -> float | None:
        return None if self.met is None or self.n == 0 else self.met / self.n


def observe(summary: Summary, rate: float, lag_limit_ms: float = 10.0) -> Observation:
    """The search's view of a point: throughput delivered vs offered, latency, SLO counts."""
    s = summary
    requested = s.output_requested_mean
    expected = s.offered_rps * requested if requested == requested else math.nan
    lag = s.schedule_lag.pct(99)[0] if s.schedule_lag.n else math.nan
    # The search stops on a client that is behind on most sends (the median), not on a few late ones
    # (a busy host delays single sends by ~10 ms; validity warnings still flag the p99).
    lag50 = s.schedule_lag.pct(50)[0] if s.schedule_lag.n >= 10 else math.nan
    return Observation(
        rate=rate,
        offered_rps=s.offered_rps,
        completed_rps=s.completed_rps,
        output_tps=s.output_tps,
        expected_output_tps=expected,
        ttft_p50_ms=s.ttft.pct(50)[0] if s.ttft.n else math.nan,
        lag_p99_ms=lag,
        failed_pct=100.0 * s.failed / s.requests if s.requests else 0.0,
        met=s.slo_met,
        n=s.requests,
        client_limited=bool(lag50 == lag50 and lag50 > lag_limit_ms),
    )


def saturation_reason(
    prev: Observation | None, cur: Observation, keep_up: float = KEEP_UP, min_gain: float = MIN_GAIN
) -> str | None:
    """Why ``cur`` is past saturation, or None while throughput still follows the load."""
    ratio = cur.keep_up_ratio
    if ratio == ratio and ratio < keep_up:
        return f"delivered {ratio:.0%} of the offered load at {cur.rate:g} req/s (TTFT p50 {cur.ttft_p50_ms:.0f} ms)"
    if cur.failed_pct >= 10:
        return f"{cur.failed_pct:.0f}% of requests failed at {cur.rate:g} req/s (rejecting load)"
    if prev is not None and cur.rate >= 1.5 * prev.rate and prev.output_tps > 0:
        gain = cur.output_tps / prev.output_tps - 1
        if gain < min_gain and cur.ttft_p50_ms > prev.ttft_p50_ms:
            return (
                f"output tok/s rose only {gain:+.0%} from {prev.rate:g} to {cur.rate:g} req/s "
                f"while TTFT p50 climbed {prev.ttft_p50_ms:.0f} -> {cur.ttft_p50_ms:.0f} ms"
            )
    return None


def first_saturated(
    ramp: list[Observation], keep_up: float = KEEP_UP, min_gain: float = MIN_GAIN
) -> tuple[int, str] | None:
    """(index, reason) of the first saturated point of ``ramp`` (by rising load), or None."""
    for i, obs in enumerate(ramp):
        reason = saturation_reason(ramp[i - 1] if i else None, obs, keep_up, min_gain)
        if reason:
            return i, reason
    return None
