"""Fitting a record's values to their Arrow columns, so that writing a record cannot fail.

A record carries what an endpoint sent (token counts, finish_reason, error text) beside what
the engine measured. Before a record is batched, every value is checked against its column's
type: an integer outside its column's range (a ``completion_tokens`` of 3,000,000,000 in an
int32 column), or a value that is not a whole number at all, is written as null and the
record's ``error`` gains a note naming the field; a short string is made one clean, capped
line (``untrusted.clean_text``); a long text (``output_text``) is kept whole but made valid
UTF-8. The writer then never meets a value Arrow refuses, and a batch is never lost for one
bad number.

This module knows Arrow types, not the records' schema: ``records`` hands it the schema and
says which columns are long text, which one is the error and which survive a degraded write.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from numbers import Integral
from operator import attrgetter

import pyarrow as pa

from loadgen.untrusted import clean_text

__all__ = ["RowFitter", "conform", "valid_utf8", "DEGRADED_PREFIX"]

DEGRADED_PREFIX = "record could not be written in full: "
_INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
}
_MEMO_CHARS = 120  # short strings repeat on every record (model, endpoint, status): clean each once
_MEMO_SIZE = 4096
_INT, _STR, _TEXT, _INT_LIST, _OTHER = range(5)
# What pyarrow raises for a value it cannot convert (ArrowInvalid is a ValueError, ArrowTypeError a TypeError).
_CONVERT_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)


def valid_utf8(text: str) -> str:
    """``text`` unchanged when it can be encoded as UTF-8; else with every lone surrogate (from a
    JSON ``"\\ud800"`` escape) replaced by U+FFFD (paired ones become the character they spell)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class RowFitter:
    """Turns rows of Python values (in ``schema`` order) into ones Arrow accepts, and those into
    IPC messages.

    ``fit(values)`` returns the fitted row (notes appended to ``error_column``; ``bounded``
    counts the rows that needed one). Lists of integers are left to Arrow's own conversion,
    which range-checks every element in C (a Python loop over each chunk's arrival time would
    cost more than the conversion; the lists are the engine's own ints by construction, and a
    float in one would be truncated): ``encode(rows)`` is one batch message, and should Arrow
    refuse the batch, it is one message per row, a row's bad list written as null (with a
    note), and a row Arrow still refuses written degraded (``degraded_row``: only the ``keep``
    columns and an error naming the loss; counted in ``degraded``)."""

    def __init__(
        self,
        schema: pa.Schema,
        *,
        error_column: str,
        long_text: Collection[str] = (),
        keep: Collection[str] = (),
        text_limit: int = 300,
        error_limit: int = 1000,
    ) -> None:
        self.schema = schema
        self.names = list(schema.names)
        self._values = attrgetter(*self.names)  # an object's columns in one call (fit_object, per record)
        self._error = self.names.index(error_column)
        plan = [(i, *_column_plan(f, long_text)) for i, f in enumerate(schema) if i != self._error]
        self._ints = [(i, lo, hi) for i, kind, lo, hi in plan if kind == _INT]
        self._strs = [i for i, kind, _, _ in plan if kind == _STR]
        self._texts = [i for i, kind, _, _ in plan if kind == _TEXT]
        self._lists = [(i, lo, hi) for i, kind, lo, hi in plan if kind == _INT_LIST]
        self._keep = [self.names.index(n) for n in keep]
        self._text_limit = text_limit
        self._error_limit = error_limit
        self._memo: dict[str, str] = {}
        self.bounded = 0
        self.degraded = 0

    def fit_object(self, obj: object) -> list[object]:
        """``obj``'s attributes named as the columns, as a fitted row. Never raises: an object whose
        attributes cannot be read or fitted becomes a degraded row (failing even that, the error alone)."""
        try:
            return self.fit(self._values(obj))
        except Exception as e:  # a writer must not take the run down
            try:
                return self.degraded_row([_attr(obj, name) for name in self.names], e)
            except Exception:
                row: list[object] = [None] * len(self.names)
                row[self._error] = DEGRADED_PREFIX + type(e).__name__
                return row

    def fit(self, values: Sequence[object]) -> list[object]:
        row = list(values)
        notes: list[str] = []
        for i, lo, hi in self._ints:
            v = row[i]
            if v is not None and (type(v) is not int or v < lo or v > hi):
                row[i] = _whole(v, lo, hi)
                if row[i] is None:
                    notes.append(f"{self.names[i]} {_shown(v)} does not fit its column; written as null")
        memo = self._memo
        for i in self._strs:
            v = row[i]
            if v is not None:
                row[i] = (memo.get(v) if type(v) is str else None) or self.clean(v)
        for i in self._texts:
            if row[i] is not None:
                row[i] = _text(row[i], self.names[i], notes)
        if notes or row[self._error] is not None:
            row[self._error] = self._error_text(row[self._error], notes)
            self.bounded += bool(notes)
        return row

    def fit_lists(self, row: list[object]) -> list[object]:
        """``row`` with each list of integers that does not fit its column written as null."""
        notes = []
        for i, lo, hi in self._lists:
            if row[i] is not None and not _int_list_fits(row[i], lo, hi):
                row[i] = None
                notes.append(f"{self.names[i]} holds a value that does not fit its column; written as null")
        if notes:
            row[self._error] = self._error_text(row[self._error], notes)
            self.bounded += 1
        return row

    def degraded_row(self, values: Sequence[object], e: BaseException) -> list[object]:
        """The row with only its ``keep`` columns (fitted again) and an error naming the loss."""
        self.degraded += 1
        row: list[object] = [None] * len(self.names)
        for i in self._keep:
            row[i] = values[i] if i < len(values) else None
        row = self.fit(row)
        row[self._error] = clean_text(f"{DEGRADED_PREFIX}{type(e).__name__}: {e}", self._error_limit)
        return row

    def encode(self, rows: Sequence[list[object]]) -> bytes:
        """The rows as one IPC batch message (if Arrow refuses it: one per row, fitted further)."""
        try:
            return self._message(rows)
        except Exception:  # each row is tried on its own below
            pass
        parts = []
        for row in rows:
            try:
                parts.append(self._message([self.fit_lists(row)]))
            except Exception as e:
                parts.append(self._degraded_message(row, e))
        return b"".join(parts)

    def _degraded_message(self, row: Sequence[object], e: BaseException) -> bytes:
        try:
            return self._message([self.degraded_row(row, e)])
        except Exception:  # the error alone: a row of nulls and one string always converts
            alone: list[object] = [None] * len(self.names)
            alone[self._error] = DEGRADED_PREFIX + type(e).__name__
            return self._message([alone])

    def _message(self, rows: Sequence[Sequence[object]]) -> bytes:
        columns = {name: [row[i] for row in rows] for i, name in enumerate(self.names)}
        return bytes(pa.RecordBatch.from_pydict(columns, schema=self.schema).serialize())

    def clean(self, value: object) -> str:
        """A short string column's value: one clean line, capped (memoised for the repeats)."""
        if type(value) is str and len(value) <= _MEMO_CHARS:
            done = self._memo.get(value)
            if done is None:
                if len(self._memo) >= _MEMO_SIZE:
                    self._memo.clear()
                done = self._memo[value] = clean_text(value, self._text_limit)
            return done
        return clean_text(_to_str(value), self._text_limit)

    def _error_text(self, error: object, notes: list[str]) -> str | None:
        parts = ([] if error is None else [_to_str(error)]) + notes
        return clean_text("; ".join(parts), self._error_limit) if parts else None


def _column_plan(f: pa.Field[pa.DataType], long_text: Collection[str]) -> tuple[int, int, int]:
    if f.type in _INT_RANGES:
        return (_INT, *_INT_RANGES[f.type])
    if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
        return (_TEXT if f.name in long_text else _STR, 0, 0)
    if pa.types.is_list(f.type) and f.type.value_type in _INT_RANGES:
        return (_INT_LIST, *_INT_RANGES[f.type.value_type])
    return (_OTHER, 0, 0)


def _whole(v: object, lo: int, hi: int) -> int | None:
    """An integer column's value: a whole number in range, else None (bool is not a number)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, Integral):
        n = int(v)
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    else:
        return None
    return n if lo <= n <= hi else None


def _shown(v: object) -> str:
    try:
        return clean_text(repr(v), 40)
    except Exception:
        return f"a {type(v).__name__}"


def _to_str(v: object) -> str:
    """``v`` as text, whatever it is (an object whose ``__str__`` fails says what it was)."""
    if isinstance(v, str):
        return v
    try:
        return str(v)
    except Exception:
        return f"<unprintable {type(v).__name__}>"


def _attr(obj: object, name: str) -> object:
    try:
        return getattr(obj, name)
    except Exception:
        return None


def _text(v: object, name: str, notes: list[str]) -> str:
    text = _to_str(v)
    fixed = valid_utf8(text)
    if fixed is not text:
        notes.append(f"{name}: invalid UTF-8 (lone surrogates) replaced")
    return fixed


def _int_list_fits(v: object, lo: int, hi: int) -> bool:
    """A list column of integers: every element an ``int`` (not a bool) in range."""
    if not isinstance(v, (list, tuple)):
        return False
    return not v or (set(map(type, v)) == {int} and lo <= min(v) and max(v) <= hi)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``: a column it lacks (a file older than the column) is all null, one
    the schema lacks is dropped, one of another type is cast; ValueError if it cannot be."""
    if table.schema.equals(schema):
        return table
    cols = []
    for f in schema:
        if f.name not in table.column_names:
            cols.append(pa.nulls(table.num_rows, f.type))
            continue
        col = table.column(f.name)
        try:
            cols.append(col if col.type.equals(f.type) else col.cast(f.type))
        except _CONVERT_ERRORS:
            raise ValueError(f"column {f.name} is {col.type}, not {f.type}") from None
    return pa.Table.from_arrays(cols, schema=schema)
