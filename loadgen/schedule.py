"""Arrival processes: when each request is meant to be sent.

A schedule is a pure function of (arrival spec, seed): the engine asks for the
array of intended send offsets before the run, so the n-th request's planned
time is fixed up front and latency is measured from it (no coordinated
omission). Nothing here reads a clock, and the same inputs give the same array
in any process on any machine, which is what makes a bake-off fair and a CI gate
repeatable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loadgen.errors import ConfigError

__all__ = [
    "KINDS",
    "Arrival",
    "ScheduleError",
    "parse_arrival",
    "offsets_ns",
    "shard_indices",
]

KINDS = ("constant", "poisson", "gamma", "closed", "trace")

# Mixed into the user's seed so the schedule's random stream is independent of
# the workload's, even though both are keyed by the same --seed.
_STREAM_TAG = 0x5C4ED01E
# Gaps are drawn in blocks this big; draws are sequential in the generator, so the
# block size never changes the result, only the memory held at once.
_BLOCK = 1 << 16
# A schedule longer than this is almost surely a typo (rate or duration); it is also
# what one int64 array may hold here without a second thought (1.6 GB). A run has a
# tighter cap of its own (client.settings.MAX_REQUESTS).
MAX_REQUESTS = 200_000_000
# Offsets are int64 nanoseconds: a duration must fit (292 years; a run caps it far lower).
_MAX_DURATION_S = (2**63 - 1) / 1e9


class ScheduleError(ConfigError):
    """An arrival spec or schedule request that cannot be honoured."""


def _positive_finite(value: float | None) -> bool:
    return (
        value is not None
        and not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and value > 0
    )


@dataclass(frozen=True)
class Arrival:
    """How requests arrive: an open-loop process at ``rate`` req/s, closed loop, or a trace.

    Validated at construction so a contradictory spec (a rate together with a
    concurrency cap, which silently turns an open loop closed at saturation) is
    rejected before any traffic is sent. ``trace``: the workload carries its own
    arrival times (``Workload.offsets_ns()``), replayed ``speed`` times as fast as
    recorded; ``rate``, when given, is their mean (a label: nothing is drawn from it).
    """

    kind: str
    rate: float | None = None
    cv: float | None = None
    concurrency: int | None = None
    speed: float | None = None  # trace only: 2.0 replays the trace twice as fast (gaps halved)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(f"arrival kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        if self.speed is not None and self.kind != "trace":
            raise ScheduleError(f"speed applies only to a trace's own arrival times, not to {self.kind}")
        if self.kind == "closed":
            self._check_closed()
        elif self.kind == "trace":
            self._check_trace()
        else:
            self._check_open()

    def _check_closed(self) -> None:
        c = self.concurrency
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ScheduleError(f"closed loop needs concurrency >= 1 (an integer), got {c!r}")
        if self.rate is not None:
            raise ScheduleError("closed loop takes a concurrency, not a rate; drop the rate")
        if self.cv is not None:
            raise ScheduleError("cv applies only to gamma arrivals, not to a closed loop")

    def _check_trace(self) -> None:
        if self.rate is not None and not _positive_finite(self.rate):
            raise ScheduleError(f"a trace's mean rate must be a finite number > 0 requests/s, got {self.rate!r}")
        if self.speed is not None and not _positive_finite(self.speed):
            raise ScheduleError(f"trace speed must be a finite number > 0, got {self.speed!r}")
        if self.cv is not None or self.concurrency is not None:
            raise ScheduleError("a trace carries its own arrival times: it takes no cv or concurrency")

    def _check_open(self) -> None:
        if self.rate is None:
            raise ScheduleError(f"{self.kind} arrivals need a rate in requests/s (e.g. --rate 10)")
        if not _positive_finite(self.rate):
            raise ScheduleError(f"rate must be a finite number > 0 requests/s, got {self.rate!r}")
        if self.concurrency is not None:
            raise ScheduleError(
                f"{self.kind} is open loop: a concurrency cap would close it at saturation; "
                "give either a rate or a concurrency (closed loop), not both"
            )
        if self.kind == "gamma":
            if not _positive_finite(self.cv):
                raise ScheduleError(
                    f"gamma arrivals need a coefficient of variation cv > 0 (e.g. gamma:2.0), got {self.cv!r}"
                )
        elif self.cv is not None:
            raise ScheduleError(f"cv applies only to gamma arrivals, not to {self.kind}")

    def __str__(self) -> str:
        if self.kind == "closed":
            return f"closed loop, concurrency {self.concurrency}"
        if self.kind == "trace":
            speed = f"{self.speed:g}x" if self.speed is not None else "recorded"
            mean = f", mean {self.rate:.3g} req/s" if self.rate is not None else ""
            return f"trace replay at {speed} speed{mean}"
        head = f"gamma(cv={self.cv:g})" if self.kind == "gamma" else self.kind
        return f"{head} @ {self.rate:g} req/s"


def parse_arrival(text: str, rate: float | None = None, concurrency: int | None = None) -> Arrival:
    """Build an Arrival from a CLI string: ``constant``, ``poisson``, ``gamma:CV``, ``closed``.

    ``closed:N`` is accepted as shorthand for ``closed`` with concurrency N.
    """
    spec = text.strip().lower()
    head, sep, arg = spec.partition(":")
    cv: float | None = None
    if head == "gamma":
        if not sep or not arg:
            raise ScheduleError("gamma arrivals need a cv, e.g. 'gamma:2.0'")
        cv = _parse_number(arg, "gamma cv", text)
    elif head == "closed" and sep:
        n = _parse_number(arg, "closed-loop concurrency", text)
        if not n.is_integer():
            raise ScheduleError(f"closed-loop concurrency must be an integer, got {arg!r}")
        if concurrency is not None and concurrency != int(n):
            raise ScheduleError(f"{text!r} contradicts concurrency {concurrency}")
        concurrency = int(n)
    elif sep:
        raise ScheduleError(f"arrival {text!r}: {head} takes no ':' argument")
    return Arrival(kind=head, rate=rate, cv=cv, concurrency=concurrency)


def _parse_number(arg: str, what: str, text: str) -> float:
    try:
        return float(arg)
    except ValueError:
        raise ScheduleError(f"arrival {text!r}: {what} {arg!r} is not a number") from None


def offsets_ns(
    arrival: Arrival,
    seed: int,
    *,
    duration_s: float | None = None,
    count: int | None = None,
) -> np.ndarray:
    """Intended send times (int64 ns from the run start), non-decreasing.

    Give ``duration_s`` (every offset is < duration), ``count`` (that many
    requests), or both (whichever ends first). The same (arrival, seed) always
    gives the same stream, so a duration-bounded schedule is a prefix of a longer
    one with the same seed.
    """
    if arrival.kind == "closed":
        raise ScheduleError("a closed loop has no schedule: the engine issues a request when one completes")
    if arrival.kind == "trace":
        raise ScheduleError("a trace's arrival times come with its workload (Workload.offsets_ns()), not from here")
    limit_ns, n_max = _bounds(arrival, duration_s, count)
    if arrival.kind == "constant":
        return _constant(arrival.rate, limit_ns, n_max)  # type: ignore[arg-type]
    return _random(arrival, seed, limit_ns, n_max)


def _bounds(arrival: Arrival, duration_s: float | None, count: int | None) -> tuple[int, int]:
    """(exclusive end in ns or -1 for none, maximum number of requests)."""
    if duration_s is None and count is None:
        raise ScheduleError("a schedule needs a duration, a request count, or both")
    n_max = MAX_REQUESTS
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ScheduleError(f"request count must be an integer >= 0, got {count!r}")
        n_max = int(count)
    limit_ns = -1
    if duration_s is not None:
        if not (isinstance(duration_s, (int, float)) and 0 <= duration_s < _MAX_DURATION_S):
            raise ScheduleError(f"duration must be a finite number of seconds >= 0, got {duration_s!r}")
        limit_ns = round(duration_s * 1e9)
        expected = duration_s * arrival.rate  # type: ignore[operator]
        if count is None and expected > MAX_REQUESTS:
            raise ScheduleError(
                f"{arrival} for {duration_s:g} s is ~{expected:.3g} requests "
                f"(limit {MAX_REQUESTS}); check the rate and duration"
            )
    return limit_ns, n_max


def _constant(rate: float, limit_ns: int, n_max: int) -> np.ndarray:
    """Offset k is round(k * 1e9 / rate), computed from k so no drift accumulates."""
    n = n_max
    if limit_ns >= 0:
        n = min(n, math.ceil(limit_ns * rate / 1e9) + 1)
    k = np.arange(n, dtype=np.int64)
    out = np.rint(k.astype(np.float64) * 1e9 / rate).astype(np.int64)
    if limit_ns >= 0:
        out = out[out < limit_ns]
    return out


def _random(arrival: Arrival, seed: int, limit_ns: int, n_max: int) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps, drawn in blocks from one seeded stream.

    Each gap is rounded to whole ns before summing, so the integer cumulative sum
    is exact and independent of where the blocks are cut.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ScheduleError(f"seed must be an integer >= 0, got {seed!r}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), _STREAM_TAG]))
    rate = float(arrival.rate)  # type: ignore[arg-type]
    if arrival.kind == "poisson":
        mean_ns = 1e9 / rate

        def draw(size: int) -> np.ndarray:
            return rng.standard_exponential(size) * mean_ns
    else:
        shape = 1.0 / float(arrival.cv) ** 2  # type: ignore[arg-type]
        scale_ns = 1e9 / (rate * shape)

        def draw(size: int) -> np.ndarray:
            return rng.standard_gamma(shape, size) * scale_ns

    blocks: list[np.ndarray] = []
    total, last = 0, 0
    while total < n_max:
        size = min(n_max - total, _BLOCK)
        block = np.cumsum(np.rint(draw(size)).astype(np.int64)) + last
        if limit_ns >= 0 and block[-1] >= limit_ns:
            blocks.append(block[: np.searchsorted(block, limit_ns, side="left")])
            break
        blocks.append(block)
        total += size
        last = int(block[-1])
    if not blocks:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(blocks)


def shard_indices(n: int, shard: int, shards: int) -> np.ndarray:
    """The request indices worker ``shard`` of ``shards`` sends: i % shards == shard.

    Round-robin keeps every shard's share of the schedule spread evenly in time.
    """
    for name, v in (("n", n), ("shard", shard), ("shards", shards)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ScheduleError(f"{name} must be an integer, got {v!r}")
    if n < 0:
        raise ScheduleError(f"n must be >= 0, got {n}")
    if shards < 1:
        raise ScheduleError(f"shards must be >= 1, got {shards}")
    if not 0 <= shard < shards:
        raise ScheduleError(f"shard must be in [0, {shards}), got {shard}")
    return np.arange(shard, n, shards, dtype=np.int64)
