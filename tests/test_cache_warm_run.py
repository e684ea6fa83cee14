"""A prefix cache warm before the run, end to end: the same prompts sent twice (a given salt) to one
simulated engine with its prefix cache on. The first run meets a cold cache; the second finds its
prompts cached, and its summary.json, terminal and report say ``cache_warm`` first."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.cli.main import main
from loadgen.sim.process import start_sim


def run_once(url: str, out: Path, salt: str, *, report: bool = True) -> tuple[list[str], str]:
    args = ["run", "--endpoint", url, "--salt", salt, "--seed", "5", "--requests", "24", "--rate", "30"]
    args += ["--input-tokens", "256", "--output-tokens", "4", "--out", str(out), "--no-live"]
    assert main(args if report else [*args, "--no-report"]) == 0
    summary = orjson.loads((out / "summary.json").read_bytes())
    return summary["validity"]["codes"], (out / "report.html").read_text() if report else ""


def test_a_second_run_of_the_same_prompts_is_flagged_cache_warm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_sim(["--gpu", "h100", "--model", "llama-3.1-8b", "--prefix-cache", "on"]) as sim:
        cold, _ = run_once(sim.url, tmp_path / "first", "samesalt1", report=False)
        first_lines = capsys.readouterr().out.splitlines()
        warm, html = run_once(sim.url, tmp_path / "second", "samesalt1")
        second_lines = capsys.readouterr().out.splitlines()
    assert "cache_warm" not in cold and not any("cache_warm" in line for line in first_lines[:3])
    assert "cache_warm" in warm
    assert "cache_warm" in second_lines[0], second_lines[:2]  # said first, not in a footnote
    assert "cache_warm" in html
