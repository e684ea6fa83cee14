"""Rows of a CSV trace, with columns found by name, and the cells every CSV trace has.

Published CSV traces (Azure, BurstGPT) add, drop and reorder columns between
releases; reading columns by header name (any case) and ignoring the rest keeps
one reader working across them, and a missing column is named in one line
together with the header that was found.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from loadgen.errors import SpecError
from loadgen.workload.traces.fields import field_error, plain_number, read_bytes, whole_number

__all__ = ["csv_rows", "cell_whole", "cell_time_ns"]


def csv_rows(path: Path, need: dict[str, str], opt: dict[str, str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, {field: cell}) per data row, for the columns named in ``need`` (each must
    be there) and ``opt`` (read when present); blank rows are skipped."""
    text = read_bytes(path).decode("utf-8-sig", errors="replace")
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise SpecError(f"{path}: empty file")
    cols = {h.strip().lower(): i for i, h in enumerate(header)}
    missing = [name for name in need.values() if name.lower() not in cols]
    if missing:
        raise SpecError(f"{path}:1: missing column(s) {', '.join(missing)} (found: {', '.join(header)})")
    index = {f: cols[n.lower()] for f, n in {**need, **opt}.items() if n.lower() in cols}
    for row in reader:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(header):
            raise SpecError(f"{path}:{reader.line_num}: {len(row)} columns, the header has {len(header)}")
        yield reader.line_num, {f: row[i].strip() for f, i in index.items()}


def cell_whole(cell: str, where: str, field: str) -> int:
    """A token count cell (``12`` or ``12.0``)."""
    try:
        v = float(cell)
    except ValueError:
        raise field_error(where, field, f"not a number: {cell[:40]!r}") from None
    return whole_number(v, where, field)


def cell_time_ns(cell: str, where: str, field: str) -> int:
    """Seconds, or a date and time; in integer ns so that epoch times keep their digits."""
    try:
        return round(plain_number(float(cell), where, field) * 1e9)
    except ValueError:
        pass
    try:
        return int(np.datetime64(cell.replace(" ", "T"), "ns").astype(np.int64))
    except ValueError:
        raise field_error(where, field, f"not a time: {cell[:40]!r}") from None
