"""Multi-turn sessions through the commands, in virtual time (no server, seconds): ``--set``
reaches a sweep's workload as it reaches a run's, and a run's whole-session figures are in
summary.json, on the terminal and in report.html alike."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from loadgen.cli.main import main

VIRTUAL = ["--sim-virtual", "--no-live"]


def test_set_reaches_a_sweeps_workload(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    argv = ["sweep", *VIRTUAL, "--workload", "chat-multiturn", "--set", "turns=2", "--set", "think=0.1"]
    assert (
        main([*argv, "--rates", "1,2", "--point-duration", "4", "--warmup", "1", "--no-report", "--out", str(out)]) == 0
    )
    meta = json.loads((out / "run.json").read_text())
    assert meta["workload"]["turns"] == {"type": "fixed", "value": 2}
    turns = pq.read_table(out / "records.parquet", columns=["session", "turn"]).to_pydict()
    assert set(turns["turn"]) == {0, 1}  # two turns a session, no third


def _sessions_html(run: Path) -> str | None:
    found = re.search(r'<section id="sessions">(.*?)</section>', (run / "report.html").read_text(), re.S)
    return found.group(1) if found else None


def test_a_multi_turn_runs_sessions_are_in_its_summary_terminal_and_report(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "run"
    argv = ["run", *VIRTUAL, "--workload", "chat-multiturn", "--set", "turns=3", "--set", "think=0.1"]
    assert main([*argv, "--rate", "2", "--duration", "4", "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    s = json.loads((out / "summary.json").read_text())["sessions"]
    assert s["multi_turn"] and s["load_unit"] == "sessions/s" and s["turns"] == 3 * s["sessions"] > 0
    line = f"sessions: {s['sessions']} in the window"
    html = _sessions_html(out)
    assert html is not None and line in html and line in printed
    assert f"{s['turns']} scheduled, {s['turns_ok']} ok, {s['turns_not_sent']} not sent" in html


def test_a_single_turn_run_has_no_sessions_section(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", *VIRTUAL, "--input-tokens", "32", "--output-tokens", "8", "--rate", "2", "--duration", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    assert _sessions_html(out) is None
