"""When a stream's output arrived, as far as the client can tell: the evidence of the timing items.

The client stamps a read when it gets round to reading, so a read's time is only
an upper bound on when its bytes arrived; the lower bound is the client's previous
look (``Wire.looks`` from a ``LoopWatch``, any earlier read, the send), or the
start of a stall that ended just before the read. While the client's event loop
is free the two are a millisecond apart. When it stalls (a busy
machine), chunks that a server sent one by one wait in the socket and are read
together at the stall's end: few reads, as from a buffering server.

So ``Arrivals`` gives each figure twice: as observed (``reads``, ``span_ns``), and
as large as the client's stalls could have made it (``reads_max``, ``span_max_ns``:
had every chunk read after a stall arrived separately, the first one right after
the look before it). A verdict that streaming happened rests on the observed
figures (a stall can hide spread, never make it); a verdict that the server
buffered rests on the largest ones, so it cannot be the client's doing.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadgen.conformance.exchange import Stream

__all__ = ["STALL_NS", "Arrivals", "arrivals", "spread"]

# A read more than this after the client's previous look followed a stall: its chunks may have
# arrived apart. A free loop looks every 1-2 ms (a 1 ms sleep, rounded up by the selector).
STALL_NS = 5_000_000


@dataclass(frozen=True)
class Arrivals:
    """A stream's output-chunk arrivals: as read, and as spread as the client's stalls allow."""

    chunks: int  # output-carrying chunks (``Stream.token_ns``: generated ones, when usage says text was empty)
    reads: int  # distinct reads that carried them
    span_ns: int  # first output read to last
    total_ns: int  # send to the answer's last byte
    reads_max: int  # reads there could have been, had each read after a stall been its chunks apart
    span_max_ns: int  # last output read - the look before the first one
    stalled_ns: int  # time in stalls of the client's loop during the answer
    longest_stall_ns: int

    def evidence(self) -> str:
        return (
            f"{self.chunks} output chunks in {self.reads} reads over {self.span_ns / 1e6:.1f} ms "
            f"of a {self.total_ns / 1e6:.1f} ms answer"
        )

    def stalls(self) -> str:
        return (
            f"the client's event loop stalled for {self.stalled_ns / 1e6:.0f} ms of the answer "
            f"(longest {self.longest_stall_ns / 1e6:.0f} ms)"
        )


def spread(reads: int, span_ns: int, a: Arrivals, min_reads: int = 4) -> bool:
    """Streamed: at least ``min_reads`` and a quarter of the chunks in separate reads,
    over at least a tenth of the answer (a buffering server sends one late burst)."""
    return reads >= max(min_reads, a.chunks // 4) and span_ns >= 0.1 * a.total_ns


def arrivals(s: Stream) -> Arrivals:
    """The arrivals of ``s``'s output chunks, bounded by the client's looks (see the module)."""
    w = s.wire
    per_read = sorted(Counter(s.token_ns).items())
    looks = sorted({w.t_sent, w.t_done, *(t for t, _ in w.reads), *w.looks})
    before = [_look_before(looks, t, w.t_sent) for t, _ in per_read]
    after_stall = [t - b > STALL_NS for (t, _), b in zip(per_read, before, strict=True)]
    reads = len(per_read)
    reads_max = reads + sum(k - 1 for (_, k), late in zip(per_read, after_stall, strict=True) if late)
    span = per_read[-1][0] - per_read[0][0] if per_read else 0
    span_max = per_read[-1][0] - before[0] if per_read else 0
    inside = [t for t in looks if w.t_sent <= t <= w.t_done]
    gaps = [b - a for a, b in zip(inside, inside[1:], strict=False) if b - a > STALL_NS]
    return Arrivals(
        chunks=len(s.token_ns),
        reads=reads,
        span_ns=span,
        total_ns=w.t_done - w.t_sent,
        reads_max=reads_max,
        span_max_ns=span_max,
        stalled_ns=sum(gaps),
        longest_stall_ns=max(gaps, default=0),
    )


def _look_before(looks: list[int], t: int, floor: int) -> int:
    """The client's last look that shows nothing had arrived before it, for a read at ``t``.

    That is the last look before ``t``, unless a stall ended shortly (``STALL_NS``)
    before ``t``: the look that ends a stall comes in the same wake-up as the reads of
    whatever arrived during it, so the bytes read then may date from the stall's start.
    """
    i = bisect.bisect_left(looks, t)
    if i == 0:
        return floor
    j = i - 1
    while j > 0 and looks[j] >= t - STALL_NS:
        if looks[j] - looks[j - 1] > STALL_NS:
            return looks[j - 1]
        j -= 1
    return looks[i - 1]
