"""An Arrow IPC stream file that is appended to message by message and survives a full disk.

The records of a run are written as an Arrow IPC *stream*: a schema message, then one
message per batch, then an end marker. This module writes those messages' bytes itself
instead of through a pyarrow stream writer, because only then does it know where the last
whole message ends: a write that fails half-way (``ENOSPC``, ``EDQUOT``, ``EIO``) is cut back
to that point, and its messages stay queued in memory and are written again on the next
``sync``. So the file is always a readable stream (every message in it is whole), and a full
disk delays records rather than corrupting or losing them.

Each batch message is written with its buffers compressed (``COMPRESSION``: zstd, which Arrow
IPC readers decompress on their own): a run's stream then takes about what its Parquet file
will (the raw timestamps of every chunk are most of it), not twice that.

``read_batches`` reads such a file (or any IPC stream) up to its last complete message: a
process killed mid-write leaves a torn tail, and everything before it is returned.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import Literal, TypeAlias

import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = ["StreamFile", "read_batches", "compressed", "END_OF_STREAM", "CONTINUATION", "COMPRESSION"]

CONTINUATION = b"\xff\xff\xff\xff"  # every IPC message (the schema first) starts with it
END_OF_STREAM = CONTINUATION + b"\x00\x00\x00\x00"
Codec: TypeAlias = Literal["lz4", "zstd"]
COMPRESSION: Codec = "zstd"  # of each batch message's buffers (Arrow IPC body compression)


class StreamFile:
    """Append-only stream file. ``append(message, rows)`` queues one serialized message;
    ``sync()`` writes what is queued and returns whether all of it is on disk. Neither raises
    for a failed write: the error is kept in ``last_error`` and counted in ``failures``."""

    def __init__(
        self, path: str | os.PathLike[str], schema: pa.Schema, compression: Codec | None = COMPRESSION
    ) -> None:
        self.path = Path(path)
        self._schema = schema
        self._options = ipc.IpcWriteOptions(compression=compression) if compression else None
        self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._good = 0  # bytes at the start of the file that are whole messages
        self._queue: deque[tuple[bytes, int]] = deque([(schema.serialize().to_pybytes(), 0)])
        self.rows_written = 0
        self.failures = 0
        self.last_error: str | None = None
        self.sync()

    @property
    def rows_queued(self) -> int:
        """Rows appended but not yet on disk (a write failed; they are retried by ``sync``)."""
        return sum(rows for _, rows in self._queue)

    def append(self, message: bytes, rows: int) -> None:
        """Queue ``message`` (one or more whole batch messages of the file's schema), its buffers
        compressed as the file's are."""
        self._queue.append((compressed(message, self._schema, self._options), rows))

    def sync(self) -> bool:
        if self._file.closed:
            return not self._queue
        while self._queue:
            message, rows = self._queue[0]
            if not self._write(message):
                return False
            self._queue.popleft()
            self.rows_written += rows
        return True

    def close(self) -> bool:
        """Write what is queued and the end marker, then close; returns whether nothing was left."""
        if self._file.closed:
            return not self._queue
        done = self.sync() and self._write(END_OF_STREAM)
        try:
            self._file.close()
        except OSError as e:
            self._failed(e)
        return done

    def _write(self, data: bytes) -> bool:
        try:
            if self._file.tell() != self._good:  # an earlier write failed half-way: cut it off
                self._file.seek(self._good)
                self._file.truncate()
            view = memoryview(data)
            while view:
                n = self._file.write(view)
                if not n:
                    raise OSError("the file accepted no bytes")
                view = view[n:]
        except OSError as e:
            self._failed(e)
            return False
        self._good += len(data)
        return True

    def _failed(self, e: OSError) -> None:
        self.failures += 1
        self.last_error = f"{self.path.name}: {e.strerror or e}"


def compressed(message: bytes, schema: pa.Schema, options: ipc.IpcWriteOptions | None) -> bytes:
    """The batch message(s) ``message`` again with their buffers compressed by ``options`` (None:
    as they are). A message that cannot be read back is kept as it came: whole, uncompressed."""
    if options is None:
        return message
    try:
        batches = [ipc.read_record_batch(m, schema) for m in ipc.MessageReader.open_stream(pa.py_buffer(message))]
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, schema, options=options) as w:
            for batch in batches:
                w.write_batch(batch)
        reader = ipc.MessageReader.open_stream(sink.getvalue())
        reader.read_next_message()  # the schema, which the file already has
        return b"".join(reader.read_next_message().serialize().to_pybytes() for _ in batches)
    except (pa.ArrowException, OSError, StopIteration):
        return message


def read_batches(path: str | os.PathLike[str]) -> tuple[pa.Schema, list[pa.RecordBatch]] | None:
    """The schema and every complete batch of an IPC stream file, tolerating a torn tail.

    An empty file, or one cut inside its schema message (a process killed as it started), has
    no batch yet: None. A file that does not start as an IPC stream raises ValueError."""
    with open(path, "rb") as f:
        head = f.read(len(CONTINUATION))
        if not head:
            return None
        f.seek(0)
        try:
            reader = ipc.open_stream(f)
        except (pa.ArrowInvalid, OSError, EOFError) as e:
            if head == CONTINUATION[: len(head)]:
                return None
            raise ValueError(f"not an Arrow stream ({_first_line(e)})") from None
        batches: list[pa.RecordBatch] = []
        while True:
            try:
                batches.append(reader.read_next_batch())
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError, EOFError):
                break
        return reader.schema, batches


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
