"""A run folder on disk: the names of its files, its run.json (read, checked, written, and the
run's state in it), whether it holds a run, making it ready, and the endpoint's metrics kept in it.

run.json is written when a run (or a sweep) starts, with ``"state": "running"`` and the
identity of the process writing it, and rewritten at the end as ``"complete"`` or
``"interrupted"`` with an ``"interrupted_reason"`` ("SIGINT", "SIGTERM", "second Ctrl-C:
drain cut short"). A run whose process was killed never reaches the end: its run.json still
says ``running``, so a reader asks whether that process is alive. A pid alone is not proof
(pids are reused, and a folder may come from another machine), so the process is identified
by its pid, the kernel's start time of that pid (``/proc/<pid>/stat``) and the machine's boot
id, where the platform has them. A run.json without a state (written before states existed)
reads as complete, unless its client block says it was interrupted. A sweep's points carry the
same keys; a point still ``running`` in a sweep that no longer runs reads as interrupted with
the sweep's reason.

``mark_running`` and ``mark_finished`` edit a run.json dict in place (the caller writes it
with ``write_json``, whose bytes are ``json_bytes``); ``run_state_of`` reads one and
``read_run_state`` a folder's. ``make_folder`` uses ``writable_folder`` and
``replace_run`` to refuse (or, with ``--force``, clear) a folder that already holds a run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadgen.errors import ConfigError, SpecError
from loadgen.untrusted import clean_text

__all__ = [
    "RUN_JSON",
    "STREAM_NAME",
    "PARQUET_NAME",
    "SERVER_METRICS_NAME",
    "write_json",
    "read_run_meta",
    "read_run_state",
    "run_files",
    "make_folder",
    "load_server_metrics",
    "json_bytes",
    "load_run_json",
    "writable_folder",
    "replace_run",
    "STATES",
    "PROCESS_ENDED",
    "RunState",
    "mark_running",
    "mark_finished",
    "run_state_of",
    "point_states",
    "process_alive",
]

RUN_JSON = "run.json"
STREAM_NAME = "records.arrows"  # the records as a run writes them (records.RecordWriter)
PARQUET_NAME = "records.parquet"  # the records compacted (record_compact)
SERVER_METRICS_NAME = "server_metrics.jsonl"  # the endpoint's own /metrics over the run (client.scrape)
STATES = ("running", "complete", "interrupted")
PROCESS_ENDED = "the run's process ended before it finished"
_NO_REASON = "interrupted (no reason recorded)"
_STOPPED = "stopped before it finished"


@dataclass(frozen=True)
class RunState:
    """Where a run stands: ``state`` is one of STATES; ``reason`` says why it was interrupted
    (None unless ``state`` is ``"interrupted"``)."""

    state: str
    reason: str | None = None


def mark_running(meta: MutableMapping[str, Any]) -> None:
    """Mark a run.json dict as a run in progress by this process (before it is first written)."""
    meta["state"] = "running"
    meta.pop("interrupted_reason", None)
    pid = os.getpid()
    meta["pid"] = pid
    meta["pid_started"] = _proc_stat(pid)[1]
    meta["boot_id"] = _boot_id()
    meta.setdefault("started_wall_ns", time.time_ns())


def mark_finished(meta: MutableMapping[str, Any], interrupted_reason: str | None = None) -> None:
    """Mark a run.json dict (or a sweep point's) as ``complete``, or as ``interrupted`` with the
    reason when one is given."""
    if interrupted_reason is None:
        meta["state"] = "complete"
        meta.pop("interrupted_reason", None)
    else:
        meta["state"] = "interrupted"
        meta["interrupted_reason"] = interrupted_reason


def run_state_of(meta: Mapping[str, Any], where: str = "run.json") -> RunState:
    """The state a run.json dict (or a sweep point's dict) records, with a ``running`` one whose
    process is gone read as interrupted. An unknown state is a SpecError naming ``where``."""
    state = meta.get("state")
    if state is None:  # an older run.json: its client block says whether it was stopped
        client = meta.get("client")
        if isinstance(client, Mapping) and client.get("interrupted") is True:
            reason = client.get("stop_reason")
            return RunState("interrupted", clean_text(reason) if isinstance(reason, str) and reason else _STOPPED)
        return RunState("complete")
    if state not in STATES:
        raise SpecError(f"{where}: state: expected one of {', '.join(STATES)}, found {clean_text(repr(state), 40)}")
    if state == "interrupted":
        reason = meta.get("interrupted_reason")
        return RunState("interrupted", clean_text(reason) if isinstance(reason, str) and reason.strip() else _NO_REASON)
    if state == "running" and "pid" in meta:
        pid, started, boot = meta.get("pid"), meta.get("pid_started"), meta.get("boot_id")
        started, boot = (started if isinstance(started, int) else None), (boot if isinstance(boot, str) else None)
        if not process_alive(pid, started, boot):
            return RunState("interrupted", PROCESS_ENDED)
    return RunState(state)


def point_states(meta: Mapping[str, Any], where: str = "run.json") -> list[RunState]:
    """The state of each point of a sweep's run.json (``meta["points"]``): a point recorded as
    ``running`` in a sweep that no longer runs takes the sweep's reason."""
    run = run_state_of(meta, where)
    states = []
    for k, point in enumerate(meta.get("points") or ()):
        s = run_state_of(point, f"{where}: points[{k}]") if isinstance(point, Mapping) else RunState("complete")
        if s.state == "running" and run.state != "running":
            s = RunState("interrupted", run.reason or PROCESS_ENDED)
        states.append(s)
    return states


def process_alive(pid: object, started: int | None = None, boot_id: str | None = None) -> bool:
    """Whether the process that wrote a run.json still runs: its pid exists (and is no zombie),
    and where recorded, that pid started at ``started`` (clock ticks after boot) on this boot."""
    if type(pid) is not int or pid <= 0:
        return False
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate it there; assume alive
        return True
    if boot_id is not None and (now_boot := _boot_id()) is not None and now_boot != boot_id:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, run by another user
    except (OSError, OverflowError):
        return False
    status, start = _proc_stat(pid)
    if status in ("Z", "X"):  # a zombie: ended, its parent has not reaped it yet
        return False
    return started is None or start is None or start == started


def _proc_stat(pid: int) -> tuple[str | None, int | None]:
    """(state letter, start time in clock ticks after boot) of ``pid`` from /proc, or Nones."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rindex(b")") + 2 :].split()  # the name, in parentheses, may hold spaces
        return fields[0].decode("ascii"), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None, None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


def json_bytes(data: Any) -> bytes:
    """``data`` as standard JSON (RFC 8259), indented: NaN and +-Infinity, which JSON cannot
    hold, are written as ``null`` (never ``NaN`` or ``Infinity``), numpy scalars and arrays as
    numbers. A figure that can be unbounded says so in a flag of its own beside the null."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


def load_run_json(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A folder's run.json as a dict; a missing one is a ConfigError, an unreadable or malformed
    one a SpecError (``read_run_meta`` also checks the blocks readers descend into)."""
    path = Path(run_dir) / RUN_JSON
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no {RUN_JSON})")
    try:
        meta = orjson.loads(path.read_bytes())
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror or e}") from None
    except orjson.JSONDecodeError as e:
        raise SpecError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise SpecError(f"{path}: expected a JSON object, found {type(meta).__name__}")
    return meta


def writable_folder(path: Path, flag: str = "--out") -> Path:
    """Create a folder a command writes to (parents too) and prove it is writable, before any
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


def replace_run(path: Path, files: list[Path], state: str, flag: str, force: bool) -> None:
    """Make room for a new run where ``files`` (loadgen's own, found in ``path``) are an old run's,
    whose ``state`` is given: refuse in one line unless ``force``, then remove exactly those
    files. A run still being written there (``running``: its process alive) is refused even so."""
    if state == "running":
        raise ConfigError(f"{flag} {path}: a run is still being written there; choose another folder")
    if not force:
        raise ConfigError(
            f"{flag} {path} already holds a run (state: {state}); choose another folder or pass --force to replace it"
        )
    for p in sorted(files, key=lambda p: p.name == RUN_JSON):  # run.json last: a half-cleared run stays one
        try:
            p.unlink(missing_ok=True)
        except OSError as e:
            raise ConfigError(f"{flag} {path}: cannot remove the old run's {p.name} ({e.strerror or e})") from None


def write_json(path: Path, data: Any) -> None:
    """Write ``json_bytes(data)`` to ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(json_bytes(data))
    os.replace(tmp, path)


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    """A run folder's ``run.json``; a missing, unreadable or malformed one is a LoadgenError."""
    path = Path(run_dir) / "run.json"
    meta = load_run_json(run_dir)
    for key, (kind, name) in _META_SHAPE.items():
        value = meta.get(key)
        if value is not None and not isinstance(value, kind):
            raise SpecError(f"{path}: {key}: expected a JSON {name}, found {type(value).__name__}")
    if any(not isinstance(p, dict) for p in meta.get("points") or ()):
        raise SpecError(f"{path}: points: expected a list of JSON objects")
    return meta


def read_run_state(run_dir: str | os.PathLike[str]) -> RunState:
    """Where the run (or sweep) in ``run_dir`` stands (``run_folder.run_state_of``: a ``running``
    one whose process is gone reads as interrupted); no or a bad run.json is a LoadgenError."""
    return run_state_of(read_run_meta(Path(run_dir)), str(Path(run_dir) / "run.json"))


# The blocks of run.json that readers descend into (each may be absent or null).
_META_SHAPE: dict[str, tuple[type, str]] = {
    "settings": (dict, "object"),
    "client": (dict, "object"),
    "sweep": (dict, "object"),
    "simulator": (dict, "object"),
    "points": (list, "array"),
}


# The files loadgen writes into a run folder (each also as NAME.tmp while it is written), the
# records streams and the write probe: the only files ``make_folder(force=True)`` removes.
_RUN_FILES = ("run.json", PARQUET_NAME, "summary.json", SERVER_METRICS_NAME, "report.html", "pareto.svg", "pareto.png")
_RUN_GLOBS = ("records*.arrows", ".loadgen-write-test-*")


def run_files(run_dir: Path) -> list[Path]:
    """loadgen's own files in ``run_dir`` (a sweep's too); nothing else in the folder."""
    names = {*_RUN_FILES, *(name + ".tmp" for name in _RUN_FILES)}
    found = {p for p in run_dir.iterdir() if p.name in names} | {p for g in _RUN_GLOBS for p in run_dir.glob(g)}
    return sorted(p for p in found if p.is_symlink() or p.is_file())


def make_folder(path: Path, flag: str = "--out", *, force: bool = False) -> Path:
    """The folder a new run (or sweep) writes to (``run_folder.writable_folder``). One that already
    holds a run (run.json, records.parquet or a records stream) is refused in one line unless
    ``force``, which first removes that run's files (``run_files``: loadgen's own, nothing else
    there); a run still being written there is refused even so (``run_folder.replace_run``)."""
    if path.is_dir():
        files = run_files(path)
        if any(p.name in ("run.json", PARQUET_NAME) or p.suffix == ".arrows" for p in files):
            try:
                state = read_run_state(path).state
            except (ConfigError, SpecError):
                state = "unknown: no readable run.json"
            replace_run(path, files, state, flag, force)
    return writable_folder(path, flag)


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
