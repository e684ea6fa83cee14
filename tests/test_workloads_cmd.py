"""``loadgen workloads list | show | preview``: sends nothing, tells what would be sent."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from loadgen.cli.workload_preview import preview_stats
from loadgen.cli.workloads_cmd import add_parser
from loadgen.errors import SpecError
from loadgen.workload.load import load_workload


def main(argv: list[str]) -> int:
    """This command alone (as loadgen.cli.main wires it), independent of the others."""
    parser = argparse.ArgumentParser(prog="loadgen")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workloads", "list"]) == 0
    out = capsys.readouterr().out
    assert "chat-multiturn" in out and "agentic" in out and "mooncake" in out
    assert main(["workloads", "show", "rag"]) == 0
    assert "zipf_alpha:" in capsys.readouterr().out


def test_preview_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workloads", "preview", "chat-multiturn", "--n", "20", "--json", "--set", "turns=3"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["sessions"] == 20 and stats["requests"] == 60
    assert stats["turns_per_session"]["max"] == 3
    assert 0.5 < stats["reuse"]["within_session"] < 1 and stats["reuse"]["shared_system_prompt"]
    assert main(["workloads", "preview", "rag", "--n", "10"]) == 0
    out = capsys.readouterr().out
    assert "prompt tokens" in out and "doc tokens seen before" in out


def test_preview_of_a_trace_reports_arrivals(tmp_path: Path) -> None:
    rows = [{"timestamp": t, "input_length": 10, "output_length": 3, "hash_ids": [1]} for t in (0, 0, 0, 4000)]
    (tmp_path / "mc.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    spec = tmp_path / "mc.yaml"
    spec.write_text("kind: trace\nformat: mooncake\npath: mc.jsonl\n")
    stats = preview_stats(load_workload(str(spec)), 100)
    assert stats["sessions"] == 4 and stats["arrivals"]["duration_s"] == 4.0
    assert stats["arrivals"]["rate_per_s"] == pytest.approx(0.75)
    assert stats["arrivals"]["gap_cv"] > 1


def test_preview_errors_name_the_field() -> None:
    with pytest.raises(SpecError, match=r"override input\.mena: unknown key \(did you mean 'mean'\?\)"):
        main(["workloads", "preview", "chat", "--set", "input.mena=3"])
