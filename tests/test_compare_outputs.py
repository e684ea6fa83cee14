"""compare.json and compare.md: the runs, their validity and traffic, every verdict with units in
its keys and lower-bound flags, standard JSON only; suspect lines first in Markdown; run-folder text
cleaned, escaped and redacted; ``compare --out`` onto a run folder writes beside the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hand_runs import make_run

from loadgen.analysis.compare import compare_runs
from loadgen.analysis.metrics import SLO
from loadgen.cli.main import main as cli_main
from loadgen.redaction import Secrets
from loadgen.report.compare_outputs import SCHEMA_VERSION, compare_json, compare_markdown

SLO_500 = SLO(ttft_ms=500.0)
FP = "3f9a1b2c" * 8
KEY = "zq9-THE-KEY-0123456789"  # not key-like by shape: only the command's secrets remove it


def walk(value: Any) -> list[Any]:
    """Every scalar and key in a JSON document."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in (k, *walk(v))]
    if isinstance(value, list):
        return [x for v in value for x in walk(v)]
    return [value]


def test_json_holds_runs_traffic_and_verdicts_in_standard_json(tmp_path: Path) -> None:
    client = {"traffic_fingerprint_unsalted": FP, "traffic_fingerprint": "ab" * 32}
    a = make_run(tmp_path / "a", [50.0] * 400, meta={"client": client, "salt": "x"})
    b = make_run(tmp_path / "b", [60.0] * 400, failed=20, failed_status="timeout", meta={"client": client, "salt": "y"})
    data = compare_json(compare_runs([a, b], slo=SLO_500))
    assert data["schema_version"] == SCHEMA_VERSION and data["kind"] == "compare"
    assert (
        data["identical_traffic"] is True and data["identical_traffic_reason"] == "same traffic (fingerprint 3f9a1b2c…)"
    )
    assert data["traffic"]["basis"] == "traffic_fingerprint_unsalted" and data["traffic"]["fingerprint"] == FP
    run_a, run_b = data["runs"]
    assert (run_a["name"], run_a["id"], run_a["endpoint"], run_a["model"]) == ("a", "r", "http://127.0.0.1:1/v1", "m")
    assert run_a["traffic_fingerprint_unsalted"] == FP and run_a["state"] == "complete"
    assert all(set(w) == {"code", "message"} for w in run_b["validity"]["warnings"])
    assert "failed" in [w["code"] for w in run_b["validity"]["warnings"]]
    by = {(v["figure"], v["at"]): v for v in data["verdicts"]}
    ttft = by[("ttft_p99", "10 req/s")]
    assert ttft["unit"] == "ms" and ttft["winner"] == "a" and ttft["withheld"] is False
    va, vb = ttft["values"]
    assert (va["run"], va["value_ms"], va["lower_bound"]) == ("a", 50.0, False)
    # b's 20 failures never got a first token: censored, so its p99 is only a lower bound, its upper end open
    assert (vb["value_ms"], vb["lower_bound"], vb["hi_ms"], vb["hi_unbounded"]) == (60.0, True, None, True)
    peak = by[("peak_output_tps", None)]
    assert "value_tok_per_s" in peak["values"][0] and peak["values"][0]["hi_unbounded"] is True  # never saturated
    assert by[("best_goodput_at_slo", None)]["values"][0]["value_rps"] > 0
    scalars = walk(data)
    assert not [x for x in scalars if isinstance(x, str) and x.lower() in ("inf", "-inf", "nan", "infinity")]
    assert not [x for x in scalars if isinstance(x, float) and x != x]


def test_a_suspect_run_names_no_winner_and_says_why(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [50.0] * 400)
    b = make_run(tmp_path / "b", [1300.0] * 400, lag_ms=1212.0)
    c = compare_runs([a, b], slo=SLO_500)
    data = compare_json(c)
    assert data["identical_traffic"] is None and "no request fingerprint" in data["identical_traffic_reason"]
    run_b = data["runs"][1]
    assert run_b["validity"]["state"] == "suspect" and "client_lag" in run_b["validity"]["codes"]
    assert run_b["withholds_winners"] is True and data["runs"][0]["withholds_winners"] is False
    for v in data["verdicts"]:
        assert v["winner"] is None
    good = next(v for v in data["verdicts"] if v["figure"] == "best_goodput_at_slo")
    assert good["withheld"] is True and good["withheld_why"].startswith("b is suspect (schedule lag p99 is 1212.0 ms")
    assert data["suspects"][0].startswith("SUSPECT: b (client_lag)")

    md = compare_markdown(c)
    lines = md.splitlines()
    first_table = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    suspect = next(i for i, ln in enumerate(lines) if "SUSPECT: b (client\\_lag)" in ln)
    traffic = next(i for i, ln in enumerate(lines) if "same traffic settings" in ln)
    assert suspect < traffic < first_table
    assert "withheld (suspect)" in lines[first_table + 2]


def test_markdown_cells_show_lower_bounds_and_hold_their_columns(tmp_path: Path) -> None:
    evil = "m|x <img src=x onerror=alert(1)> [l](http://e) `c` \x1b[31m\u202e"
    a = make_run(tmp_path / "a", [50.0] * 400, model=evil)
    b = make_run(tmp_path / "b", [60.0] * 400, failed=20, failed_status="timeout")
    md = compare_markdown(compare_runs([a, b], names=["a|1", "b*2"]))
    assert "<img" not in md and "\x1b" not in md and "\u202e" not in md
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    widths = {ln.replace("\\|", "").count("|") for ln in table[:-4]}  # the verdict tables; the runs table after
    assert len(widths) == 1
    ttft = next(ln for ln in table if ln.startswith("| TTFT p99 at 10 req/s"))
    assert "≥ 60" in ttft and "**a\\|1**" in ttft and "unbounded" in ttft


def test_every_output_is_redacted_with_the_commands_secrets(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [50.0] * 300, model=f"echo {KEY}")
    b = make_run(tmp_path / "b", [60.0] * 300)
    c = compare_runs([a, b])
    sec = Secrets.of(api_key=KEY)
    assert KEY not in orjson.dumps(compare_json(c, sec)).decode()
    assert KEY not in compare_markdown(c, sec)
    assert KEY in orjson.dumps(compare_json(c)).decode()  # what the redaction removes is really there


def test_cli_writes_json_and_markdown_beside_the_html_even_in_a_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    a = make_run(tmp_path / "a", [50.0] * 300, model=f"echo {KEY}")
    b = make_run(tmp_path / "b", [60.0] * 300)
    run_json = (a / "run.json").read_bytes()
    assert cli_main(["compare", str(a), str(b), "--out", str(a)]) == 0  # a run folder: compare adds its files
    assert (a / "run.json").read_bytes() == run_json
    for name in ("compare.html", "compare.json", "compare.md"):
        assert KEY not in (a / name).read_text(), name
    assert orjson.loads((a / "compare.json").read_bytes())["schema_version"] == SCHEMA_VERSION
    assert '<p class="sub" id="traffic">same traffic settings' in (a / "compare.html").read_text()
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("same traffic settings") and KEY not in out
    js, md = tmp_path / "ci" / "c.json", tmp_path / "ci" / "c.md"
    assert (
        cli_main(["compare", str(a), str(b), "--out", str(tmp_path / "o"), "--json", str(js), "--markdown", str(md)])
        == 0
    )
    assert orjson.loads(js.read_bytes())["runs"][1]["name"] == "b" and md.read_text().startswith("### loadgen compare")
    assert not (tmp_path / "o" / "compare.json").exists() and (tmp_path / "o" / "compare.html").exists()
    (tmp_path / "file").write_text("")
    assert cli_main(["compare", str(a), str(b), "--out", str(tmp_path / "file")]) == 2


@pytest.mark.parametrize("how", ["interrupted", "killed"])
def test_compare_of_an_interrupted_or_killed_run_says_so_on_its_first_line(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Interrupted: run.json says so. Killed: run.json still says ``running``, and the process
    that wrote it is gone (a PID that no longer exists)."""
    state = {"state": "interrupted", "interrupted_reason": "SIGTERM"} if how == "interrupted" else {}
    if how == "killed":
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        state = {"state": "running", "pid": gone.pid}
    a = make_run(tmp_path / "a", [50.0] * 300)
    b = make_run(tmp_path / "b", [60.0] * 300, meta=state)
    assert cli_main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    why = "SIGTERM" if how == "interrupted" else "the run's process ended before it finished"
    assert first.startswith(f"INTERRUPTED: b: this run was interrupted ({why})"), first
    md = (tmp_path / "o" / "compare.md").read_text()
    assert md.index("INTERRUPTED: b") < md.index("| ")  # above every table
