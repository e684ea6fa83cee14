"""What the gate hands to CI: JUnit XML that follows the common schema, Markdown that escapes endpoint
text, standard JSON (no "inf" strings: null and an unbounded flag), censored figures shown as lower
bounds, and no secret in any output."""

from __future__ import annotations

import contextlib
import io
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
import pytest
from hand_runs import TTFT_P99, make_run, profile
from junit_schema import junit_problems

from loadgen.cli.main import main as cli_main
from loadgen.conformance.ci_outputs import md_escape, to_json, to_junit, to_markdown
from loadgen.conformance.gate import gate_run
from loadgen.conformance.slo import load_profile


def test_junit_parses_and_follows_the_schema(tmp_path: Path) -> None:
    evil = 'm<x>&\x1b[31m\x00"]]>'
    prof = load_profile(
        profile(
            tmp_path,
            TTFT_P99 + "  - {name: TTFT p50, metric: ttft, statistic: p50, "
            'bound: "<= 60 ms"}\n  - {metric: success_rate, '
            'bound: ">= 99 %"}\n',
        )
    )
    run = make_run(tmp_path / "r", [50.0] * 20 + [80.0] * 80, model=evil)
    out = gate_run(run, prof)
    root = ET.fromstring(to_junit(out).encode())
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases] == ["TTFT p99", "TTFT p50", "success_rate"]
    by = {c.get("name"): c for c in cases}
    failure = by["TTFT p50"].find("failure")
    assert failure is not None and failure.get("message")
    assert by["TTFT p99"].find("skipped") is not None and by["TTFT p99"].find("failure") is None
    assert suites[0].get("tests") == "3" and suites[0].get("failures") == "1" and suites[0].get("skipped") == "2"
    assert root.get("tests") == "3" and root.get("errors") == "0"
    for c in cases:
        assert c.get("classname") and c.get("time") is not None
    props = {p.get("name"): p.get("value") for p in suites[0].iter("property")}
    assert (props["model"] or "").startswith("m<x>&")


def test_markdown_escapes_endpoint_text(tmp_path: Path) -> None:
    evil = "<img src=x onerror=alert(1)> | [click](http://x) *b* `c` ~~s~~"
    esc = md_escape(evil)
    assert "<img" not in esc and "&lt;img" in esc
    for raw in ("|", "[", "]", "*", "`", "~"):
        assert f"\\{raw}" in esc
    assert "\n" not in md_escape("a\nb")
    prof = load_profile(profile(tmp_path, TTFT_P99))
    md = to_markdown(gate_run(make_run(tmp_path / "r", [50.0] * 300, model=evil), prof))
    assert "<img" not in md and "loadgen gate: PASS" in md
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len({ln.count(" | ") for ln in table[2:]}) == 1  # no cell split by an injected pipe


def test_cli_gate_exit_codes_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    prof = profile(tmp_path, TTFT_P99)
    ok = make_run(tmp_path / "ok", [50.0] * 300)
    short = make_run(tmp_path / "short", [50.0] * 30)
    junit, md, js = tmp_path / "o" / "j.xml", tmp_path / "o" / "s.md", tmp_path / "o" / "g.json"
    args = ["gate", str(ok), "--slo", str(prof), "--junit", str(junit), "--markdown", str(md), "--json", str(js)]
    assert cli_main(args) == 0
    ET.parse(junit)
    assert "PASS" in md.read_text() and orjson.loads(js.read_bytes())["exit_code"] == 0
    assert cli_main(["gate", str(short), "--slo", str(prof)]) == 3
    assert cli_main(["gate", str(short), "--slo", str(prof), "--inconclusive", "pass"]) == 0
    assert cli_main(["gate", str(ok), "--slo", str(tmp_path / "nope.yaml")]) == 2
    assert cli_main(["gate", str(tmp_path), "--slo", str(prof)]) == 2  # not a run folder
    summary = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli_main(["gate", str(ok), "--slo", "interactive-chat"]) == 3
    assert "interactive-chat" in summary.read_text()


def test_censored_samples_show_as_lower_bounds_in_every_output(tmp_path: Path) -> None:
    """5 of 105 requests never got a first token: TTFT p99 is only a lower bound (">= 50.00 ms"), its
    upper bound open; the data says so, and the reason counts the censored requests."""
    prof = load_profile(profile(tmp_path, TTFT_P99))
    out = gate_run(make_run(tmp_path / "r", [50.0] * 100, failed=5, failed_status="timeout"), prof)
    (case,) = out.cases
    assert case.status == "inconclusive"
    assert case.message.endswith("; 5 censored (requests never answered)")
    assert case.cell("measured") == ">= 50.00 ms"
    assert {k: case.data[k] for k in ("value", "lower_bound", "censored", "hi", "hi_unbounded", "lo_unbounded")} == {
        "value": 50.0,
        "lower_bound": True,
        "censored": 5,
        "hi": None,
        "hi_unbounded": True,
        "lo_unbounded": False,
    }
    exact = gate_run(make_run(tmp_path / "ok", [50.0] * 300), prof).cases[0]
    assert exact.cell("measured") == "50.00 ms" and exact.data["lower_bound"] is False and exact.data["censored"] == 0
    assert "censored" not in exact.message


def test_gate_json_is_standard_json_with_unbounded_flags(tmp_path: Path) -> None:
    prof = load_profile(profile(tmp_path, TTFT_P99))
    short = make_run(tmp_path / "short", [50.0] * 30)
    out = gate_run(short, prof, baseline=make_run(tmp_path / "base", [50.0] * 30))
    text = orjson.dumps(to_json(out)).decode()
    assert '"inf"' not in text and '"-inf"' not in text and "Infinity" not in text and "NaN" not in text
    slo, vs = (c.data for c in out.cases)
    assert slo["hi"] is None and slo["hi_unbounded"] is True
    assert vs["baseline_hi"] is None and vs["baseline_hi_unbounded"] is True and vs["baseline_lower_bound"] is False


def test_gate_outputs_redact_a_key_the_endpoint_echoed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key the environment holds never reaches the terminal or a file, even where the run's own
    texts (here its model name, as an endpoint reported it) carry it."""
    key = "zq9-THE-KEY-0123456789"  # not key-like by shape: only the command's secrets remove it
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    run = make_run(tmp_path / "r", [50.0] * 300, model=f"echo {key}")
    files = {"junit": tmp_path / "j.xml", "markdown": tmp_path / "s.md", "json": tmp_path / "g.json"}
    args = ["gate", str(run), "--slo", str(profile(tmp_path, TTFT_P99))]
    args += [x for k, v in files.items() for x in (f"--{k}", str(v))]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli_main(args) == 0
    assert "echo" in buf.getvalue() and key not in buf.getvalue()
    for path in files.values():
        assert "echo" in path.read_text() and key not in path.read_text(), path.name


def test_gate_junit_validates_against_the_common_schema(tmp_path: Path) -> None:
    """Pass, fail and inconclusive cases in two suites (SLO and baseline): junit-10.xsd's rules hold
    (no ``skipped`` on the root, counts on every suite)."""
    crit = TTFT_P99 + '  - {name: TTFT p50, metric: ttft, statistic: p50, bound: "<= 60 ms"}\n'
    crit += '  - {metric: success_rate, bound: ">= 90 %"}\n'
    prof = load_profile(profile(tmp_path, crit))
    run = make_run(tmp_path / "r", [50.0] * 20 + [80.0] * 80, failed=3)
    out = gate_run(run, prof, baseline=make_run(tmp_path / "base", [50.0] * 100))
    assert {c.status for c in out.cases} >= {"pass", "fail", "inconclusive"}
    assert {c.suite for c in out.cases} == {"slo", "baseline"}
    xml = to_junit(out)
    assert junit_problems(xml) == []
    root = ET.fromstring(xml)
    assert "skipped" not in root.attrib and all(s.get("skipped") is not None for s in root.findall("testsuite"))
