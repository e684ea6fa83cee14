"""The client's own health, from run.json's "client" block: whether loadgen itself may have distorted a run.

What the engine measured about itself over a run (or one sweep point): its CPU share, a
loop-lag probe (a timer whose lateness is recorded over the run: ``loop_lag_p99_ms`` and
``loop_lag_max_ms``), an estimate of how late a read is stamped (``read_lateness_p99_ms``),
whether it ran its fast read path, and records it could only write degraded. A run merged
from worker processes gives the busiest worker's figures (the maximum) and the sum of their
counts.

``client_notes`` reads the block into ``(code, message)`` pairs, which
``analysis.validity.client_caveats`` makes caveats of (that module owns the suspect codes);
``health_line`` says the figures in one line for the reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MIN_CPU_WALL_S", "CPU_SATURATED", "LOOP_STALL_MS", "MIN_PROBE_SAMPLES", "client_notes", "health_line"]

MIN_CPU_WALL_S = 1.0  # a point shorter than this is too short for its CPU share to mean anything
CPU_SATURATED = 0.9
LOOP_STALL_MS = 50.0  # one stall this long delays every stream that had bytes waiting
# Below this many probe samples a "p99" is the worst one or two: a single start-up stall, which
# ``client_loop_stall`` judges on its own scale, not the lateness of the run's reads.
MIN_PROBE_SAMPLES = 100


def client_notes(client: Mapping[str, Any], lag_limit_ms: float = 10.0) -> list[tuple[str, str]]:
    """(code, message) for each way the client may have distorted its figures; ``lag_limit_ms``:
    the run's lag limit (``--lag-limit-ms``), which the loop-lag probe's p99 is held to as well."""
    out = _cpu(client)
    if client.get("sends_delayed_by_max_inflight"):
        n = client["sends_delayed_by_max_inflight"]
        out.append(("max_inflight", f"{n} sends waited for --max-inflight: the open loop was capped"))
    out += _loop_lag(client, lag_limit_ms)
    stall = _number(client.get("loop_lag_max_ms"))
    if stall is not None and stall > LOOP_STALL_MS:
        out.append(("client_loop_stall", f"the client's event loop stalled for up to {stall:.0f} ms"))
    degraded = int(client.get("records_degraded") or 0)
    if degraded:
        out.append(
            (
                "writer_degraded",
                f"{degraded} records could not be written whole and were kept in a degraded form "
                "(ids, schedule and status only): their timings are missing",
            )
        )
    return out + _slow_path(client)


def _loop_lag(client: Mapping[str, Any], limit_ms: float) -> list[tuple[str, str]]:
    """client_loop_lag: the probe timer's lateness p99 above the lag limit. A loop that runs that
    late reads (and stamps) the bytes waiting in its sockets that late too. A block that says how
    many samples the probe took (``loop_lag_samples``) is judged only with ``MIN_PROBE_SAMPLES``."""
    p99, n = _number(client.get("loop_lag_p99_ms")), _number(client.get("loop_lag_samples"))
    if p99 is None or p99 <= limit_ms or (n is not None and n < MIN_PROBE_SAMPLES):
        return []
    read = _number(client.get("read_lateness_p99_ms"))
    est = f"; reads were stamped an estimated {read:.1f} ms late at p99" if read is not None else ""
    return [
        (
            "client_loop_lag",
            f"the client's event loop ran late: loop lag p99 is {p99:.1f} ms (limit {limit_ms:g} ms){est}: "
            "chunk and first-token stamps may be late by about that much; result suspect",
        )
    ]


def _cpu(c: Mapping[str, Any]) -> list[tuple[str, str]]:
    """client_cpu, only over a point long enough to tell; the share shown is clamped to 100% of a core."""
    share, wall = float(c.get("cpu_utilisation") or 0.0), float(c.get("wall_seconds") or 0.0)
    if not (share >= CPU_SATURATED and wall >= MIN_CPU_WALL_S):
        return []
    return [
        (
            "client_cpu",
            f"client CPU was saturated ({min(share, 1.0):.0%} of a core over {wall:.1f} s): "
            "timings may include client delay; add --workers or a bigger machine",
        )
    ]


def _slow_path(client: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every process without the client's fast path (each read stamped as it arrives), once per reason."""
    processes = [client, *client.get("workers", [])]
    whys = dict.fromkeys(
        p.get("fast_read_why_not") or "no reason given" for p in processes if p.get("fast_read") is False
    )
    return [
        (
            "slow_path",
            f"the client ran without its fast path ({why}): timing fell back to the slower path, "
            "reads stamped when the request's task got to them and requests prepared at their instant "
            "(so timings include more client delay)",
        )
        for why in whys
    ]


def health_line(client: Mapping[str, Any]) -> str | None:
    """The client's health in one line ("client: CPU 31% of a core over 10.0 s, event-loop lag p99
    7.6 ms (max 20.1 ms), reads stamped ~2.3 ms late at p99"), None when the block says nothing."""
    parts = []
    share, wall = _number(client.get("cpu_utilisation")), _number(client.get("wall_seconds"))
    if share is not None:
        parts.append(f"CPU {share:.0%} of a core" + (f" over {wall:.1f} s" if wall else ""))
    p99, worst = _number(client.get("loop_lag_p99_ms")), _number(client.get("loop_lag_max_ms"))
    if p99 is not None:
        parts.append(f"event-loop lag p99 {p99:.1f} ms" + (f" (max {worst:.1f} ms)" if worst is not None else ""))
    elif worst is not None:
        parts.append(f"event-loop lag max {worst:.1f} ms")
    read = _number(client.get("read_lateness_p99_ms"))
    if read is not None:
        parts.append(f"reads stamped ~{read:.1f} ms late at p99 (estimate)")
    return "client: " + ", ".join(parts) if parts else None


def _number(v: Any) -> float | None:
    """A finite figure of the block, else None (absent, null, or not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        return None
    return float(v)
