"""SLO profiles: every built-in loads, bounds carry units, and every mistake names file:line: field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadgen.conformance.slo import METRICS, builtin_profiles, load_profile, parse_bound
from loadgen.errors import SpecError

GOOD = """\
name: t
confidence: 0.9
min_samples: 10
slo:
  ttft_ms: 200
criteria:
  - name: TTFT p99
    metric: ttft
    statistic: p99
    bound: "<= 0.2 s"
  - metric: attainment
    bound: ">= 95 %"
  - metric: output_tps
    bound: ">= 30 tok/s"
    at: {rate: 4}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p


def test_builtin_profiles_all_load() -> None:
    names = set(builtin_profiles())
    assert {
        "interactive-chat",
        "agentic",
        "batch",
        "mlperf-llama3.1-8b",
        "mlperf-llama3.1-8b-interactive",
        "mlperf-llama2-70b",
    } <= names
    for name in names:
        prof = load_profile(name)
        assert prof.criteria and prof.name == name


def test_mlperf_profiles_match_the_published_bounds() -> None:
    for name, ttft, tpot in (
        ("mlperf-llama3.1-8b", 2000, 100),
        ("mlperf-llama3.1-8b-interactive", 500, 30),
        ("mlperf-llama2-70b", 2000, 200),
        ("mlperf-llama2-70b-interactive", 450, 40),
    ):
        prof = load_profile(name)
        got = {(c.metric, c.statistic): c.bound for c in prof.criteria}
        assert got[("ttft", "p99")] == ttft and got[("tpot", "p99")] == tpot
        assert prof.confidence == 0.99


def test_good_profile(tmp_path: Path) -> None:
    prof = load_profile(write(tmp_path, GOOD))
    ttft, att, tps = prof.criteria
    assert (ttft.op, ttft.bound, ttft.unit, ttft.percentile) == ("<=", 200.0, "ms", 99.0)
    assert (att.statistic, att.op, att.bound) == ("value", ">=", 95.0)
    assert tps.at is not None and tps.at.rate == 4.0 and str(tps.at) == "rate 4"
    assert prof.confidence == 0.9 and prof.min_samples == 10 and prof.slo is not None


@pytest.mark.parametrize(
    ("text", "metric", "want"),
    [
        ("<= 200 ms", "ttft", ("<=", 200.0)),
        ("<2s", "e2e", ("<=", 2000.0)),
        (">= 99.5 %", "success_rate", (">=", 99.5)),
        ("≤ 3 min", "session_duration", ("<=", 180.0)),
        (">= 1e3 tok/s", "output_tps", (">=", 1000.0)),
    ],
)
def test_parse_bound(text: str, metric: str, want: tuple[str, float]) -> None:
    assert parse_bound(text, METRICS[metric]) == want


@pytest.mark.parametrize(
    ("text", "metric"),
    [
        ("200", "ttft"),
        ("<= 200", "ttft"),
        ("<= 200 tok/s", "ttft"),
        (">= 0.99", "attainment"),
        (">= 150 %", "success_rate"),
        ("== 3 ms", "ttft"),
    ],
)
def test_parse_bound_rejects(text: str, metric: str) -> None:
    with pytest.raises(ValueError):
        parse_bound(text, METRICS[metric])


BAD = [
    # (replace this, with this, expected line, expected field, words in the problem)
    ("    statistic: p99\n", "    statistic: p99\n    threshold: 3\n", 10, "criteria[0].threshold", "unknown key"),
    ('bound: "<= 0.2 s"', 'bound: "<= 0.2"', 10, "criteria[0].bound", "unit"),
    ("metric: ttft", "metric: ttfx", 8, "criteria[0].metric", "use one of"),
    ("statistic: p99", "statistic: p100", 9, "criteria[0].statistic", "percentile"),
    ("    statistic: p99\n", "", 7, "criteria[0].statistic", "required"),
    ("confidence: 0.9", "confidence: 0.4", 2, "confidence", "between 0.5 and 1"),
    ("slo:\n  ttft_ms: 200\n", "", 9, "criteria[1].metric", "slo"),
    ("at: {rate: 4}", "at: {rate: 4, point: 1}", 15, "criteria[2].at", "exactly one"),
    ("min_samples: 10", "min_samples: ten", 3, "min_samples", "number"),
    ("name: t\n", "name: t\ncriterias: []\n", 2, "criterias", "unknown key"),
    ('bound: ">= 95 %"', "bound: >= 95 %", 12, "", "quote bounds"),
    ("  - metric: output_tps", "  - name: TTFT p99\n    metric: output_tps", 13, "criteria", "already used on line 7"),
]


@pytest.mark.parametrize(("old", "new", "line", "fld", "words"), BAD)
def test_bad_profiles_name_file_line_and_field(
    tmp_path: Path, old: str, new: str, line: int, fld: str, words: str
) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(SpecError) as e:
        load_profile(path)
    msg = str(e.value)
    m = re.match(rf"{re.escape(str(path))}:(\d+): (.*)", msg)
    assert m, msg
    assert int(m.group(1)) == line, msg
    assert m.group(2).startswith(f"{fld}: " if fld else ""), msg
    assert words in msg, msg


def test_unknown_profile_lists_builtins() -> None:
    with pytest.raises(SpecError, match="interactive-chat"):
        load_profile("no-such-profile")
