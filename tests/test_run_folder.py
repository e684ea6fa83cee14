"""A run folder's state (running, complete, interrupted) and --out onto a folder that holds a run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loadgen.errors import ConfigError, SpecError
from loadgen.run_folder import (
    PROCESS_ENDED,
    RunState,
    make_folder,
    mark_finished,
    mark_running,
    point_states,
    process_alive,
    read_run_state,
    run_files,
    run_state_of,
    write_json,
)

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def running_meta() -> dict[str, Any]:
    meta: dict[str, Any] = {"run_id": "r1"}
    mark_running(meta)
    return meta


def dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --------------------------------------------------------------------------- state


def test_a_run_in_progress_reads_as_running() -> None:
    meta = running_meta()
    assert (meta["state"], meta["pid"]) == ("running", os.getpid())
    assert "started_wall_ns" in meta
    assert run_state_of(meta) == RunState("running", None)


@pytest.mark.parametrize(
    ("reason", "state"),
    [
        (None, RunState("complete")),
        ("SIGINT", RunState("interrupted", "SIGINT")),
        ("second Ctrl-C: drain cut short", RunState("interrupted", "second Ctrl-C: drain cut short")),
    ],
)
def test_a_finished_run_reads_as_it_was_marked(reason: str | None, state: RunState) -> None:
    meta = running_meta()
    mark_finished(meta, reason)
    assert run_state_of(meta) == state
    assert ("interrupted_reason" in meta) == (reason is not None)


def test_a_run_marked_complete_after_an_interruption_drops_the_old_reason() -> None:
    meta = running_meta()
    mark_finished(meta, "SIGTERM")
    mark_finished(meta)
    assert "interrupted_reason" not in meta and run_state_of(meta) == RunState("complete")


def test_a_running_run_whose_process_ended_reads_as_interrupted() -> None:
    meta = running_meta() | {"pid": dead_pid(), "pid_started": None}
    assert run_state_of(meta) == RunState("interrupted", PROCESS_ENDED)


@linux_only
def test_a_reused_pid_is_not_taken_for_the_run() -> None:
    """Same pid as this live process, but that pid started at another time: another process."""
    meta = running_meta()
    meta["pid_started"] += 1
    assert run_state_of(meta) == RunState("interrupted", PROCESS_ENDED)


@linux_only
def test_a_run_from_another_boot_is_not_running() -> None:
    meta = running_meta() | {"boot_id": "00000000-0000-0000-0000-000000000000"}
    assert run_state_of(meta).state == "interrupted"


@linux_only
def test_a_zombie_process_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while _proc_state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _proc_state(child.pid) == "Z"
        assert not process_alive(child.pid)
    finally:
        child.wait()


def _proc_state(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return raw[raw.rindex(b")") + 2 :].split()[0].decode()


@pytest.mark.parametrize("pid", [0, -1, "123", None, True, 2**80])
def test_a_pid_that_is_no_pid_is_not_alive(pid: object) -> None:
    assert not process_alive(pid)


def test_an_older_run_json_without_a_state_reads_as_complete() -> None:
    assert run_state_of({"run_id": "old", "client": {"interrupted": False}}) == RunState("complete")


def test_an_older_run_json_whose_client_was_stopped_reads_as_interrupted() -> None:
    assert run_state_of({"client": {"interrupted": True, "stop_reason": "SIGINT"}}) == RunState("interrupted", "SIGINT")
    assert run_state_of({"client": {"interrupted": True}}).state == "interrupted"


def test_an_interrupted_run_without_a_reason_says_so() -> None:
    assert run_state_of({"state": "interrupted"}) == RunState("interrupted", "interrupted (no reason recorded)")


def test_an_unknown_state_is_a_one_line_spec_error() -> None:
    with pytest.raises(SpecError, match=r"^run.json: state: expected one of running, complete, interrupted, found 'x"):
        run_state_of({"state": "x\nsecond line"})


def test_a_sweeps_points_take_the_sweeps_end() -> None:
    """The process ended during point 2: points 0 and 1 finished, point 2 was never finalised."""
    meta = running_meta() | {"pid": dead_pid()}
    meta["points"] = [{"state": "complete"}, {"state": "interrupted", "interrupted_reason": "SIGINT"}]
    meta["points"].append({"state": "running"})
    assert run_state_of(meta) == RunState("interrupted", PROCESS_ENDED)
    assert point_states(meta) == [
        RunState("complete"),
        RunState("interrupted", "SIGINT"),
        RunState("interrupted", PROCESS_ENDED),
    ]


def test_read_run_state_reads_the_folders_run_json(tmp_path: Path) -> None:
    meta = running_meta()
    write_json(tmp_path / "run.json", meta)
    assert read_run_state(tmp_path) == RunState("running")
    mark_finished(meta, "SIGTERM")
    write_json(tmp_path / "run.json", meta)
    assert read_run_state(tmp_path) == RunState("interrupted", "SIGTERM")


def test_read_run_state_on_a_folder_without_run_json_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run folder"):
        read_run_state(tmp_path)


# --------------------------------------------------------------------------- --out onto a folder


def a_run(folder: Path, state: str = "complete") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"run_id": "old"}
    mark_running(meta)
    if state != "running":
        mark_finished(meta, None if state == "complete" else "SIGINT")
    write_json(folder / "run.json", meta)
    for name in ("records.parquet", "summary.json", "report.html", "pareto.svg", "pareto.png", "server_metrics.jsonl"):
        (folder / name).write_text("old")


@pytest.mark.parametrize("setup", ["missing", "empty", "other files"])
def test_a_folder_without_a_run_is_fine(tmp_path: Path, setup: str) -> None:
    out = tmp_path / "out"
    if setup != "missing":
        out.mkdir()
    if setup == "other files":
        (out / "notes.txt").write_text("mine")
        (out / "compare.html").write_text("a comparison is no run")
    assert make_folder(out) == out and out.is_dir()
    assert (out / "notes.txt").exists() == (setup == "other files")


@pytest.mark.parametrize(
    ("state", "word"), [("complete", "complete"), ("interrupted", "interrupted"), ("dead", "interrupted")]
)
def test_a_folder_holding_a_run_is_refused_in_one_line(tmp_path: Path, state: str, word: str) -> None:
    a_run(tmp_path, "running" if state == "dead" else state)
    if state == "dead":
        write_json(tmp_path / "run.json", running_meta() | {"pid": dead_pid()})
    with pytest.raises(ConfigError) as e:
        make_folder(tmp_path)
    assert str(e.value) == (
        f"--out {tmp_path} already holds a run (state: {word}); choose another folder or pass --force to replace it"
    )
    assert (tmp_path / "records.parquet").read_text() == "old"


@pytest.mark.parametrize("name", ["records.arrows", "records-w01.arrows", "records-p003.arrows", "records.parquet"])
def test_records_alone_mark_a_run(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(ConfigError, match=r"already holds a run \(state: unknown: no readable run.json\)"):
        make_folder(tmp_path)


def test_force_removes_only_loadgens_own_files(tmp_path: Path) -> None:
    a_run(tmp_path, "interrupted")
    for name in ("records-p000.arrows", "records-p001-w00.arrows", "run.json.tmp", "records.parquet.tmp"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "records.csv").write_text("mine too")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "records.arrows").write_bytes(b"not at the top level: not ours to remove")
    assert make_folder(tmp_path, force=True) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "plots", "records.csv"]
    assert (tmp_path / "plots" / "records.arrows").exists()


def test_run_files_lists_a_sweeps_files_and_nothing_else(tmp_path: Path) -> None:
    a_run(tmp_path)
    (tmp_path / "records-p002-w01.arrows").write_bytes(b"")
    (tmp_path / "gate.xml").write_text("a CI file the user named")
    names = [p.name for p in run_files(tmp_path)]
    assert "records-p002-w01.arrows" in names and "run.json" in names and "gate.xml" not in names


def test_a_run_still_being_written_is_refused_even_with_force(tmp_path: Path) -> None:
    a_run(tmp_path, "running")  # this very process: alive
    with pytest.raises(ConfigError, match="a run is still being written there; choose another folder"):
        make_folder(tmp_path, force=True)
    assert (tmp_path / "run.json").exists()


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        make_folder(tmp_path / "out", force=True)


def test_the_flag_is_named_in_the_refusal(tmp_path: Path) -> None:
    a_run(tmp_path)
    with pytest.raises(ConfigError, match=rf"^--into {tmp_path} already holds a run"):
        make_folder(tmp_path, "--into")
