"""Traces are whole: a trace workload replays its whole (time-scaled) span by default, needs no
--rate, and run.json says ``trace`` and its speed; --duration / --requests cut it, and say so.

Every trace here is a small file the test writes (never /work/shared/traces).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadgen.cli.main import build_parser
from loadgen.cli.overrides import parse_set_items
from loadgen.cli.run_settings import arrival_label, resolve_workload, settings_from_args, what_is_sent
from loadgen.client import trace_cut
from loadgen.client.point import build_plan
from loadgen.client.settings import DEFAULT_DURATION_S, RunSettings
from loadgen.errors import ConfigError
from loadgen.schedule import Arrival
from loadgen.sim.process import SimProcess
from loadgen.workload.base import SyntheticChat
from loadgen.workload.load import builtin_specs, load_workload

T0 = datetime.datetime(2023, 11, 16, 18, 0, 0)


def azure_csv(path: Path, gaps_s: list[float], tokens: int = 16) -> Path:
    """An Azure-format trace (``TIMESTAMP,ContextTokens,GeneratedTokens``, no trailing newline)."""
    rows, t = ["TIMESTAMP,ContextTokens,GeneratedTokens"], T0
    for i, gap in enumerate([0.0, *gaps_s]):
        t += datetime.timedelta(seconds=gap)
        rows.append(f"{t.strftime('%Y-%m-%d %H:%M:%S.%f')}0,{tokens + i},4")
    path.write_text("\n".join(rows))
    return path


@pytest.fixture
def bursty(tmp_path: Path) -> Path:
    """An Azure-like trace of 200 requests over about 50 s: bursts of 10 within 0.1 s, then 2.5 s of quiet."""
    gaps = [2.5 if i % 10 == 0 else 0.01 for i in range(1, 200)]
    return azure_csv(tmp_path / "bursty.csv", gaps)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", "--endpoint", "http://127.0.0.1:8000/v1", *argv])


def plan_of(*argv: str) -> tuple[RunSettings, np.ndarray, str | None]:
    args = parse(*argv)
    workload = resolve_workload(args)
    settings = settings_from_args(args, workload)
    plan = build_plan(settings, workload)
    assert plan.offsets_ns is not None
    return settings, plan.offsets_ns, what_is_sent(args, settings, workload)


def test_a_trace_is_replayed_whole_by_default_where_10_s_used_to_cut_it(bursty: Path) -> None:
    whole = load_workload("azure", overrides={"path": str(bursty), "window": None}).offsets_ns()
    assert whole is not None and len(whole) == 200 and whole[-1] / 1e9 > 40
    before = int((whole < DEFAULT_DURATION_S * 1e9).sum())  # what the undocumented 10 s default sent
    assert before == 40

    settings, offs, line = plan_of("--workload", "azure", "--set", f"path={bursty}", "--set", "window=null")

    assert len(offs) == 200 and np.array_equal(offs, whole)  # every request, at the trace's own times
    assert settings.duration_s is None and settings.requests == 200
    assert settings.arrival.kind == "trace" and settings.arrival.speed == 1.0
    assert line == f"replaying all 200 requests over {whole[-1] / 1e9:,.1f} s at 1x speed"


@pytest.mark.parametrize(
    "cut, kept, named",
    [(["--duration", "10"], 40, "--duration 10"), (["--requests", "25"], 25, "--requests 25")],
)
def test_duration_or_requests_cut_a_trace_and_the_terminal_says_so(
    bursty: Path, cut: list[str], kept: int, named: str
) -> None:
    settings, offs, line = plan_of("--workload", "azure", "--set", f"path={bursty}", "--set", "window=null", *cut)
    assert len(offs) == kept and settings.requests == kept
    assert line is not None
    assert line.startswith(f"replaying {kept} of 200 requests") and line.endswith(f"(cut by {named})")


def test_the_line_names_what_the_spec_itself_selects_of_the_file(bursty: Path) -> None:
    """The built-in azure spec replays a window of the file: the terminal says so, and how to get all of it."""
    _, offs, line = plan_of("--workload", "azure", "--set", f"path={bursty}", "--set", "window=20")
    assert len(offs) == 80
    assert line == (
        f"replaying all 80 requests over {offs[-1] / 1e9:,.1f} s at 1x speed; "
        "the spec's window 20 s selects 80 of the file's 200 rows (--set window=null for all)"
    )


def test_the_speed_scales_the_trace_and_run_json_records_it(bursty: Path) -> None:
    base = ["--workload", "azure", "--set", f"path={bursty}", "--set", "window=null"]
    _, normal, _ = plan_of(*base)
    fast, offs, line = plan_of(*base, "--speed", "2")
    assert np.array_equal(offs, np.rint(normal / 2).astype(np.int64))  # every gap halved
    assert fast.arrival == Arrival("trace", rate=fast.arrival.rate, speed=2.0)
    assert "at 2x speed" in str(fast.arrival) and line is not None and "at 2x speed" in line
    # --set speed=2 is the same knob
    by_set, offs2, _ = plan_of(*base, "--set", "speed=2")
    assert np.array_equal(offs2, offs) and by_set.arrival == fast.arrival
    from loadgen.client.settings import settings_json

    arrival = settings_json(fast)["arrival"]
    assert arrival["kind"] == "trace" and arrival["speed"] == 2.0 and "poisson" not in arrival["label"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rate", "1"], "--rate 1: workload azure is a trace that carries its own arrival times.*--speed"),
        (["--arrival", "poisson"], "--arrival poisson: workload azure is a trace"),
        (["--speed", "2", "--set", "speed=3"], "--speed X or --set speed=X, not both"),
        (["--warmup", "30", "--cooldown", "30"], "leave no measurement window in the trace's"),
    ],
)
def test_a_rate_or_arrival_for_a_trace_is_refused_not_ignored(bursty: Path, flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_of("--workload", "azure", "--set", f"path={bursty}", "--set", "window=null", *flags)


def test_a_trace_past_the_run_limits_is_one_error_naming_the_flag_that_cuts_it(
    tmp_path: Path, bursty: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forty_days = azure_csv(tmp_path / "long.csv", [40 * 86_400.0])
    args = ["--workload", "azure", "--set", f"path={forty_days}", "--set", "window=null"]
    with pytest.raises(ConfigError, match=r"spans 40.0 days.*cut it with --duration S or .* --speed X"):
        plan_of(*args)
    settings, offs, _ = plan_of(*args, "--duration", "60")  # cut, it runs
    assert len(offs) == 1 and settings.duration_s == 60

    monkeypatch.setattr(trace_cut, "MAX_REQUESTS", 100)
    with pytest.raises(ConfigError, match=r"holds 200 requests, more than a run's limit of 100.*--requests N"):
        plan_of("--workload", "azure", "--set", f"path={bursty}", "--set", "window=null")
    _, offs, _ = plan_of("--workload", "azure", "--set", f"path={bursty}", "--set", "window=null", "--requests", "100")
    assert len(offs) == 100


def test_the_plan_refuses_an_arrival_it_would_ignore(bursty: Path) -> None:
    trace = load_workload("azure", overrides={"path": str(bursty)})
    with pytest.raises(ConfigError, match="carries its own arrival times: arrival poisson @ 1 req/s would be ignored"):
        build_plan(RunSettings(None, None, arrival=Arrival("poisson", rate=1.0)), trace)
    with pytest.raises(ConfigError, match="has no arrival times of its own"):
        build_plan(RunSettings(None, None, arrival=Arrival("trace"), requests=5), SyntheticChat())
    with pytest.raises(ConfigError, match="--arrival trace: synthetic-chat has no arrival times of its own"):
        settings_from_args(parse("--arrival", "trace", "--rate", "1"), SyntheticChat())


def test_a_closed_loop_over_a_trace_sends_each_of_its_requests_once(bursty: Path) -> None:
    args = parse("--workload", "azure", "--set", f"path={bursty}", "--set", "window=null", "--concurrency", "4")
    workload = resolve_workload(args)
    settings = settings_from_args(args, workload)
    assert settings.arrival.kind == "closed" and settings.requests == 200 and settings.duration_s is None
    assert what_is_sent(args, settings, workload) == (
        "sending each of the workload's 200 requests once (closed loop: the trace's arrival times are not used)"
    )


def test_a_finite_untimed_trace_sends_every_session_and_labels_its_load_sessions_per_s(tmp_path: Path) -> None:
    convs = [
        {"id": str(i), "conversations": [{"from": h, "value": f"message {i} {h}"} for h in ("human", "gpt") * 2]}
        for i in range(7)
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    args = parse("--workload", "sharegpt", "--set", f"path={path}", "--rate", "0.5")
    workload = resolve_workload(args)
    settings = settings_from_args(args, workload)
    assert settings.requests == 7 and settings.duration_s is None
    assert what_is_sent(args, settings, workload) == "sending each of the workload's 7 sessions once"
    assert arrival_label(settings.arrival, "sessions/s") == "poisson @ 0.5 sessions/s"


def test_set_without_a_workload_is_refused() -> None:
    with pytest.raises(ConfigError, match="--set changes a workload spec: give --workload"):
        resolve_workload(parse("--rate", "1", "--set", "path=x.csv"))
    with pytest.raises(ConfigError, match="--speed changes a workload spec"):
        resolve_workload(parse("--rate", "1", "--speed", "2"))


def test_set_values_are_read_as_yaml_and_bad_items_are_one_line_errors() -> None:
    assert parse_set_items(["input.mean=300", "path=a.csv", "window=null", "models=[a, b]", "speed=2"]) == {
        "input.mean": 300,
        "path": "a.csv",
        "window": None,
        "models": ["a", "b"],
        "speed": 2,
    }
    for bad in ("novalue", "=3"):
        with pytest.raises(ConfigError, match="expected KEY=VALUE"):
            parse_set_items([bad])
    with pytest.raises(ConfigError, match="the value is not YAML"):
        parse_set_items(["x=[1,"])


def test_every_set_the_built_in_specs_tell_users_to_pass_run_accepts() -> None:
    """The workload files' own help text (``on the command line: --set path=...``) is true for run."""
    told = 0
    for name, spec in builtin_specs().items():
        for line in spec.read_text(encoding="utf-8").splitlines():
            if "--set " in line:
                item = line.split("--set ", 1)[1].split()[0]
                args = parse("--workload", name, "--set", item)
                assert "=" in item and args.set == [item]
                told += 1
    assert told >= 4  # the trace specs (azure, burstgpt, mooncake, sharegpt, agentic-trace)


def run_loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, env={**os.environ}, timeout=120
    )


def test_run_replays_a_whole_trace_and_run_json_says_trace(fixed_sim: SimProcess, tmp_path: Path) -> None:
    trace = azure_csv(tmp_path / "t.csv", [0.05] * 29)  # 30 requests over 1.45 s
    out = tmp_path / "run"
    r = run_loadgen(
        "run",
        "--endpoint",
        fixed_sim.url,
        "--workload",
        "azure",
        "--set",
        f"path={trace}",
        "--no-live",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "replaying all 30 requests over 1.4 s at 1x speed" in r.stdout
    meta = json.loads((out / "run.json").read_text())
    arrival = meta["settings"]["arrival"]
    assert arrival["kind"] == "trace" and arrival["speed"] == 1.0 and arrival["label"].startswith("trace replay")
    assert meta["client"]["records"] == 30
