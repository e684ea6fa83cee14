"""Per-request records: the Arrow schema, a crash-safe writer and the readers.

The records file is the single source of truth for a run: every figure in every
report is a function of it. While a run goes on, records are appended in small
batches to an Arrow IPC *stream* (``records.arrows``) and flushed, so a killed
process leaves a file whose complete batches are all readable. At the end the
stream is compacted to ``records.parquet``. Both carry the schema's version
(``SCHEMA_VERSION``, ``record_version``) in their key-value metadata; a reader refuses a file
of a newer major version in one line.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.errors import ConfigError, SpecError
from loadgen.record_fit import RowFitter, conform
from loadgen.record_parquet import read_parquet
from loadgen.record_version import VERSION_KEY, check_readable, stamped
from loadgen.run_folder import PARQUET_NAME, STREAM_NAME, read_run_meta
from loadgen.stream_file import StreamFile, read_batches

__all__ = [
    "tool_info",
    "check_run_folder",
    "SCHEMA",
    "SCHEMA_VERSION",
    "file_metadata",
    "STATUSES",
    "STREAM_ENDS",
    "TOKEN_SOURCES",
    "Record",
    "RecordWriter",
    "read_stream",
    "read_records",
]

# Request outcomes. ``cancelled`` is a request still in flight when the run was
# stopped (Ctrl-C or end of the drain grace); it is never counted as a success.
# ``not_sent`` is a scheduled request that was never written to the wire: the run was
# stopped first, its session was cut, or it was still waiting for a ``--max-inflight``
# slot when the drain ended. Its ``t_sent`` is null and ``error`` says why. Every
# scheduled request ends as exactly one record. An ``ok`` record may carry an ``error``:
# a note that the endpoint sent an impossible value, which was bounded (failure is keyed
# on ``status`` alone).
STATUSES = (
    "ok",
    "http_error",
    "timeout",
    "disconnected",
    "bad_stream",
    "client_error",
    "cancelled",
    "not_sent",
)

# Where a request's output-token count came from: the endpoint's ``usage``
# (total distributed over the chunks), per-chunk running usage
# (``continuous_usage_stats``), a configured tokenizer, or one per chunk.
TOKEN_SOURCES = ("usage", "usage_per_chunk", "tokenizer", "chunks", "none")

# How a 200 stream ended (``stream_end``): ``done``, with ``data: [DONE]``; ``finish``, with a
# finish_reason but no [DONE] before the body closed (the answer is whole, its framing not:
# ``ok``, and counted per run); ``eof``, with neither (``disconnected``). Null for a request
# whose stream never began (an HTTP error, a failure before the body, not sent).
STREAM_ENDS = ("done", "finish", "eof")

_FIELDS: list[pa.Field[Any]] = [
    pa.field("run_id", pa.string()),
    pa.field("point", pa.int32()),  # load point index within a sweep (0 for a run)
    pa.field("shard", pa.int32()),  # worker shard that sent it
    pa.field("request", pa.int64()),  # sequence number in the schedule
    pa.field("session", pa.int64()),
    pa.field("turn", pa.int32()),
    pa.field("endpoint", pa.string()),  # endpoint label (never a key)
    pa.field("model", pa.string()),
    pa.field("api", pa.string()),  # config.APIS: chat | completions | responses | embeddings | rerank
    pa.field("t_sched", pa.int64()),  # perf_counter_ns, intended send time
    pa.field("t_sent", pa.int64()),
    pa.field("t_headers", pa.int64()),
    pa.field("t_first", pa.int64()),  # first output-carrying chunk
    pa.field("t_first_content", pa.int64()),  # first chunk with visible content (not reasoning); null if none
    pa.field("t_last", pa.int64()),  # last output-carrying chunk
    pa.field("t_done", pa.int64()),  # stream ended (or failed)
    pa.field("chunk_ns", pa.list_(pa.int64())),  # arrival of each output-carrying chunk
    pa.field("chunk_tokens", pa.list_(pa.int32())),  # output tokens in each such chunk
    pa.field("prompt_tokens_requested", pa.int32()),
    pa.field("prompt_tokens_reported", pa.int32()),
    pa.field("cached_tokens", pa.int32()),
    pa.field("output_tokens_requested", pa.int32()),
    pa.field("output_tokens_reported", pa.int32()),
    pa.field("output_tokens", pa.int32()),  # the count used by metrics
    pa.field("output_tokens_source", pa.string()),
    pa.field("reasoning_tokens", pa.int32()),  # usage.completion_tokens_details.reasoning_tokens; null if not sent
    pa.field("stream_end", pa.string()),  # how a 200 stream ended (STREAM_ENDS); null if none began
    pa.field("finish_reason", pa.string()),
    pa.field("tool_calls", pa.int32()),  # tool calls in the answer; null if the request offered no tools
    pa.field("inputs", pa.int32()),  # embeddings inputs or rerank documents sent; null for other APIs
    pa.field("stage", pa.string()),  # a pipeline's stage (embed | rerank | generate); null outside one
    pa.field("status", pa.string()),
    pa.field("http_status", pa.int32()),
    pa.field("error", pa.string()),
    pa.field("output_text", pa.string()),  # kept only when asked (--keep-text); untrusted
]
SCHEMA = pa.schema(_FIELDS)

# The records schema's version, "MAJOR.MINOR" (record_version): a minor step adds what an older
# reader can ignore, a major one changes a column's meaning. 1 (no version stamped): the schema
# before issue 13/14. 1.1: status ``not_sent``, columns ``t_first_content`` and ``reasoning_tokens``,
# and in a compacted file the derived columns and metadata analysis adds (``record_annotation``).
# 1.2: columns ``stream_end``, ``tool_calls`` and ``inputs``; APIs responses, embeddings, rerank.
# 1.3: column ``stage`` (the rag-pipeline workload: each user request a session of stage requests).
SCHEMA_VERSION = "1.3"
LOADGEN_VERSION_KEY = "loadgen.version"


@dataclass(slots=True)
class Record:
    """One request, as the engine saw it. Times are ``perf_counter_ns`` values."""

    run_id: str = ""
    point: int = 0
    shard: int = 0
    request: int = 0
    session: int = 0
    turn: int = 0
    endpoint: str = ""
    model: str = ""
    api: str = "chat"
    t_sched: int = 0
    t_sent: int | None = None
    t_headers: int | None = None
    t_first: int | None = None
    t_first_content: int | None = None
    t_last: int | None = None
    t_done: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens_requested: int | None = None
    prompt_tokens_reported: int | None = None
    cached_tokens: int | None = None
    output_tokens_requested: int | None = None
    output_tokens_reported: int | None = None
    output_tokens: int = 0
    output_tokens_source: str = "none"
    reasoning_tokens: int | None = None
    stream_end: str | None = None
    finish_reason: str | None = None
    tool_calls: int | None = None
    inputs: int | None = None
    stage: str | None = None
    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    output_text: str | None = None


_COLUMNS = [f.name for f in fields(Record)]
assert _COLUMNS == SCHEMA.names, "Record and SCHEMA must list the same columns in order"
# What a degraded record keeps: who it was, when it was due, and how it ended.
_DEGRADED_KEEPS = ("run_id", "point", "shard", "request", "session", "turn", "t_sched", "status")


def to_batch(records: Sequence[Record]) -> pa.RecordBatch:
    cols = {name: [getattr(r, name) for r in records] for name in _COLUMNS}
    return pa.RecordBatch.from_pydict(cols, schema=SCHEMA)


class RecordWriter:
    """Appends records to an Arrow IPC stream in batches, and never takes the run down.

    ``add`` fits the record's values to their columns (``record_fit``: an impossible number is
    written as null and named in ``error``; counted in ``bounded``) and buffers it; ``flush``
    writes one batch and hands it to the OS. The engine calls ``flush`` on a short timer, so a
    SIGKILL loses at most the records of the last interval, and the file stays readable up to
    its last complete batch. Neither raises: a record Arrow still refuses is written in a
    degraded form (ids, ``t_sched``, ``status``, an error naming the loss; ``degraded``); a
    failed write (a full disk) keeps the records in memory for the next ``flush``
    (``write_failures``, ``last_error``; ``stream_file``). ``written`` counts every record on
    disk; ``close`` returns how many could not be written at all (0 unless the disk stayed full).
    """

    def __init__(self, path: str | os.PathLike[str], batch_size: int = 512) -> None:
        self.path = Path(path)
        self.batch_size = batch_size
        self._rows: list[list[object]] = []
        self._fit = RowFitter(SCHEMA, error_column="error", long_text=("output_text",), keep=_DEGRADED_KEEPS)
        self._file = StreamFile(self.path, stamped(SCHEMA, SCHEMA_VERSION))

    @property
    def written(self) -> int:  # records on disk, degraded ones included
        return self._file.rows_written

    @property
    def degraded(self) -> int:  # records written in a degraded form
        return self._fit.degraded

    @property
    def bounded(self) -> int:  # records with a value bounded to fit its column
        return self._fit.bounded

    @property
    def write_failures(self) -> int:  # writes that failed (their records kept for the next flush)
        return self._file.failures

    @property
    def last_error(self) -> str | None:
        return self._file.last_error

    @property
    def unwritten(self) -> int:
        """Records added but not on disk (buffered, or kept after a failed write)."""
        return len(self._rows) + self._file.rows_queued

    def add(self, record: Record) -> None:
        self._rows.append(self._fit.fit_object(record))
        if len(self._rows) >= self.batch_size:
            self.flush()

    def add_degraded(self, record: Record, e: BaseException) -> None:
        """``record`` in its degraded form, naming ``e``: what the engine keeps of a record whose
        ``add`` raised (a bug, memory), so the request still ends as one record on disk."""
        self._rows.append(self._fit.degraded_row([getattr(record, name, None) for name in _COLUMNS], e))

    def flush(self) -> None:
        try:
            if self._rows:
                rows, self._rows = self._rows, []
                self._file.append(self._fit.encode(rows), len(rows))
            self._file.sync()
        except Exception as e:  # never: encoding and writing handle their own failures
            self._file.last_error = f"{type(e).__name__}: {e}"

    def close(self) -> int:
        """Flush, try once more what a failed write left, close; the records that stayed unwritten."""
        self.flush()
        self._file.close()
        return self.unwritten

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_stream(path: str | os.PathLike[str]) -> pa.Table:
    """Every complete batch of a records stream, tolerating a torn tail (a process killed
    mid-write); an older stream's missing columns read as null. A file that is no records
    stream is a SpecError."""
    try:
        found = read_batches(path)
    except (ValueError, OSError) as e:
        raise _unreadable(Path(path), e) from None
    if found is None:
        return SCHEMA.empty_table()
    check_readable(found[0].metadata, SCHEMA_VERSION, str(path))
    try:
        return conform(pa.Table.from_batches(found[1], schema=found[0]), SCHEMA)
    except ValueError as e:
        raise _unreadable(Path(path), e) from None


def read_records(run_dir: str | os.PathLike[str]) -> pa.Table:
    """The records of a run folder in ``SCHEMA`` (the columns analysis derived, if any, left out):
    the Parquet file, else the raw stream(s). A file of a newer major schema version is refused."""
    run = Path(run_dir)
    parquet = run / PARQUET_NAME
    if parquet.exists():
        try:
            check_readable(pq.read_schema(parquet).metadata, SCHEMA_VERSION, str(parquet))
            return read_parquet(parquet, SCHEMA)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise _unreadable(parquet, e) from None
    return pa.concat_tables([read_stream(p) for p in _streams(run)])


def check_run_folder(run_dir: str | os.PathLike[str]) -> None:
    """Refuse a folder that is no run folder, or whose run.json or records cannot be read, at the
    cost of reading run.json and the Parquet footer: before a command loads the analysis."""
    run = Path(run_dir)
    read_run_meta(run)
    parquet = run / PARQUET_NAME
    if not parquet.exists():
        _streams(run)
        return
    try:
        schema = pq.read_schema(parquet)
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(parquet, e) from None
    check_readable(schema.metadata, SCHEMA_VERSION, str(parquet))


def _streams(run: Path) -> list[Path]:
    streams = sorted(run.glob("records*.arrows"))
    if not streams:
        raise ConfigError(f"{run}: not a run folder (no {PARQUET_NAME} or {STREAM_NAME})")
    return streams


def _unreadable(path: Path, e: BaseException) -> SpecError:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return SpecError(f"{path}: unreadable records ({reason})")


def file_metadata() -> dict[str, str]:
    """The key-value metadata every records file written now carries: its schema's version and
    the loadgen version that wrote it (analysis adds the run's id and windows: ``record_annotation``)."""
    return {VERSION_KEY: SCHEMA_VERSION, LOADGEN_VERSION_KEY: tool_info()["version"]}


def tool_info() -> dict[str, str]:
    """run.json's ``tool`` block: which loadgen wrote the folder (the installed distribution's version)."""
    try:
        version = importlib.metadata.version("loadgen")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        version = "0+unknown"
    return {"name": "loadgen", "version": version}
