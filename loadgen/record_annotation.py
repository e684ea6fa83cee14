"""What analysis adds to a compacted records file, so that a query of it gives the report's figures.

``records.parquet`` holds what the engine saw. The report's figures also depend on choices made
at report time: which requests the measurement window holds, and how each request enters a
censored latency figure (docs/metrics.md, "Censoring"). ``annotate`` writes those choices into
the file, as columns beside the records (``DERIVED_SCHEMA``) and as key-value metadata (the
run's id, each point's window and how it was chosen), so that a one-line query over
``in_window`` reproduces the report (docs/metrics.md, "Querying the records").

The records layer cannot choose a window (that is analysis, which imports this layer), so the
values come from ``analysis.annotate``; this module only checks their shape and rewrites the
file: atomically (a temporary file, then a rename), row order unchanged, every record column
kept as it was (an older file gains the columns it lacked, as nulls), derived columns from an
earlier annotation replaced.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import ArrayLike

from loadgen.errors import ConfigError, SpecError
from loadgen.record_fit import conform
from loadgen.record_parquet import ROW_GROUP_ROWS, parquet_writer
from loadgen.record_version import VERSION_KEY, check_readable, parse_version
from loadgen.records import SCHEMA, SCHEMA_VERSION, file_metadata
from loadgen.run_folder import PARQUET_NAME

__all__ = ["DERIVED_SCHEMA", "DERIVED", "METADATA_PREFIX", "annotate", "read_metadata"]

# The columns analysis derives, after the records' own (docs/metrics.md, "The records schema").
_DERIVED_FIELDS: list[pa.Field[Any]] = [
    pa.field("in_window", pa.bool_(), nullable=False),  # scheduled in its point's measurement window
    pa.field("ttft_ms", pa.float64()),  # TTFT, or for a request without a first token its elapsed time
    pa.field("ttft_censored", pa.bool_()),  # ttft_ms is that elapsed time: a lower bound
    pa.field("e2e_ms", pa.float64()),  # E2E of an ok request, else its elapsed time
    pa.field("e2e_censored", pa.bool_()),  # e2e_ms is that elapsed time: a lower bound
    pa.field("tpot_ms", pa.float64()),  # per request, >= 2 output tokens
]
DERIVED_SCHEMA = pa.schema(_DERIVED_FIELDS)
DERIVED = tuple(DERIVED_SCHEMA.names)
METADATA_PREFIX = "loadgen."  # every key loadgen writes into a records file's metadata


def annotate(
    folder: str | os.PathLike[str],
    in_window: ArrayLike,
    metadata: Mapping[str, str],
    derived: Mapping[str, ArrayLike] | None = None,
    *,
    table: pa.Table | None = None,
) -> Path:
    """Rewrite ``folder``'s records.parquet with ``in_window`` (one bool per row, in file order),
    the ``derived`` columns (``DERIVED_SCHEMA``'s other names; one left out is written all null)
    and ``metadata`` (str keys starting ``METADATA_PREFIX``, str values) beside the file's own
    (``records.file_metadata``). Replaces an earlier annotation whole. A folder with no Parquet
    file (not compacted) is a ConfigError, a file of a newer schema a SpecError, one that cannot
    be written a ConfigError (the old file kept); one line each. A value of the wrong shape or
    kind is a ValueError (a caller's bug).

    ``table``: the file's records as ``records.read_records`` returned them (every row, in file
    order, derived columns left out), so that the file is not read again: only its footer is,
    and any column of a newer minor version the table lacks. The file is written as compaction
    writes it (``record_parquet.parquet_writer``), row group by row group of ``ROW_GROUP_ROWS`` rows,
    from the table as it is: no second copy."""
    path = Path(folder) / PARQUET_NAME
    if not path.exists():
        raise ConfigError(f"{folder}: no {PARQUET_NAME} to annotate (the run's records were not compacted)")
    meta = _checked_metadata(metadata)
    try:
        footer = pq.read_metadata(path)
        schema = footer.schema.to_arrow_schema()
        found = check_readable(schema.metadata, SCHEMA_VERSION, str(path))
        kept = _records_of(pq.read_table(path) if table is None else _with_newer(table, schema, footer, path), path)
    except (pa.ArrowException, OSError) as e:
        raise SpecError(f"{path}: unreadable records ({_first_line(e)})") from None
    columns = _derived_columns(kept.num_rows, in_window, derived or {})
    for f in DERIVED_SCHEMA:
        kept = kept.append_column(f, columns[f.name])
    version = max(found, SCHEMA_VERSION, key=parse_version)
    kept = kept.replace_schema_metadata({**file_metadata(), VERSION_KEY: version, **meta})
    tmp = path.with_name(PARQUET_NAME + ".tmp")
    try:  # the writer takes ``kept`` a row group at a time (a slice each: no copy of the table)
        with parquet_writer(tmp, kept.schema) as w:
            w.write_table(kept, row_group_size=ROW_GROUP_ROWS)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot annotate ({e.strerror or e}); the records are unchanged") from None
    return path


def read_metadata(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The loadgen keys of ``folder``'s records.parquet metadata (its footer only); empty when the
    file has none. A missing or unreadable file is a SpecError."""
    path = Path(folder) / PARQUET_NAME
    try:
        raw = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError) as e:
        raise SpecError(f"{path}: unreadable records ({_first_line(e)})") from None
    out = {}
    for k, v in raw.items():
        key = k.decode("utf-8", "replace")
        if key.startswith(METADATA_PREFIX):
            out[key] = v.decode("utf-8", "replace")
    return out


def _with_newer(table: pa.Table, schema: pa.Schema, footer: pq.FileMetaData, path: Path) -> pa.Table:
    """``table`` (the file's records as read) with the columns of a newer minor version that the
    file holds beside ``SCHEMA``'s and the table lacks, read from the file (those columns only)."""
    if table.num_rows != footer.num_rows:
        raise ValueError(f"{path}: the table given has {table.num_rows} rows, the file {footer.num_rows}")
    lacking = [n for n in schema.names if n not in DERIVED and n not in table.column_names]
    if not lacking:
        return table
    newer = pq.read_table(path, columns=lacking)
    for name in lacking:
        table = table.append_column(newer.schema.field(name), newer.column(name))
    return table


def _records_of(table: pa.Table, path: Path) -> pa.Table:
    """The file's own columns in ``SCHEMA`` (an older file's missing ones null), then any column
    a newer minor version added, as it was; the derived ones left out."""
    own = [name for name in table.column_names if name not in DERIVED]
    try:
        records = conform(table.select([name for name in own if name in SCHEMA.names]), SCHEMA)
    except ValueError as e:
        raise SpecError(f"{path}: unreadable records ({e})") from None
    for name in own:
        if name not in SCHEMA.names:
            records = records.append_column(table.schema.field(name), table.column(name))
    return records


def _checked_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    for k, v in metadata.items():
        if not (isinstance(k, str) and k.startswith(METADATA_PREFIX)):
            raise ValueError(f"metadata key {k!r} must be a str starting {METADATA_PREFIX!r}")
        if not isinstance(v, str):
            raise ValueError(f"metadata {k}: expected a str, got {type(v).__name__}")
    return dict(metadata)


def _derived_columns(n: int, in_window: ArrayLike, derived: Mapping[str, ArrayLike]) -> dict[str, pa.Array[Any]]:
    unknown = {name for name in derived if name not in DERIVED[1:]}
    if unknown:
        raise ValueError(f"not a derived column: {', '.join(sorted(unknown))} (known: {', '.join(DERIVED[1:])})")
    mask = np.asarray(in_window)
    if mask.dtype != np.bool_ or mask.shape != (n,):
        raise ValueError(f"in_window must be {n} bools (one per row), got {mask.dtype} of shape {mask.shape}")
    out: dict[str, pa.Array[Any]] = {"in_window": pa.array(mask, pa.bool_())}
    for f in DERIVED_SCHEMA:
        if f.name == "in_window":
            continue
        if f.name not in derived:
            out[f.name] = pa.nulls(n, f.type)
            continue
        out[f.name] = _column(f, derived[f.name], n)
    return out


def _column(f: pa.Field[Any], values: ArrayLike, n: int) -> pa.Array[Any]:
    """A derived column from a pyarrow array of the field's type, or a numpy one (NaN: null)."""
    if isinstance(values, pa.Array):
        col: pa.Array[Any] = values
    else:
        x = np.asarray(values)
        col = pa.array(x, mask=np.isnan(x)) if x.dtype.kind == "f" else pa.array(x)
    if len(col) != n or not col.type.equals(f.type):
        raise ValueError(f"{f.name} must be {n} values of {f.type}, got {len(col)} of {col.type}")
    return col


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
