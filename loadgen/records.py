"""Per-request records: the Arrow schema, a crash-safe writer and the readers.

The records file is the single source of truth for a run: every figure in every
report is a function of it. While a run goes on, records are appended in small
batches to an Arrow IPC *stream* (``records.arrows``) and flushed, so a killed
process leaves a file whose complete batches are all readable. At the end the
stream is compacted to ``records.parquet``.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from loadgen.errors import ConfigError, SpecError

__all__ = [
    "tool_info",
    "SERVER_METRICS_NAME",
    "load_server_metrics",
    "read_run_meta",
    "write_json",
    "make_folder",
    "check_run_folder",
    "SCHEMA",
    "STATUSES",
    "Record",
    "RecordWriter",
    "read_stream",
    "read_records",
    "compact",
    "STREAM_NAME",
    "PARQUET_NAME",
]

STREAM_NAME = "records.arrows"
PARQUET_NAME = "records.parquet"

# Request outcomes. ``cancelled`` is a request still in flight when the run was
# stopped (Ctrl-C or end of the drain grace); it is never counted as a success.
STATUSES = (
    "ok",
    "http_error",
    "timeout",
    "disconnected",
    "bad_stream",
    "client_error",
    "cancelled",
)

# Where a request's output-token count came from: the endpoint's ``usage``
# (total distributed over the chunks), per-chunk running usage
# (``continuous_usage_stats``), a configured tokenizer, or one per chunk.
TOKEN_SOURCES = ("usage", "usage_per_chunk", "tokenizer", "chunks", "none")

_FIELDS: list[pa.Field[Any]] = [
    pa.field("run_id", pa.string()),
    pa.field("point", pa.int32()),  # load point index within a sweep (0 for a run)
    pa.field("shard", pa.int32()),  # worker shard that sent it
    pa.field("request", pa.int64()),  # sequence number in the schedule
    pa.field("session", pa.int64()),
    pa.field("turn", pa.int32()),
    pa.field("endpoint", pa.string()),  # endpoint label (never a key)
    pa.field("model", pa.string()),
    pa.field("api", pa.string()),  # chat | completions
    pa.field("t_sched", pa.int64()),  # perf_counter_ns, intended send time
    pa.field("t_sent", pa.int64()),
    pa.field("t_headers", pa.int64()),
    pa.field("t_first", pa.int64()),  # first output-carrying chunk
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
    pa.field("finish_reason", pa.string()),
    pa.field("status", pa.string()),
    pa.field("http_status", pa.int32()),
    pa.field("error", pa.string()),
    pa.field("output_text", pa.string()),  # kept only when asked (--keep-text); untrusted
]
SCHEMA = pa.schema(_FIELDS)

SERVER_METRICS_NAME = "server_metrics.jsonl"  # the endpoint's own /metrics over the run (client.scrape)


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
    finish_reason: str | None = None
    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    output_text: str | None = None


_COLUMNS = [f.name for f in fields(Record)]
assert _COLUMNS == SCHEMA.names, "Record and SCHEMA must list the same columns in order"


def to_batch(records: Sequence[Record]) -> pa.RecordBatch:
    cols = {name: [getattr(r, name) for r in records] for name in _COLUMNS}
    return pa.RecordBatch.from_pydict(cols, schema=SCHEMA)


class RecordWriter:
    """Appends records to an Arrow IPC stream in batches.

    ``add`` only buffers (cheap, on the hot path); ``flush`` writes one batch and
    flushes it to the OS. The engine calls ``flush`` on a short timer, so a
    SIGKILL loses at most the records of the last interval, and the file stays
    readable up to its last complete batch.
    """

    def __init__(self, path: str | os.PathLike[str], batch_size: int = 512) -> None:
        self.path = Path(path)
        self.batch_size = batch_size
        self._pending: list[Record] = []
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._writer = ipc.new_stream(self._file, SCHEMA)
        self._file.flush()
        self.written = 0

    def add(self, record: Record) -> None:
        self._pending.append(record)
        if len(self._pending) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        batch = to_batch(self._pending)
        self._pending = []
        self._writer.write_batch(batch)
        self._file.flush()
        self.written += batch.num_rows

    def close(self) -> None:
        if self._file.closed:
            return
        self.flush()
        self._writer.close()
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_stream(path: str | os.PathLike[str]) -> pa.Table:
    """Read every complete batch of a records stream, tolerating a torn tail.

    A process killed mid-write leaves a partial last message; everything before
    it is intact and returned.
    """
    batches: list[pa.RecordBatch] = []
    with open(path, "rb") as f:
        try:
            reader = ipc.open_stream(f)
        except (pa.ArrowInvalid, OSError):
            return SCHEMA.empty_table()
        while True:
            try:
                batches.append(reader.read_next_batch())
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError, EOFError):
                break
    return pa.Table.from_batches(batches, schema=SCHEMA)


def read_records(run_dir: str | os.PathLike[str]) -> pa.Table:
    """The records of a run folder: the Parquet file, else the raw stream(s)."""
    run = Path(run_dir)
    parquet = run / PARQUET_NAME
    if parquet.exists():
        try:
            return pq.read_table(parquet, schema=SCHEMA)
        except (pa.ArrowException, OSError) as e:
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
        pq.read_schema(parquet)
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(parquet, e) from None


def _streams(run: Path) -> list[Path]:
    streams = sorted(run.glob("records*.arrows"))
    if not streams:
        raise ConfigError(f"{run}: not a run folder (no {PARQUET_NAME} or {STREAM_NAME})")
    return streams


def _unreadable(path: Path, e: BaseException) -> SpecError:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return SpecError(f"{path}: unreadable records ({reason})")


def compact(run_dir: str | os.PathLike[str], streams: Iterable[Path] | None = None) -> Path:
    """Merge the run's record stream(s) (one per shard) into ``records.parquet``.

    The stream files are removed only after the Parquet file is fully written.
    """
    run = Path(run_dir)
    paths = sorted(streams) if streams is not None else sorted(run.glob("records*.arrows"))
    table = pa.concat_tables([read_stream(p) for p in paths]) if paths else SCHEMA.empty_table()
    table = table.sort_by([("point", "ascending"), ("t_sched", "ascending")])
    tmp = run / (PARQUET_NAME + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, run / PARQUET_NAME)
    for p in paths:
        p.unlink()
    return run / PARQUET_NAME


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    os.replace(tmp, path)


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    """A run folder's ``run.json``; a missing, unreadable or malformed one is a LoadgenError."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no run.json)")
    try:
        meta = orjson.loads(path.read_bytes())
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror or e}") from None
    except orjson.JSONDecodeError as e:
        raise SpecError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise SpecError(f"{path}: expected a JSON object, found {type(meta).__name__}")
    for key, (kind, name) in _META_SHAPE.items():
        value = meta.get(key)
        if value is not None and not isinstance(value, kind):
            raise SpecError(f"{path}: {key}: expected a JSON {name}, found {type(value).__name__}")
    if any(not isinstance(p, dict) for p in meta.get("points") or ()):
        raise SpecError(f"{path}: points: expected a list of JSON objects")
    return meta


# The blocks of run.json that readers descend into (each may be absent or null).
_META_SHAPE: dict[str, tuple[type, str]] = {
    "settings": (dict, "object"),
    "client": (dict, "object"),
    "sweep": (dict, "object"),
    "simulator": (dict, "object"),
    "points": (list, "array"),
}


def make_folder(path: Path, flag: str = "--out") -> Path:
    """Create the folder a command writes to (parents too) and prove it is writable, before any
    traffic: a file in the way or a read-only place is a ConfigError naming ``flag``."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".loadgen-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    return path


def load_server_metrics(run_dir: Path | str) -> list[dict[str, Any]] | None:
    """The rows of ``run_dir/server_metrics.jsonl`` (error rows included), or None when there
    is none. A torn last line (a crash mid-write) is skipped."""
    path = Path(run_dir) / SERVER_METRICS_NAME
    if not path.exists():
        return None
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def tool_info() -> dict[str, str]:
    """run.json's ``tool`` block: which loadgen wrote the folder (the installed distribution's version)."""
    try:
        version = importlib.metadata.version("loadgen")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        version = "0+unknown"
    return {"name": "loadgen", "version": version}
