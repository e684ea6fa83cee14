"""The records' columns as numpy arrays, converted once, and the per-chunk gaps.

Shared by ``metrics`` (the figures), ``timeseries`` and ``conformance.samples`` (the
gate, which needs the samples themselves), so every caller derives TTFT, ITL and the
rest from the same code: the definitions of DESIGN.md live in one place. The array
aliases (``Ints``, ``Floats``, ``Mask``, ``Objects``) name what each array holds.

``Latencies`` holds the censoring rule (docs/metrics.md, "Censoring"): every request
counts, a request that never got what a figure times is a right-censored sample at
its elapsed time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = [
    "Cols",
    "Floats",
    "Ints",
    "Latencies",
    "Mask",
    "Objects",
    "ms",
    "gaps",
    "itl_icl",
    "int_column",
    "buffered_rows",
    "BUFFERED_SHARE",
    "BUFFERED_MIN_TOKENS",
]

Ints: TypeAlias = NDArray[np.int64]  # nanoseconds, token counts, row numbers
Floats: TypeAlias = NDArray[np.float64]  # milliseconds, rates
Mask: TypeAlias = NDArray[np.bool_]  # per row or per chunk: selected or valid
Objects: TypeAlias = NDArray[np.object_]  # a string column (None where null)


@dataclass
class Cols:
    """The table's columns as numpy arrays (ints with a validity mask, never NaN)."""

    n: int
    t_sched: Ints
    t: dict[str, tuple[Ints, Mask]]  # t_sent/t_first/t_last/t_done -> (ns, valid)
    status: Objects
    ok: Mask
    out: Ints
    ints: dict[str, tuple[Ints, Mask]]
    source: Objects
    finish: Objects
    stream_end: Objects  # records.STREAM_ENDS, None where no stream began (or an older file)
    error: Objects
    c_owner: Ints  # per output-carrying chunk: its row
    c_ns: Ints
    c_tok: Ints
    c_len: Ints  # per row: number of chunks

    @classmethod
    def of(cls, table: pa.Table) -> Cols:
        n = table.num_rows
        status = _strings(table, "status")
        owner, ns, tok, lens = _chunks(table)
        ints = (
            "prompt_tokens_requested",
            "prompt_tokens_reported",
            "output_tokens_requested",
            "output_tokens_reported",
            "http_status",
            "session",
            "turn",
        )
        return cls(
            n=n,
            t_sched=int_column(table, "t_sched")[0],
            t={k: int_column(table, k) for k in ("t_sent", "t_first", "t_last", "t_done")},
            status=status,
            ok=status == "ok",
            out=int_column(table, "output_tokens")[0],
            ints={k: int_column(table, k) for k in ints},
            source=_strings(table, "output_tokens_source"),
            finish=_strings(table, "finish_reason"),
            stream_end=_strings(table, "stream_end"),
            error=_strings(table, "error"),
            c_owner=owner,
            c_ns=ns,
            c_tok=tok,
            c_len=lens,
        )

    def observed_end_ns(self) -> int:
        """The end of the records' observation: the latest instant any of them holds
        (a send, a chunk, an end), else the latest t_sched. A request that never
        ended is censored at it."""
        ends = [int(v[ok].max()) for v, ok in self.t.values() if ok.any()]
        if self.c_ns.size:
            ends.append(int(self.c_ns.max()))
        if not ends and self.n:
            ends.append(int(self.t_sched.max()))
        return max(ends, default=0)


def int_column(table: pa.Table, name: str) -> tuple[Ints, Mask]:
    """An integer column as (values with nulls as 0, validity)."""
    col = table.column(name)
    valid = np.asarray(col.is_valid().to_numpy(), dtype=np.bool_)
    return _ints(col), valid


def _ints(col: pa.ChunkedArray[Any] | pa.Array[Any]) -> Ints:
    """Nulls as 0 (the validity mask says which were null)."""
    return np.asarray(pc.fill_null(col, pa.scalar(0, col.type)).to_numpy(zero_copy_only=False), dtype=np.int64)


def _strings(table: pa.Table, name: str) -> Objects:
    """A string column (all None when the table predates it)."""
    if name not in table.column_names:
        return np.full(table.num_rows, None, dtype=np.object_)
    return np.asarray(table.column(name).to_numpy(), dtype=np.object_)


def _list_col(table: pa.Table, name: str) -> tuple[Ints, Ints]:
    """A list column as (flattened values, per-row length; a null list has length 0)."""
    arr = table.column(name).combine_chunks()
    return _ints(pc.list_flatten(arr)), _ints(pc.list_value_length(arr))


def _chunks(table: pa.Table) -> tuple[Ints, Ints, Ints, Ints]:
    """Flattened chunk arrays. A row whose token list does not match its arrival
    list (a malformed record) falls back to one token per chunk."""
    ns, lens = _list_col(table, "chunk_ns")
    tok_vals, tok_lens = _list_col(table, "chunk_tokens")
    rows = np.arange(table.num_rows)
    owner = np.repeat(rows, lens)
    if np.array_equal(lens, tok_lens):
        tok = tok_vals
    else:
        good = lens == tok_lens
        tok = np.ones(ns.size, dtype=np.int64)
        tok[good[owner]] = tok_vals[good[np.repeat(rows, tok_lens)]]
    return owner, ns, tok, lens


def gaps(owner: Ints, ns: Ints) -> tuple[Ints, Mask]:
    """(gap to the previous chunk of the same request, mask of chunks that have one)."""
    has_prev = np.zeros(owner.size, dtype=bool)
    has_prev[1:] = owner[1:] == owner[:-1]
    gap = np.zeros(ns.size, dtype=np.int64)
    gap[1:] = np.diff(ns)
    return gap, has_prev


def ms(a: Ints, b: Ints) -> Floats:
    """(a - b) in ms; the int64 difference is taken first so ns precision is kept."""
    return (a - b).astype(np.float64) / 1e6


def itl_icl(c: Cols, rows: Mask) -> tuple[Floats, Floats]:
    """ITL: a chunk of k tokens arriving g after the previous token-carrying chunk
    gives k samples of g/k (zero-token chunks are skipped, so their time goes to
    the next token). ICL: raw gaps between consecutive output chunks."""
    sel = rows[c.c_owner]
    owner, ns, tok = c.c_owner[sel], c.c_ns[sel], c.c_tok[sel]
    gap, has_prev = gaps(owner, ns)
    icl = gap[has_prev] / 1e6
    t = tok > 0
    gap, has_prev = gaps(owner[t], ns[t])
    k = tok[t][has_prev]
    itl = np.repeat(gap[has_prev] / 1e6 / k, k)
    return itl, icl


BUFFERED_SHARE = 0.8  # of a request's tokens in one read, and of its time before that read
BUFFERED_MIN_TOKENS = 4  # fewer tokens cannot tell a buffered answer from a short one


def buffered_rows(c: Cols, rows: Mask) -> Mask:
    """Per row: one of ``rows`` that looks buffered, not streamed. It has at least
    ``BUFFERED_MIN_TOKENS`` output tokens, at least ``BUFFERED_SHARE`` of them arrived at one
    instant (chunks with the same ``chunk_ns``: one read), and that read came after at least
    ``BUFFERED_SHARE`` of the request's time from send to its last byte (``t_done - t_sent``)
    had passed in silence. A streamed answer spreads its tokens over many reads; a server or
    proxy that buffers the stream sends (nearly) all of them at the end."""
    sel = rows[c.c_owner]
    owner, ns, tok = c.c_owner[sel], c.c_ns[sel], c.c_tok[sel]
    out: Mask = np.zeros(c.n, dtype=bool)
    if owner.size == 0:
        return out
    new = np.ones(owner.size, dtype=bool)  # the first chunk of each (request, instant)
    new[1:] = (owner[1:] != owner[:-1]) | (ns[1:] != ns[:-1])
    group = np.cumsum(new) - 1
    g_tok = np.bincount(group, weights=tok).astype(np.int64)
    g_owner, g_ns = owner[new], ns[new]
    total = np.bincount(owner, weights=tok, minlength=c.n).astype(np.int64)
    (sent, has_sent), (done, has_done) = c.t["t_sent"], c.t["t_done"]
    big = (total[g_owner] >= BUFFERED_MIN_TOKENS) & (g_tok >= BUFFERED_SHARE * total[g_owner])
    timed = has_sent[g_owner] & has_done[g_owner]
    span = (done - sent)[g_owner]
    late = (g_ns - sent[g_owner]) >= BUFFERED_SHARE * span
    out[g_owner[big & timed & late & (span > 0)]] = True
    return out


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
