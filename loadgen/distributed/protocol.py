"""The custom messages a loadgen master and its workers exchange over Locust's control channel, and their timing.

Locust's own protocol (ZeroMQ, msgpack) carries the connection, its heartbeats (a worker
that sends none for about ``HEARTBEAT_LOST_S`` is *missing*) and these custom messages
(``runner.register_message`` / ``runner.send_message``). Every message is a plain msgpack
value: the one exception is the job a master hands its workers (``PREPARE``'s ``job``),
pickled, since a worker runs what its master tells it (as a Locust worker runs its master's
locustfile); nothing a worker sends is ever unpickled.

master -> worker: ``PING`` {seq} (answered at once by ``PONG`` {seq, wall_ns}); ``TICK``
every ``TICK_S`` (the master is alive); ``PREPARE`` {point, shard, shards, job};
``START`` {point, start_wall_ns (the worker's wall clock), start_perf_ns (the master's
monotonic start)}; ``ORDER`` {kind, reason} (stop / cut, as ``loadgen.lifeline``'s).

worker -> master: ``HELLO`` {host, pid, cpus, version}; ``READY`` {point, shard, engine_pid};
``RECORDS`` {point, shard, schema (bytes, first chunk only), messages [bytes], rows};
``LIVE`` {point, shard, counters}; ``DONE`` {point, shard, client, error, cpu_seconds}.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadgen.client.config import LiveCounters

__all__ = [
    "PING",
    "PONG",
    "TICK",
    "HELLO",
    "PREPARE",
    "READY",
    "START",
    "RECORDS",
    "LIVE",
    "DONE",
    "ORDER",
    "TICK_S",
    "MASTER_SILENCE_S",
    "MASTER_GONE_S",
    "RELAY_S",
    "START_MARGIN_S",
    "READY_TIMEOUT_S",
    "HEARTBEAT_LOST_S",
    "DEFAULT_PORT",
    "EXIT_MASTER_LOST",
    "live_data",
    "live_counters",
    "STREAM_FILE",
]

PING, PONG, TICK, HELLO = "loadgen_ping", "loadgen_pong", "loadgen_tick", "loadgen_hello"
PREPARE, READY, START, ORDER = "loadgen_prepare", "loadgen_ready", "loadgen_start", "loadgen_order"
RECORDS, LIVE, DONE = "loadgen_records", "loadgen_live", "loadgen_done"

DEFAULT_PORT = 5557  # Locust's own default master port
TICK_S = 0.2  # the master's "alive" to its workers
MASTER_SILENCE_S = 0.8  # a worker whose master said nothing this long stops its engine at once
MASTER_GONE_S = 10.0  # ... and, between points, gives up on it
RELAY_S = 0.25  # how often a worker reads its engine's new records and sends them home
START_MARGIN_S = 0.5  # the common start lies this far ahead of the moment the master fixes it
READY_TIMEOUT_S = 120.0  # a worker's engine that has not started by then is lost
HEARTBEAT_LOST_S = 4.0  # Locust's: a worker missing 3 heartbeats of 1 s is marked missing
EXIT_MASTER_LOST = 3  # a worker's exit status when its master went silent mid-point
STREAM_FILE = "records.arrows"  # the engine process's records, in its point's folder on the worker

_SAMPLES = ("recent_ttft_ms", "recent_itl_ms", "recent_lag_ms")
_INSTANTS = ("start_ns", "stop_ns")  # perf_counter_ns instants (0: not yet), moved onto the master's clock


def live_data(counters: LiveCounters, shift_ns: int) -> dict[str, Any]:
    """A worker's counters as plain data, their instants on the master's clock."""
    d = dict(vars(counters))
    for k in _SAMPLES:
        d[k] = [float(x) for x in d[k]]
    for k in _INSTANTS:
        if d[k]:
            d[k] += shift_ns
    return d


def live_counters(data: dict[str, Any]) -> LiveCounters:
    """``live_data``'s counters back, for the live view; unknown keys (a newer worker's) are dropped."""
    from loadgen.client.config import LiveCounters  # the command's side only: workers never need it

    known = set(vars(LiveCounters()))
    kept = {k: v for k, v in data.items() if k in known}
    for k in _SAMPLES:
        if k in kept:
            kept[k] = deque((float(x) for x in kept[k]), maxlen=max(len(kept[k]), 1))
    return LiveCounters(**kept)
