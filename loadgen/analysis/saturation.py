"""Where a load point is past saturation: the endpoint no longer delivers what is offered.

One test, used twice: the sweep's search stops ramping on it, and the report of a
finished sweep names the first saturated point with it. Both read a point through
``observe``, a pure function of its Summary (and its client's health figures).

A point is called saturated only on evidence: it is not suspect (``validity``: a client
that fell behind, an interrupted point, ... say nothing about the endpoint), its window
holds at least ``MIN_REQUESTS`` requests, and a shortfall (delivered below ``KEEP_UP`` of
the offered load, or >= 10% failed) holds at its one-sided 95% bound. With short windows
a light point's few requests made delivered/offered look short (a 1 s window at 4 req/s:
3 requests, "delivered 24%", TTFT p50 17 ms). The floor and the bound count requests
*scheduled* in the window, with the output they delivered, not completed requests: past
saturation few complete inside it (2 of 134 at an overloaded vLLM point), while the
tokens all of them delivered still measure the shortfall.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loadgen.analysis.distributions import beta_ppf, chi2_ppf
from loadgen.analysis.metrics import Summary
from loadgen.analysis.validity import VALID, Validity, client_caveats, summary_caveats

__all__ = [
    "KEEP_UP",
    "MIN_GAIN",
    "MIN_REQUESTS",
    "Observation",
    "observe",
    "saturation_reason",
    "first_saturated",
]

KEEP_UP = 0.9  # delivered / offered below this: the endpoint is not keeping up
MIN_GAIN = 0.1  # throughput rising less than this while the load rose 1.5x: saturated
MIN_REQUESTS = 20  # requests in the window below which no point is called saturated


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
    n: int = 0  # requests scheduled in the window (0: not known, as in an observation made by hand)
    client_limited: bool = False
    validity: Validity = VALID

    @property
    def judgeable(self) -> bool:
        """Enough evidence to call saturation on: not suspect (``few_samples`` aside) and, when
        the count is known, at least ``MIN_REQUESTS`` requests in the window."""
        return not self.validity.withholding.suspect and not (0 < self.n < MIN_REQUESTS)

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


def observe(
    summary: Summary,
    rate: float,
    lag_limit_ms: float = 10.0,
    *,
    client: Mapping[str, Any] | None = None,
    validity: Validity | None = None,
) -> Observation:
    """The search's view of a point: throughput delivered vs offered, latency, SLO counts.

    ``client``: the point's run.json client block (its CPU share and --max-inflight waits make
    the client the limit); ``validity``: the point's, when already known (else from the summary
    and the client).
    """
    s = summary
    client_codes = {c.code for c in client_caveats(client or {}, lag_limit_ms)}
    if validity is None:
        validity = Validity.of(
            summary_caveats(s, lag_p99_limit_ms=lag_limit_ms) + client_caveats(client or {}, lag_limit_ms)
        )
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
        client_limited=bool(lag50 == lag50 and lag50 > lag_limit_ms)
        or bool({"client_cpu", "max_inflight"} & client_codes),
        validity=validity,
    )


def saturation_reason(
    prev: Observation | None, cur: Observation, keep_up: float = KEEP_UP, min_gain: float = MIN_GAIN
) -> str | None:
    """Why ``cur`` is past saturation, or None while throughput still follows the load (or
    ``cur`` is not ``judgeable``; ``prev``, the previous judgeable point, for the gain test)."""
    if not cur.judgeable:
        return None
    ratio = cur.keep_up_ratio
    if ratio == ratio and ratio < keep_up and _surely_below(ratio * cur.n, cur.n, keep_up):
        return f"delivered {ratio:.0%} of the offered load at {cur.rate:g} req/s (TTFT p50 {cur.ttft_p50_ms:.0f} ms)"
    if cur.failed_pct >= 10 and _surely_above(cur.failed_pct / 100 * cur.n, cur.n, 0.1):
        return f"{cur.failed_pct:.0f}% of requests failed at {cur.rate:g} req/s (rejecting load)"
    if prev is not None and cur.rate >= 1.5 * prev.rate and prev.output_tps > 0:
        gain = cur.output_tps / prev.output_tps - 1
        if gain < min_gain and cur.ttft_p50_ms > prev.ttft_p50_ms:
            return (
                f"output tok/s rose only {gain:+.0%} from {prev.rate:g} to {cur.rate:g} req/s "
                f"while TTFT p50 climbed {prev.ttft_p50_ms:.0f} -> {cur.ttft_p50_ms:.0f} ms"
            )
    return None


def _surely_below(served: float, n: int, share: float) -> bool:
    """The requests' worth of output delivered, ``served`` of ``n`` offered, is below ``share`` of
    them even at its one-sided 95% upper (Poisson) bound: a shortfall, not the noise of a few
    requests or of a window's edges. ``n`` 0 (not known): the point estimate alone."""
    if n <= 0:
        return True
    return float(chi2_ppf(0.95, 2 * served + 2)) / 2 < share * n


def _surely_above(failed: float, n: int, share: float) -> bool:
    """``failed`` of ``n`` is above ``share`` even at its one-sided 95% lower (Clopper-Pearson) bound."""
    if n <= 0:
        return True
    k = round(failed)
    return k > 0 and float(beta_ppf(0.05, k, n - k + 1)) >= share


def first_saturated(
    ramp: list[Observation], keep_up: float = KEEP_UP, min_gain: float = MIN_GAIN
) -> tuple[int, str] | None:
    """(index, reason) of the first saturated point of ``ramp`` (by rising load), or None.

    A point that is not judgeable is never called saturated, nor the baseline of the next one's gain.
    """
    prev = None
    for i, obs in enumerate(ramp):
        reason = saturation_reason(prev, obs, keep_up, min_gain)
        if reason:
            return i, reason
        if obs.judgeable:
            prev = obs
    return None
