"""`import loadgen` is the public API: a pinned list of names, each documented, cheap to import, and working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import loadgen

PUBLIC = [
    "Arrival",
    "AutoSearch",
    "Comparison",
    "FixedModel",
    "LoadgenError",
    "Outcome",
    "Profile",
    "RooflineModel",
    "RunAnalysis",
    "RunSettings",
    "SimConfig",
    "Sizing",
    "SweepPlan",
    "SweepSettings",
    "SyntheticChat",
    "Timeouts",
    "__version__",
    "compare_runs",
    "gate_run",
    "load_profile",
    "load_workload",
    "read_run",
    "run_point",
    "run_sweep",
    "simulator",
]


def test_the_public_names_are_pinned_and_sorted() -> None:
    assert loadgen.__all__ == PUBLIC == sorted(PUBLIC)
    assert dir(loadgen) == PUBLIC


@pytest.mark.parametrize("name", [n for n in PUBLIC if n != "__version__"])
def test_every_public_name_resolves_and_says_what_it_is_for(name: str) -> None:
    value = getattr(loadgen, name)
    assert (value.__doc__ or "").strip(), f"loadgen.{name} has no docstring"


def test_a_private_name_is_not_reachable_through_the_package() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Engine'"):
        loadgen.Engine  # noqa: B018 - the lookup is the test


def test_importing_loadgen_loads_nothing_heavy() -> None:
    code = (
        "import sys, loadgen\n"
        "heavy = [m for m in ('numpy', 'aiohttp', 'pyarrow', 'scipy', 'matplotlib', 'rich') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == ""


def _settings(url: str, seed: int = 0) -> loadgen.RunSettings:
    return loadgen.RunSettings(
        endpoint=url,
        model=None,
        arrival=loadgen.Arrival("poisson", rate=40.0),
        duration_s=None,
        requests=24,
        seed=seed,
        lag_limit_ms=50.0,  # a loaded test box must not make the gate below inconclusive
    )


def test_run_read_gate_and_compare_from_python(tmp_path: Path) -> None:
    """A notebook's whole loop, against the in-process simulator: the figures are the report's own."""
    workload = loadgen.SyntheticChat(input_tokens=32, output_tokens=8)
    with loadgen.simulator(loadgen.FixedModel(0.01, 0.002)) as url:
        a = loadgen.run_point(_settings(url), tmp_path / "a", workload=workload)
        b = loadgen.run_point(_settings(url), tmp_path / "b", workload=workload)
    assert b.table.num_rows == 24

    assert a.table.num_rows == 24 and not a.is_sweep
    written = orjson.loads((tmp_path / "a" / "summary.json").read_bytes())["summary"]
    from loadgen.analysis.metrics import summary_to_json

    assert orjson.loads(orjson.dumps(summary_to_json(a.points[0].summary), option=orjson.OPT_SERIALIZE_NUMPY)) == (
        written
    )
    again = loadgen.read_run(tmp_path / "a")
    assert summary_to_json(again.points[0].summary) == summary_to_json(a.points[0].summary)

    profile = tmp_path / "slo.yaml"
    profile.write_text(
        "name: loose\nmin_samples: 10\nmin_duration_s: 0\n"
        "criteria:\n  - {name: TTFT p50, metric: ttft, statistic: p50, bound: '<= 5000 ms'}\n"
    )
    outcome = loadgen.gate_run(tmp_path / "a", profile)
    assert (outcome.status, outcome.exit_code) == ("pass", 0), [c.message for c in outcome.cases]

    comparison = loadgen.compare_runs([tmp_path / "a", tmp_path / "b"])
    assert comparison.names == ["a", "b"] and comparison.mismatches == []  # the same seeded traffic


def test_a_sweep_from_python_is_read_back_as_its_points(tmp_path: Path) -> None:
    rates = tuple(loadgen.Arrival("poisson", rate=r) for r in (10.0, 20.0))
    plan = loadgen.SweepPlan(mode="rates", arrivals=rates, point_duration_s=1.0, warmup_s=0.2, drain_s=5.0)
    with loadgen.simulator(loadgen.FixedModel(0.005, 0.001)) as url:
        settings = loadgen.SweepSettings(base=loadgen.RunSettings(endpoint=url, model=None, duration_s=1.0), plan=plan)
        sweep = loadgen.run_sweep(settings, tmp_path / "s", workload="chat")
    assert sweep.is_sweep and [p.rate for p in sweep.points] == [10.0, 20.0]
    assert [p.summary.requests for p in loadgen.read_run(tmp_path / "s").points] == [
        p.summary.requests for p in sweep.points
    ]
