"""Compaction: a run's record streams (``records*.arrows``, one per shard or point, written as it
went) merged into ``records.parquet``, sorted by (point, t_sched), crash-safe.

Apart from records.py because it is the one step that holds a whole run's records at once, and
is written for that: the streams' records are held once, never sorted whole (each row group is
taken from the batches that hold its rows), and the file is written a row group at a time
through ``record_parquet.parquet_writer``, so a million requests compact in about 3 GiB.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.errors import ConfigError
from loadgen.record_parquet import ROW_GROUP_ROWS, parquet_writer
from loadgen.records import SCHEMA, file_metadata, read_records, read_stream
from loadgen.run_folder import PARQUET_NAME

__all__ = ["compact"]


def compact(run_dir: str | os.PathLike[str], streams: Iterable[Path] | None = None) -> Path:
    """Merge the run's record stream(s) (one per shard or point) into ``records.parquet``.

    Safe after a crash: a stream's torn last batch is left out, all before it kept; a compaction
    cut short after ``records.parquet`` was written (streams left) is finished by adding the
    streams' records the Parquet file lacks; a compacted folder is left as it is. Streams are
    removed only once the Parquet file is whole. A file that is no records stream is a
    SpecError, a Parquet file that cannot be written a ConfigError (streams kept); one line.
    """
    run = Path(run_dir)
    paths = sorted(streams) if streams is not None else sorted(run.glob("records*.arrows"))
    parquet = run / PARQUET_NAME
    if not paths and parquet.exists():
        return parquet
    parts = [read_stream(p) for p in paths]
    if parquet.exists():
        done = read_records(run)
        parts = [done, *(_not_in(t, done) for t in parts)]
    table = pa.concat_tables(parts) if parts else SCHEMA.empty_table()
    parts.clear()  # the streams' records are held once, by ``table``, never sorted whole
    table = table.replace_schema_metadata(file_metadata())
    tmp = run / (PARQUET_NAME + ".tmp")
    try:  # row groups of ROW_GROUP_ROWS rows: the writer holds one encoded at a time, a reader decodes one
        _write_sorted(table, tmp)
        os.replace(tmp, parquet)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        kept = ", ".join(p.name for p in paths)
        raise ConfigError(f"{parquet}: cannot write ({e.strerror or e}); the records stay in {kept}") from None
    for p in paths:
        p.unlink(missing_ok=True)
    return parquet


def _write_sorted(table: pa.Table, path: Path) -> None:
    """Write ``table`` sorted by (point, t_sched), stably, as ``table.sort_by`` would, a row group
    at a time: each group's rows taken batch by batch from the batches that hold them (a take
    across a table's chunks would concatenate whole columns), so no sorted copy of the whole
    table is ever held, only one row group's."""
    by_time = pc.sort_indices(table, sort_keys=[("point", "ascending"), ("t_sched", "ascending")])
    order = by_time.to_numpy().astype(np.int64)  # (arrow gives uint64)
    batches = table.to_batches()
    starts = np.cumsum([0, *(b.num_rows for b in batches)])
    with parquet_writer(path, table.schema) as w:
        if table.num_rows == 0:
            w.write_table(table)
        for lo in range(0, table.num_rows, ROW_GROUP_ROWS):
            w.write_table(_taken(table.schema, batches, starts, order[lo : lo + ROW_GROUP_ROWS]))  # then freed


def _taken(schema: pa.Schema, batches: list[pa.RecordBatch], starts: Any, rows: Any) -> pa.Table:
    """The ``rows`` of the table whose ``batches`` begin at rows ``starts``, in that order: each
    batch's taken by one take, then put in order (the pieces freed on return)."""
    which = np.searchsorted(starts, rows, side="right") - 1
    by = np.argsort(which, kind="stable")  # the rows by batch, each batch's in the order asked
    held = which[by]
    cuts = [0, *(np.flatnonzero(np.diff(held)) + 1).tolist(), by.size]
    spans = zip(cuts[:-1], cuts[1:], strict=True)
    pieces = pa.Table.from_batches([batches[held[a]].take(rows[by[a:b]] - starts[held[a]]) for a, b in spans], schema)
    back = np.empty_like(by)
    back[by] = np.arange(by.size)
    return pieces.take(back)


def _not_in(table: pa.Table, done: pa.Table) -> pa.Table:
    """The rows of ``table`` whose (point, request) ``done`` does not hold."""
    keys = ["point", "request"]
    index = table.select(keys).append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    left = index.join(done.select(keys), keys=keys, join_type="left anti").sort_by("_row")
    return table.take(left.column("_row"))
