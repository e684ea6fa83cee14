"""A worker's records on their way home: read from its engine's stream file as it grows, moved onto the master's clock.

The engine process writes its records to an ordinary Arrow IPC stream file on the
worker's disk (``records.RecordWriter``: a batch every flush interval). The worker process
reads that file as it grows (``StreamTail``): every whole IPC message that has landed, no
torn one. Each batch's time columns (``t_*`` and ``chunk_ns``) are moved by the worker's
constant ``shift_ns`` onto the master's monotonic clock (``shifted``; latencies, which are
differences of one worker's stamps, do not change) and sent to the master as serialized
IPC messages in bounded chunks (``chunks``), which the master appends to its copy of the
shard's stream unread. A worker lost mid-run so loses what its engine had not yet
flushed and what was read but not yet sent: one flush interval and one relay interval.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from loadgen.stream_file import CONTINUATION, END_OF_STREAM

__all__ = ["StreamTail", "shifted", "chunks", "TIME_COLUMNS", "MAX_CHUNK_ROWS", "MAX_CHUNK_BYTES"]

MAX_CHUNK_ROWS = 4096  # records per message home: bounded, so one message never stalls the channel
MAX_CHUNK_BYTES = 4 << 20
_READ_BYTES = 8 << 20  # read at most this much of the stream per pass


def _is_time(field: pa.Field[Any]) -> bool:
    return (field.name.startswith("t_") and pa.types.is_int64(field.type)) or (
        field.name == "chunk_ns" and pa.types.is_list(field.type)
    )


TIME_COLUMNS = ("t_sched", "t_sent", "t_headers", "t_first", "t_first_content", "t_last", "t_done", "chunk_ns")


class StreamTail:
    """The whole messages of a growing IPC stream file, read pass by pass from where the last ended."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.schema: pa.Schema | None = None
        self.ended = False  # the end-of-stream marker was read
        self._pos = 0  # bytes of the file consumed (whole messages)
        self._pending = b""

    def read(self) -> list[pa.RecordBatch]:
        """The batches that landed since the last call (the schema message is kept, not returned)."""
        if self.ended:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos + len(self._pending))
                self._pending += f.read(_READ_BYTES)
        except FileNotFoundError:
            return []
        out: list[pa.RecordBatch] = []
        while self._pending:
            if self._pending.startswith(END_OF_STREAM):
                self.ended = True
                break
            if len(self._pending) < 8 or not self._pending.startswith(CONTINUATION):
                if len(self._pending) >= len(CONTINUATION) and not self._pending.startswith(CONTINUATION):
                    raise ValueError(f"{self.path}: not an Arrow IPC stream at byte {self._pos}")
                break
            reader = pa.BufferReader(pa.py_buffer(self._pending))
            try:
                message = ipc.read_message(reader)
            except (pa.ArrowInvalid, OSError, EOFError):
                break  # the message has not landed whole yet
            used = reader.tell()
            self._pos += used
            self._pending = self._pending[used:]
            if message.type == "schema":
                self.schema = ipc.read_schema(message)
            elif message.type == "record batch" and self.schema is not None:
                out.append(ipc.read_record_batch(message, self.schema))
            else:
                raise ValueError(f"{self.path}: unexpected IPC message {message.type!r}")
        return out


def shifted(batch: pa.RecordBatch, shift_ns: int) -> pa.RecordBatch:
    """``batch`` with every time column moved by ``shift_ns`` (nulls stay null)."""
    if not shift_ns:
        return batch
    columns = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if _is_time(field):
            if isinstance(column, pa.ListArray):
                values = pc.add(column.values, pa.scalar(shift_ns, pa.int64()))
                column = pa.ListArray.from_arrays(column.offsets, values, type=field.type, mask=column.is_null())
            else:
                column = pc.add(column, pa.scalar(shift_ns, pa.int64()))
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def chunks(
    batches: Sequence[pa.RecordBatch], max_rows: int = MAX_CHUNK_ROWS, max_bytes: int = MAX_CHUNK_BYTES
) -> Iterator[tuple[list[bytes], int]]:
    """The batches as serialized IPC messages, grouped into chunks of at most ``max_rows`` rows and
    about ``max_bytes`` bytes (a bigger batch is sliced); yields (messages, rows)."""
    messages: list[bytes] = []
    rows = size = 0
    for batch in batches:
        for start in range(0, batch.num_rows, max_rows):
            part = batch.slice(start, max_rows)
            data = part.serialize().to_pybytes()
            if messages and (rows + part.num_rows > max_rows or size + len(data) > max_bytes):
                yield messages, rows
                messages, rows, size = [], 0, 0
            messages.append(data)
            rows += part.num_rows
            size += len(data)
    if messages:
        yield messages, rows
