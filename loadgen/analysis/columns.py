"""The records' columns as numpy arrays, converted once.

Shared by ``metrics`` (the figures), ``timeseries`` and ``conformance.samples`` (the
gate, which needs the samples themselves), so every caller derives TTFT, ITL and the
rest from the same arrays (``latencies`` and ``chunk_walk`` hold the definitions of
DESIGN.md). The array aliases (``Ints``, ``Floats``, ``Mask``, ``Objects``) name what each
array holds.

A run of a million requests has over a hundred million chunks, so the chunk columns are
views of the Arrow buffers where they can be (no copy), a table's ``Cols`` is converted
once however many figures ask for it (``Cols.of`` keeps it while the table lives), and a
string column is built from its dictionary encoding: one Python string per distinct value,
not one per row.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeAlias, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = [
    "Cols",
    "Floats",
    "Ints",
    "Tokens",
    "Mask",
    "Objects",
    "ms",
    "int_column",
]

T = TypeVar("T")
Ints: TypeAlias = NDArray[np.int64]  # nanoseconds, token counts, row numbers
Tokens: TypeAlias = NDArray[np.int32] | NDArray[np.int64]  # per chunk: tokens (as the records hold them)
Floats: TypeAlias = NDArray[np.float64]  # milliseconds, rates
Mask: TypeAlias = NDArray[np.bool_]  # per row or per chunk: selected or valid
Objects: TypeAlias = NDArray[np.object_]  # a string column (None where null)


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
        """Per chunk: its row (a per-chunk array of the whole run: the hot paths walk
        ``chunk_walk.chunk_blocks``)."""
        owner: Ints = np.repeat(np.arange(self.n, dtype=np.int64), self.c_len)
        return owner

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
        codes = {name: _codes(table, name) for name in _STRINGS}
        status = _strings(codes["status"])
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
            source=_strings(codes["output_tokens_source"]),
            finish=_strings(codes["finish_reason"]),
            stream_end=_strings(codes["stream_end"]),
            error=_strings(codes["error"]),
            c_len=lens,
            c_parts=parts,
        )
        for name in _CODED:
            cols.memo[("codes", name)] = codes[name]
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


def ms(a: Ints, b: Ints) -> Floats:
    """(a - b) in ms; the int64 difference is taken first so ns precision is kept."""
    return (a - b).astype(np.float64) / 1e6


def int_column(table: pa.Table, name: str) -> tuple[Ints, Mask]:
    """An integer column as (values with nulls as 0, validity)."""
    col = table.column(name)
    valid = np.asarray(col.is_valid().to_numpy(), dtype=np.bool_)
    return _ints(col), valid


def _ints(col: pa.ChunkedArray[Any] | pa.Array[Any]) -> Ints:
    """Nulls as 0 (the validity mask says which were null)."""
    return np.asarray(pc.fill_null(col, pa.scalar(0, col.type)).to_numpy(zero_copy_only=False), dtype=np.int64)


def _strings(coded: tuple[Ints, list[str]]) -> Objects:
    """A string column from its codes (``_codes``; all None when the table predates it): each
    row refers to its value's one string (Arrow's ``to_numpy`` makes a string per row)."""
    codes, values = coded
    lookup = np.empty(len(values) + 1, dtype=np.object_)  # the last: None, what code -1 picks
    lookup[: len(values)] = values
    out: Objects = lookup[codes]
    return out


_STRINGS = ("status", "output_tokens_source", "finish_reason", "stream_end", "error")  # the string columns
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
