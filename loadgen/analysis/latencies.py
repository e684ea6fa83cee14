"""Every request's latencies, in ms, under the censoring rule (docs/metrics.md, "Censoring").

Every request counts: a request that never got what a figure times is a right-censored sample
at its elapsed time, one the endpoint ended badly is a failure, not a sample. ``Latencies``
holds the rule once, for the summary (``metrics``), the gate (``conformance.samples``), the
search (``plan.search``), sessions and annotations alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen.analysis.columns import Cols, Floats, Mask, ms

__all__ = ["Latencies", "WAITING"]

# Statuses of a request loadgen stopped waiting for: its latency is at least its elapsed time.
WAITING = ("cancelled", "timeout", "not_sent")


@dataclass(frozen=True)
class Latencies:
    """Per request (every row), in ms: each figure exact where known, else right-censored.

    - TTFT: exact for every request whose first output chunk arrived, however it ended
      (ok, cancelled, timeout, disconnected, ...); one still waiting for it when loadgen
      stopped waiting (``WAITING``: cancelled at the end, timed out, never sent) is
      censored at its elapsed time. A request the endpoint ended without one (an HTTP
      error, a broken stream) is a failure, not a latency sample: it counts as a failure
      and as a miss, and would otherwise make every percentile above its few milliseconds
      a lower bound. An ok request with no output chunk (an empty answer) has no TTFT.
    - E2E: exact for ok requests; a ``WAITING`` one is censored at its elapsed time;
      one the endpoint ended badly is a failure, as for TTFT.
    - TPOT: every request with >= 2 output tokens, whatever its status: a cut stream
      counts over the tokens it received (the open gap at the cut is not timed).
    - ``ttft_sent``: TTFT from the actual send; only requests that were sent.
    - schedule lag: every request sent; a ``not_sent`` one is censored at its wait.
    - A ``not_sent`` turn after a turn of its session that did not end ok (a failed, cut
      or unsent one) was never due: the session could not go on. It is no latency
      sample (its wait would be made up), only a miss; the turn that broke it counts.

    Elapsed time is ``t_done - t_sched``, or, for a request that never ended (e.g.
    ``not_sent``), the end of observation (``Cols.observed_end_ns``) ``- t_sched``,
    never below 0. Each figure is NaN where it does not apply; the ``*_c`` arrays
    hold the censored values (NaN elsewhere), so a row is in at most one of the two.
    """

    ttft: Floats
    ttft_c: Floats
    ttft_sent: Floats
    ttft_sent_c: Floats
    e2e: Floats
    e2e_c: Floats
    tpot: Floats
    lag: Floats
    lag_c: Floats

    @classmethod
    def of(cls, c: Cols) -> Latencies:
        """Every row's latencies (computed once per ``Cols``)."""
        return c.once("latencies", lambda: cls._of(c))

    @classmethod
    def _of(cls, c: Cols) -> Latencies:
        (sent, has_sent), (first, has_first), (last, has_last), (done, has_done) = (
            c.t[k] for k in ("t_sent", "t_first", "t_last", "t_done")
        )
        end = np.where(has_done, done, c.observed_end_ns())
        elapsed = np.maximum(ms(end, c.t_sched), 0.0)
        unsent = c.status == "not_sent"
        counts = ~(unsent & _after_a_cut(c)) if unsent.any() else np.ones(c.n, dtype=bool)
        waiting = np.isin(c.status, WAITING) & counts
        no_first = ~has_first & waiting
        tpot = np.full(c.n, np.nan)
        a = has_first & has_last & (c.out >= 2)
        tpot[a] = ms(last[a], first[a]) / (c.out[a] - 1)
        return cls(
            ttft=_where(has_first, ms(first, c.t_sched)),
            ttft_c=_where(no_first, elapsed),
            ttft_sent=_where(has_first & has_sent, ms(first, sent)),
            ttft_sent_c=_where(no_first & has_sent, np.maximum(ms(end, sent), 0.0)),
            e2e=_where(c.ok & has_done, ms(done, c.t_sched)),
            e2e_c=_where(waiting, elapsed),
            tpot=tpot,
            lag=_where(has_sent, ms(sent, c.t_sched)),
            lag_c=_where(~has_sent & unsent & counts, elapsed),
        )


def _after_a_cut(c: Cols) -> Mask:
    """Rows whose session has an earlier turn that did not end ok."""
    bad = ~c.ok
    if not bad.any():
        return bad
    (session, _), (turn, _) = c.ints["session"], c.ints["turn"]
    ids, row_of = np.unique(session, return_inverse=True)
    first_bad = np.full(ids.size, np.iinfo(np.int64).max)
    np.minimum.at(first_bad, row_of[bad], turn[bad])
    after: Mask = turn > first_bad[row_of]
    return after


def _where(mask: Mask, values: Floats) -> Floats:
    out: Floats = np.where(mask, values, np.nan)
    return out
