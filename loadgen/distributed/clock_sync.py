"""The workers' clocks against the master's: offsets measured by ping exchanges, and one start instant.

Each worker times everything on its own monotonic clock (``perf_counter_ns``); what the
master and its workers share is the wall clock, and wall clocks of two machines differ by
whatever NTP left between them. So at connect (and again before each point) the master
pings each worker a few times over the control channel: it reads its wall clock as it
sends (``sent_ns``), the worker answers with its own (``worker_ns``) and the master reads
its clock again as the answer arrives (``received_ns``). Assuming the answer was read
half-way, the worker's clock is ahead of the master's by ``worker_ns - (sent_ns +
received_ns) / 2``, within half the round trip; the exchange with the shortest round trip
gives the estimate (``estimate_offset``).

The master fixes a start instant on its wall clock a margin ahead and tells each worker
that instant in the worker's wall clock (``start_wall_ns + offset``); the worker maps it
onto its own monotonic clock (``to_monotonic``) at once. A worker's records are then moved
onto the master's monotonic clock by one constant (``shift_ns``: the master's monotonic
start minus the worker's), so the merged records read as one process's would: every
request's ``t_sched`` is the master's start plus its offset in the schedule, and every
latency, a difference of two stamps of one worker's clock, is exactly as that worker
measured it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "PING_COUNT",
    "PingSample",
    "ClockOffset",
    "estimate_offset",
    "to_monotonic",
    "offset_warning",
    "GAP_SHARE",
]

PING_COUNT = 8  # exchanges per estimate: the shortest round trip of these decides
GAP_SHARE = 0.1  # an uncertainty above this share of the schedule's mean gap (or of the lag limit) is warned of


class PingSample(NamedTuple):
    """One exchange, on wall clocks: the master's send and receipt, the worker's reading between."""

    sent_ns: int
    worker_ns: int
    received_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.received_ns - self.sent_ns


@dataclass(frozen=True)
class ClockOffset:
    """How far a worker's wall clock is ahead of the master's (``offset_ns``), within ``uncertainty_ns``."""

    offset_ns: int
    uncertainty_ns: int
    samples: int

    def json(self) -> dict[str, Any]:
        return {
            "clock_offset_ms": self.offset_ns / 1e6,
            "clock_uncertainty_ms": self.uncertainty_ns / 1e6,
            "clock_samples": self.samples,
        }


def estimate_offset(samples: Iterable[PingSample]) -> ClockOffset:
    """The offset from the exchange with the shortest round trip; its uncertainty is half that trip.
    No sample (every ping lost) is a ValueError."""
    found = [s for s in samples if s.rtt_ns >= 0]
    if not found:
        raise ValueError("no ping exchange came back")
    best = min(found, key=lambda s: s.rtt_ns)
    midpoint = best.sent_ns + best.rtt_ns // 2
    return ClockOffset(best.worker_ns - midpoint, (best.rtt_ns + 1) // 2, len(found))


def to_monotonic(start_wall_ns: int, wall_now_ns: int, perf_now_ns: int) -> int:
    """The instant ``start_wall_ns`` (this machine's wall clock) on this machine's monotonic clock,
    from one reading of both clocks taken together."""
    return perf_now_ns + (start_wall_ns - wall_now_ns)


def offset_warning(offsets: Mapping[int, ClockOffset], rate: float | None, lag_limit_ms: float) -> str | None:
    """One line when a worker's clock uncertainty is large against the schedule: above ``GAP_SHARE``
    of its mean gap between sends (``1 / rate``), or of the lag limit. None when all is well."""
    if not offsets:
        return None
    shard, worst = max(offsets.items(), key=lambda kv: kv[1].uncertainty_ns)
    u_ms = worst.uncertainty_ns / 1e6
    limits = [("the lag limit", lag_limit_ms)]
    if rate:
        limits.append(("the schedule's mean gap", 1e3 / rate))
    for what, ms in limits:
        if u_ms > GAP_SHARE * ms:
            return (
                f"worker {shard}'s clock offset is known only to within {u_ms:.2f} ms, large against {what} "
                f"({ms:.2f} ms): its sends may be misaligned with the other workers' by up to that much"
            )
    return None
