"""How records.parquet is laid out: its row groups, its columns' encodings, and its reading.

``record_compact.compact`` writes the file a run leaves and ``record_annotation.annotate`` rewrites it
with the analysis's columns; both write it through ``parquet_writer``, ``ROW_GROUP_ROWS`` rows a
group, so every records.parquet has one layout: zstd, instants and ids delta-coded, the columns
of few distinct values by dictionary (4.5 B per chunk of a 128-chunk run, against 5.3 with
pyarrow's defaults). ``read_parquet`` reads it a row group at a time (two side by side), so
that a million requests are held once, not beside the decoding of the whole file. This module knows no
schema: ``records`` passes its own.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.record_fit import conform

__all__ = ["ROW_GROUP_ROWS", "READERS", "parquet_writer", "read_parquet"]

ROW_GROUP_ROWS = 1 << 17  # rows per row group of records.parquet (~17 M chunks of a 128-chunk run)
READERS = 2  # row groups decoded at once by ``read_parquet`` (the machines loadgen is sized for have 2 cores)

# Columns nearly every value of which is distinct (instants, ids), encoded as deltas (Parquet's
# DELTA_BINARY_PACKED: a run's instants rise, so its deltas are small); every other integer column
# and the strings by dictionary (few distinct values). A chunk's arrival as a delta: 1.6x faster
# to write and 2x to read than by (overflowing) dictionary, and ~10 % smaller.
_DELTA_COLUMNS = (
    "request",
    "session",
    "t_sched",
    "t_sent",
    "t_headers",
    "t_first",
    "t_first_content",
    "t_last",
    "t_done",
    "chunk_ns",
)


def parquet_writer(path: str | os.PathLike[str], schema: pa.Schema) -> pq.ParquetWriter:
    """The writer of a records.parquet (compaction, annotation): zstd, instants and ids as deltas,
    the other integer and string columns by dictionary (floats and flags plain). Write it
    ``ROW_GROUP_ROWS`` rows a group. Any Parquet reader reads it, and loadgen reads the files
    written before (each column chunk names its own encoding)."""
    delta: dict[str, str] = {}
    dictionary: list[str] = []  # (Parquet leaf paths: a list column's values are NAME.list.element)
    for f in schema:
        leaf, kind = (f"{f.name}.list.element", f.type.value_type) if pa.types.is_list(f.type) else (f.name, f.type)
        if f.name in _DELTA_COLUMNS and pa.types.is_integer(kind):
            delta[leaf] = "DELTA_BINARY_PACKED"
        elif pa.types.is_integer(kind) or pa.types.is_string(kind):
            dictionary.append(leaf)
    # (pyarrow's stubs type use_dictionary as a bool; it takes the columns to encode so, too)
    options: dict[str, Any] = {"compression": "zstd", "use_dictionary": dictionary, "column_encoding": delta or None}
    return pq.ParquetWriter(Path(path), schema, **options)


def read_parquet(path: str | os.PathLike[str], schema: pa.Schema) -> pa.Table:
    """``schema``'s columns of a records.parquet (a column an older file lacks: null), read a row
    group at a time, ``READERS`` groups at once, each group's decoding buffers handed back to the
    OS once it is read: the table is held once, beside at most ``READERS`` groups' decoding, not a
    whole file's. Why groups side by side rather than one group's columns at once: a group's chunk
    arrivals, one column, are most of its decoding, so one group at a time left the second core
    idle. At a million requests (126 M chunks, 1.9 GiB of table) the read alone took 1.4-2.1 s
    and peaked at 2.4-2.5 GiB RSS; one group at a time, 2.0-5.6 s and 2.2-2.3 GiB."""
    f = pq.ParquetFile(Path(path), pre_buffer=False)  # (pre-buffering reads a group's every column at once)
    held = set(f.schema_arrow.names)
    columns = [name for name in schema.names if name in held]
    pool = pa.default_memory_pool()

    def group(i: int) -> pa.Table:
        # a reader of its own per group: one ParquetFile is not read from two threads at once
        one = pq.ParquetFile(Path(path), metadata=f.metadata, pre_buffer=False)
        table = one.read_row_group(i, columns=columns, use_threads=False)
        pool.release_unused()
        return table

    with ThreadPoolExecutor(READERS) as readers:  # (the decoding runs without the GIL)
        groups = list(readers.map(group, range(f.num_row_groups)))
    table = pa.concat_tables(groups) if groups else f.schema_arrow.empty_table().select(columns)
    return conform(table, schema).replace_schema_metadata(None)
