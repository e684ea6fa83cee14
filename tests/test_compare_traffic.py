"""compare says whether the runs saw identical traffic: by request fingerprints when both runs
recorded them (the unsalted one first, so per-run salts do not matter), else by the settings that
decide the requests; the verdict line comes first on the terminal."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hand_runs import make_run, make_sweep
from rich.console import Console

from loadgen.analysis.compare import Comparison, compare_runs
from loadgen.analysis.metrics import SLO
from loadgen.cli.compare_cmd import print_comparison

FP_A = "3f9a1b2c" + "0" * 56
FP_B = "77b0c4d1" + "1" * 56
SLO_500 = SLO(ttft_ms=500.0)


def pair(tmp_path: Path, a: dict[str, Any], b: dict[str, Any]) -> Comparison:
    """Two valid single runs (a faster than b) with the given run.json extras."""
    return compare_runs(
        [make_run(tmp_path / "a", [50.0] * 400, meta=a), make_run(tmp_path / "b", [150.0] * 400, meta=b)], slo=SLO_500
    )


def salted(salt: str, **client: object) -> dict[str, Any]:
    return {"salt": salt, "workload": {"name": "w", "salt": salt}, "client": client}


def first_lines(c: Comparison, n: int = 1) -> list[str]:
    buf = io.StringIO()
    print_comparison(c, Console(file=buf, width=300))
    return buf.getvalue().splitlines()[:n]


def test_equal_unsalted_fingerprints_prove_the_same_traffic_whatever_the_salts(tmp_path: Path) -> None:
    c = pair(
        tmp_path,
        salted("r1", traffic_fingerprint_unsalted=FP_A, traffic_fingerprint="aa" * 32),
        salted("r2", traffic_fingerprint_unsalted=FP_A, traffic_fingerprint="bb" * 32),
    )
    t = c.same_traffic
    assert t is not None and (t.identical, t.basis, t.fingerprint) == (True, "traffic_fingerprint_unsalted", FP_A)
    assert first_lines(c) == ["same traffic (fingerprint 3f9a1b2c…)"]
    assert not c.traffic.suspect and c.suspects == []
    assert {v.metric: v.winner for v in c.verdicts}["TTFT p99 at 10 req/s"] == "a"


def test_different_fingerprints_are_different_traffic_even_with_the_same_settings(tmp_path: Path) -> None:
    c = pair(tmp_path, salted("r1", traffic_fingerprint_unsalted=FP_A), salted("r2", traffic_fingerprint_unsalted=FP_B))
    t = c.same_traffic
    assert t is not None and t.identical is False
    assert t.line == "traffic differs: request fingerprint 3f9a1b2c… vs 77b0c4d1…"
    assert c.traffic.codes == ("traffic_differs",)
    assert all(v.winner is None and v.withheld for v in c.verdicts)
    assert first_lines(c, 3) == [
        "SUSPECT: a and b sent different traffic (request fingerprint 3f9a1b2c… vs 77b0c4d1…): no winner is named",
        "no winner is named on figures from a suspect run or point",
        "traffic differs: request fingerprint 3f9a1b2c… vs 77b0c4d1…",
    ]


def test_salted_fingerprints_compare_only_runs_with_the_same_salt(tmp_path: Path) -> None:
    same_salt = pair(tmp_path / "1", salted("s", traffic_fingerprint=FP_A), salted("s", traffic_fingerprint=FP_A))
    assert same_salt.same_traffic is not None and same_salt.same_traffic.identical is True
    # different salts: salted fingerprints differ by design, so they prove nothing; the settings agree
    other_salt = pair(tmp_path / "2", salted("s1", traffic_fingerprint=FP_A), salted("s2", traffic_fingerprint=FP_B))
    t = other_salt.same_traffic
    assert t is not None and (t.identical, t.basis) == (None, "settings")
    assert not other_salt.traffic.suspect
    assert first_lines(other_salt)[0].startswith("same traffic settings (workload, seed, API, ignore_eos); no request")


def test_without_fingerprints_the_settings_decide_and_the_salt_does_not_count(tmp_path: Path) -> None:
    c = pair(tmp_path / "salts", salted("r1"), salted("r2"))
    assert c.same_traffic is not None and c.same_traffic.identical is None and not c.traffic.suspect
    assert c.mismatches == []  # different salts are expected between runs: no warning either
    seeds = pair(tmp_path / "seeds", {"settings": {"seed": 1}}, {"settings": {"seed": 2}})
    assert seeds.same_traffic is not None and seeds.same_traffic.identical is False
    assert seeds.same_traffic.line == "traffic differs: seed 1 vs 2"
    assert seeds.traffic.codes == ("traffic_differs",)
    assert first_lines(seeds, 3)[2] == "traffic differs: seed 1 vs 2"


def test_one_run_without_a_fingerprint_falls_back_to_the_settings(tmp_path: Path) -> None:
    c = pair(tmp_path, salted("r1", traffic_fingerprint_unsalted=FP_A), {"settings": {"api": "completions"}})
    t = c.same_traffic
    assert t is not None and (t.identical, t.basis, t.line) == (
        False,
        "settings",
        "traffic differs: api - vs completions",
    )


def test_a_sweep_compares_fingerprints_point_by_point(tmp_path: Path) -> None:
    points = [(10.0, [50.0] * 300, 0.0), (20.0, [60.0] * 300, 0.0)]
    fp = [{"traffic_fingerprint_unsalted": FP_A}, {"traffic_fingerprint_unsalted": FP_B}]
    a = make_sweep(tmp_path / "a", points, clients=fp)
    same = make_sweep(tmp_path / "same", points, clients=fp)
    other = make_sweep(tmp_path / "other", points, clients=[fp[0], {"traffic_fingerprint_unsalted": FP_A}])
    t = compare_runs([a, same]).same_traffic
    assert t is not None and t.identical is True
    assert t.line == "same traffic (fingerprints match at all 2 points; first 3f9a1b2c…)"
    t = compare_runs([a, other]).same_traffic
    assert t is not None and t.identical is False
    assert t.line == "traffic differs: point 1 request fingerprint 77b0c4d1… vs 3f9a1b2c…"


def test_three_runs_name_the_pair_that_differs(tmp_path: Path) -> None:
    runs = [
        make_run(tmp_path / n, [50.0] * 300, meta={"settings": {"seed": s}}) for n, s in (("a", 1), ("b", 1), ("c", 2))
    ]
    t = compare_runs(runs).same_traffic
    assert t is not None and t.line == "traffic differs: a vs c: seed 1 vs 2"
    assert t.differences == ("a vs c: seed 1 vs 2",)


@pytest.mark.parametrize("value", ["\x1b[31mred\x1b[0m", "\u202eevil"])
def test_values_from_run_folders_are_shown_clean(tmp_path: Path, value: str) -> None:
    c = pair(tmp_path, {"settings": {"seed": value}}, {"settings": {"seed": 2}})
    assert c.same_traffic is not None
    assert "\x1b" not in c.same_traffic.line and "\u202e" not in c.same_traffic.line
    assert c.same_traffic.line.endswith(" vs 2")


def test_fingerprints_of_runs_that_asked_for_different_models_prove_nothing(tmp_path: Path) -> None:
    """Each request body names its model: two servers naming one model differently get different
    fingerprints by design, so the settings decide (and agree) and a winner may still be named."""
    c = pair(
        tmp_path,
        {**salted("r1", traffic_fingerprint_unsalted=FP_A), "model": "llama-8b"},
        {**salted("r2", traffic_fingerprint_unsalted=FP_B), "model": "meta-llama/Llama-3.1-8B"},
    )
    t = c.same_traffic
    assert t is not None and (t.identical, t.basis) == (None, "settings") and not c.traffic.suspect
    assert t.line.endswith(
        "request fingerprints cannot prove it: each request names its model (llama-8b vs meta-llama/Llama-3.1-8B)"
    )
    assert {v.metric: v.winner for v in c.verdicts}["TTFT p99 at 10 req/s"] == "a"


def test_a_fingerprint_difference_counts_the_requests_sent(tmp_path: Path) -> None:
    c = pair(
        tmp_path,
        salted("r", traffic_fingerprint_unsalted=FP_A, traffic_requests=400),
        salted("r", traffic_fingerprint_unsalted=FP_B, traffic_requests=398),
    )
    assert c.same_traffic is not None
    assert (
        c.same_traffic.line == "traffic differs: request fingerprint 3f9a1b2c… vs 77b0c4d1… (400 vs 398 requests sent)"
    )
