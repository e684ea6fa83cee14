"""The records' columns as numpy arrays, converted once, and the per-chunk gaps.

Shared by ``metrics`` (the figures), ``timeseries`` and ``conformance.samples`` (the
gate, which needs the samples themselves), so every caller derives TTFT, ITL and the
rest from the same code: the definitions of DESIGN.md live in one place. The array
aliases (``Ints``, ``Floats``, ``Mask``, ``Objects``) name what each array holds.

A run of a million requests has over a hundred million chunks, so the chunk columns are
views of the Arrow buffers where they can be (no copy), a table's ``Cols`` is converted
once however many figures ask for it (``Cols.of`` keeps it while the table lives), and the
per-chunk figures walk the chunks in blocks of whole requests (``chunk_blocks``), never
holding a per-chunk temporary of the whole run.

``Latencies`` holds the censoring rule (docs/metrics.md, "Censoring"): every request
counts, a request that never got what a figure times is a right-censored sample at
its elapsed time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, TypeAlias, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = [
    "Cols",
    "Floats",
    "Ints",
    "Tokens",
    "Latencies",
    "Mask",
    "Objects",
    "ms",
    "gaps",
    "itl_icl",
    "ChunkBlock",
    "chunk_blocks",
    "itl_icl_blocks",
    "int_column",
    "BUFFERED_SHARE",
    "BUFFERED_MIN_TOKENS",
]

T = TypeVar("T")
Ints: TypeAlias = NDArray[np.int64]  # nanoseconds, token counts, row numbers
Tokens: TypeAlias = NDArray[np.int32] | NDArray[np.int64]  # per chunk: tokens (as the records hold them)
Floats: TypeAlias = NDArray[np.float64]  # milliseconds, rates
Mask: TypeAlias = NDArray[np.bool_]  # per row or per chunk: selected or valid
Objects: TypeAlias = NDArray[np.object_]  # a string column (None where null)


_BLOCK_CHUNKS = 1 << 22  # chunks per block of ``chunk_blocks``: ~100 MB of temporaries


@dataclass(eq=False)
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
    c_len: Ints  # per row: number of chunks
    c_parts: list[tuple[int, Ints, Tokens]]  # the chunk columns as the records hold them: (first row, arrivals, tokens)
    memo: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False)  # figures of this table

    def once(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, once per ``key`` for this table (``Cols.of`` keeps a table's Cols): a
        figure asked for by the summary and again by a report is computed once."""
        if key not in self.memo:
            self.memo[key] = compute()
        out: T = self.memo[key]
        return out

    @cached_property
    def c_ns(self) -> Ints:
        """Per output-carrying chunk, request by request: its arrival (one array of the whole run:
        the figures walk ``chunk_blocks`` instead)."""
        return _joined([ns for _, ns, _ in self.c_parts], np.int64)

    @cached_property
    def c_tok(self) -> Tokens:
        """Per chunk: its tokens (as ``c_ns``)."""
        return _joined([tok for _, _, tok in self.c_parts], np.int64)

    @property
    def chunks(self) -> int:
        return int(self.c_start[-1])

    def chunk_max(self) -> int | None:
        """The latest chunk arrival (None without chunks)."""
        ends = [int(ns.max()) for _, ns, _ in self.c_parts if ns.size]
        return max(ends) if ends else None

    @cached_property
    def c_start(self) -> Ints:
        """Per row, then one more: where its chunks start in ``c_ns`` (``c_start[-1]``: how many)."""
        out: Ints = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(self.c_len, out=out[1:])
        return out

    @cached_property
    def c_owner(self) -> Ints:
        """Per chunk: its row (a per-chunk array of the whole run: the hot paths use ``chunk_blocks``)."""
        owner: Ints = np.repeat(np.arange(self.n, dtype=np.int64), self.c_len)
        return owner

    @cached_property
    def chunk_tokens(self) -> Ints:
        """Per row: the tokens of its chunks, summed."""
        out: Ints = np.zeros(self.n, dtype=np.int64)
        for b in chunk_blocks(self):
            sums = np.bincount(b.owner, weights=b.tok).astype(np.int64)
            out[b.row0 : b.row0 + sums.size] = sums
        return out

    @classmethod
    def of(cls, table: pa.Table) -> Cols:
        """The columns of ``table``, converted once: a later call for the same table object
        returns the same ``Cols`` (kept while the table lives)."""
        hit = _CACHE.get(id(table))
        if hit is not None and hit[0]() is table:
            return hit[1]
        cols = cls._convert(table)
        _CACHE[id(table)] = (weakref.ref(table, _forget(id(table))), cols)
        return cols

    @classmethod
    def _convert(cls, table: pa.Table) -> Cols:
        n = table.num_rows
        status = _strings(table, "status")
        parts, lens = _chunks(table)
        ints = (
            "prompt_tokens_requested",
            "prompt_tokens_reported",
            "output_tokens_requested",
            "output_tokens_reported",
            "http_status",
            "session",
            "turn",
        )
        cols = cls(
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
            c_len=lens,
            c_parts=parts,
        )
        for name in _CODED:
            cols.memo[("codes", name)] = _codes(table, name)
        return cols

    def observed_end_ns(self) -> int:
        """The end of the records' observation: the latest instant any of them holds
        (a send, a chunk, an end), else the latest t_sched. A request that never
        ended is censored at it."""
        ends = [int(v[ok].max()) for v, ok in self.t.values() if ok.any()]
        if (last := self.chunk_max()) is not None:
            ends.append(last)
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


_CODED = ("status", "output_tokens_source", "finish_reason")  # string columns counted by value (outcomes)


def _codes(table: pa.Table, name: str) -> tuple[Ints, list[str]]:
    """A string column as (per row: the index of its value in the list, -1 where null; the
    distinct values, in the order they first occur), by Arrow's dictionary encoding."""
    if name not in table.column_names:
        return np.full(table.num_rows, -1, dtype=np.int64), []
    enc = table.column(name).combine_chunks().dictionary_encode()
    codes = pc.fill_null(enc.indices, pa.scalar(-1, enc.indices.type)).to_numpy(zero_copy_only=False)
    return np.asarray(codes, dtype=np.int64), [str(v) for v in enc.dictionary.to_pylist()]


_CACHE: dict[int, tuple[weakref.ref[pa.Table], Cols]] = {}


def _forget(key: int) -> Callable[[weakref.ref[pa.Table]], None]:
    """The callback that drops a table's ``Cols`` when the table goes."""

    def drop(ref: weakref.ref[pa.Table]) -> None:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is ref:
            del _CACHE[key]

    return drop


def _joined(parts: list[NDArray[Any]], dtype: type[np.int64]) -> NDArray[Any]:
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _list_parts(table: pa.Table, name: str) -> tuple[list[tuple[int, NDArray[Any]]], Ints]:
    """A list column as (per Arrow chunk: its first row and its flattened values in the column's
    own integer type, nulls as 0, a view of the Arrow buffer where there are none; per-row length,
    a null list has length 0)."""
    col = table.column(name)
    lens = _ints(pc.list_value_length(col))
    parts, row = [], 0
    for chunk in col.chunks:
        parts.append((row, _values(pc.list_flatten(chunk))))
        row += len(chunk)
    return parts, lens


def _values(arr: pa.Array[Any]) -> NDArray[Any]:
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(0, arr.type))
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _chunks(table: pa.Table) -> tuple[list[tuple[int, Ints, Tokens]], Ints]:
    """The chunk columns as parts (first row, arrivals as int64, tokens as the records hold them),
    one per Arrow chunk when both columns are chunked alike (no copy), and the per-row lengths.
    A row whose token list does not match its arrival list (a malformed record) falls back to
    one token per chunk."""
    ns_parts, lens = _list_parts(table, "chunk_ns")
    tok_parts, tok_lens = _list_parts(table, "chunk_tokens")
    alike = [r for r, _ in ns_parts] == [r for r, _ in tok_parts]
    if np.array_equal(lens, tok_lens) and alike:
        return [
            (r, np.asarray(ns, dtype=np.int64), tok) for (r, ns), (_, tok) in zip(ns_parts, tok_parts, strict=True)
        ], lens
    ns = _joined([v for _, v in ns_parts], np.int64).astype(np.int64, copy=False)
    tok_vals = _joined([v for _, v in tok_parts], np.int64)
    if np.array_equal(lens, tok_lens):
        return [(0, ns, tok_vals)], lens
    rows = np.arange(table.num_rows)
    good = lens == tok_lens
    tok = np.ones(ns.size, dtype=np.int64)
    tok[good[np.repeat(rows, lens)]] = tok_vals[good[np.repeat(rows, tok_lens)]]
    return [(0, ns, tok)], lens


class ChunkBlock(NamedTuple):
    """The chunks of a run of whole requests (``chunk_blocks``): ``owner`` numbers the requests
    from 0 within the block (``row0`` is the first one's row in the table)."""

    row0: int
    owner: Ints
    ns: Ints
    tok: Tokens


def chunk_blocks(c: Cols, rows: Mask | None = None, size: int = _BLOCK_CHUNKS) -> Iterator[ChunkBlock]:
    """The chunks of the selected ``rows`` (all when None), in row order, in blocks of whole
    requests of about ``size`` chunks: what a per-chunk figure of the whole run walks instead
    of per-chunk arrays of it."""
    start = c.c_start
    sized = np.searchsorted(start, np.arange(0, c.chunks, size), side="right") - 1
    cuts = np.unique(np.concatenate([sized, [r for r, _, _ in c.c_parts], [c.n]]).astype(np.int64))
    part = 0
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        while part + 1 < len(c.c_parts) and c.c_parts[part + 1][0] <= a:
            part += 1
        base = int(start[c.c_parts[part][0]])  # a block lies in one part (cut at every part's first row)
        lo, hi = int(start[a]) - base, int(start[b]) - base
        owner = np.repeat(np.arange(b - a, dtype=np.int64), c.c_len[a:b])
        ns, tok = c.c_parts[part][1][lo:hi], c.c_parts[part][2][lo:hi]
        if rows is not None:
            sel = rows[a:b]
            if not sel.all():
                run = np.flatnonzero(sel)
                if run.size and run[-1] - run[0] + 1 == run.size:  # one run of rows (a window of sorted rows)
                    first, last = int(run[0]), int(run[-1]) + 1
                    lo_c, hi_c = int(start[a + first] - start[a]), int(start[a + last] - start[a])
                    owner, ns, tok = owner[lo_c:hi_c], ns[lo_c:hi_c], tok[lo_c:hi_c]
                else:
                    keep = sel[owner]
                    owner, ns, tok = owner[keep], ns[keep], tok[keep]
        if owner.size:
            yield ChunkBlock(a, owner, ns, tok)


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
    the next token). ICL: raw gaps between consecutive output chunks. Every sample, in
    row order (``itl_icl_blocks`` gives them block by block, ITL as values and counts)."""
    itl: list[Floats] = []
    icl: list[Floats] = []
    for (v, k), gap in itl_icl_blocks(c, rows):
        itl.append(np.repeat(v, k))
        icl.append(gap)
    empty = np.zeros(0)
    return (np.concatenate(itl) if itl else empty), (np.concatenate(icl) if icl else empty)


def itl_icl_blocks(c: Cols, rows: Mask | None) -> Iterator[tuple[tuple[Floats, Tokens], Floats]]:
    """Per block of ``chunk_blocks``: ((ITL value g/k per token-carrying chunk with a previous
    one, its k: that many samples), ICL gaps), in ms, as ``itl_icl`` defines them."""
    every = c.once("every_chunk_has_tokens", lambda: all(bool((tok > 0).all()) for _, _, tok in c.c_parts))
    for b in chunk_blocks(c, rows):
        if every:  # every chunk carries tokens: the ITL gaps are the ICL ones
            later = b.owner[1:] == b.owner[:-1]  # each chunk but a request's first: its gap to the one before
            icl = np.diff(b.ns)[later] / 1e6
            k = b.tok[1:][later]
            yield (icl / k, k), icl
            continue
        gap, has_prev = gaps(b.owner, b.ns)
        icl = gap[has_prev] / 1e6
        t = b.tok > 0
        gap, has_prev = gaps(b.owner[t], b.ns[t])
        k = b.tok[t][has_prev]
        yield (gap[has_prev] / 1e6 / k, k), icl


BUFFERED_SHARE = 0.8  # of a request's tokens in one read, and of its time before that read
BUFFERED_MIN_TOKENS = 4  # fewer tokens cannot tell a buffered answer from a short one


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
