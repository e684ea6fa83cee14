"""A distributed run (a master and two workers, separate local processes on loopback) sends what one process sends.

The master resolves the run as a single process would and hands shard i of n to each
worker; the records come home onto the master's clock. So the merged records hold exactly
the requests (ids, sessions, turns, scheduled instants from the start) of a single-process
run of the same seed, the same request bytes (the traffic fingerprint), and a summary that
agrees within timing noise. One worker is started before its master listens (it connects once
the master does), the other joins late: the master waits for ``--expect-workers``. A master
whose workers never come gives up in one line, exit 2. Locust is never imported here:
tests/distributed_procs.py starts every process as a command.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pyarrow.compute as pc
import pytest

from loadgen.analysis.run_summary import summarize_run
from loadgen.records import read_records
from loadgen.sim.process import SimProcess
from tests.distributed_procs import LOADGEN, Proc, cleaning, run_argv, start_worker

RUN = ("--rate", "16", "--duration", "2", "--seed", "11", "--drain", "20")


def _run_json(out: Path) -> dict[str, Any]:
    meta: dict[str, Any] = orjson.loads((out / "run.json").read_bytes())
    return meta


def _requests(out: Path) -> list[tuple[int, int, int, int]]:
    """(request, session, turn, t_sched from the schedule's start) of every record."""
    start = _run_json(out)["client"]["clock_anchor"]["start_perf_ns"]
    d = read_records(out).select(["request", "session", "turn", "t_sched"]).to_pydict()
    return sorted(zip(d["request"], d["session"], d["turn"], [t - start for t in d["t_sched"]], strict=True))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def runs(fixed_sim: SimProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A single-process run and a master with two workers, side by side: the first worker starts with
    the master, before it listens (it connects once the master does), the second once the master waits."""
    logs = tmp_path_factory.mktemp("logs")
    single_out, dist_out = logs / "single", logs / "dist"
    lonely = [*run_argv(fixed_sim.url, logs / "lonely", *RUN, "--master", "--master-bind-port", "0")]
    lonely += ["--expect-workers", "2", "--expect-workers-timeout", "1"]
    port = _free_port()
    with cleaning() as procs:
        procs.append(single := Proc(run_argv(fixed_sim.url, single_out, *RUN), logs, "single"))
        procs.append(alone := Proc(lonely, logs, "lonely"))  # its workers never come
        flags = ("--master", "--master-bind-port", str(port), "--expect-workers", "2")
        procs.append(master := Proc(run_argv(fixed_sim.url, dist_out, *RUN, *flags), logs, "master"))
        procs.append(start_worker(port, logs, "w0"))
        master.wait_for(re.compile(r"master: waiting for 2 workers"))
        procs.append(start_worker(port, logs, "w1"))  # it joins late: nothing is sent before it is there
        codes = {"single": single.wait(), "master": master.wait()}
        codes.update({f"w{i}": w.wait(20) for i, w in enumerate(procs[3:])})
        lonely_code = alone.wait()
    return {
        "single": single_out,
        "dist": dist_out,
        "codes": codes,
        "master": master,
        "lonely": (lonely_code, alone.stderr(), logs / "lonely"),
    }


def test_every_process_ended_well(runs: dict[str, Any]) -> None:
    assert runs["codes"] == {"single": 0, "master": 0, "w0": 0, "w1": 0}, runs["master"].stderr()[-2000:]


def test_merged_records_hold_the_single_process_requests(runs: dict[str, Any]) -> None:
    single, dist = _requests(runs["single"]), _requests(runs["dist"])
    assert len(single) > 10
    assert dist == single


def test_the_same_request_bytes_were_sent(runs: dict[str, Any]) -> None:
    one, many = _run_json(runs["single"])["client"], _run_json(runs["dist"])["client"]
    assert many["traffic_fingerprint"] == one["traffic_fingerprint"]
    assert many["traffic_requests"] == one["traffic_requests"]


def test_both_shards_came_home(runs: dict[str, Any]) -> None:
    shards = read_records(runs["dist"]).column("shard").to_pylist()
    assert set(shards) == {0, 1}
    assert abs(shards.count(0) - shards.count(1)) <= 1  # sessions i, i+2, ...: round robin


def test_run_json_lists_each_worker(runs: dict[str, Any]) -> None:
    client = _run_json(runs["dist"])["client"]
    workers = sorted(client["workers"], key=lambda w: w["shard"])
    assert [w["shard"] for w in workers] == [0, 1]
    for w in workers:
        assert w["host"] and w["worker_pid"] and w["engine_pid"] and w["worker_pid"] != w["engine_pid"]
        assert abs(w["clock_offset_ms"]) < 50.0  # one machine's clock against itself, within a loaded box's trips
        assert 0.0 <= w["clock_uncertainty_ms"] < 50.0
        assert w["schedule_lag_p99_ms"] is not None
        assert "cpu_utilisation" in w or "cpu_utilisation_why_not" in w
    assert client["workers_lost"] == []
    assert client["distributed"]["ingest"]["records"] == client["records"]


@pytest.mark.timing
def test_the_summary_agrees_within_timing_noise(runs: dict[str, Any]) -> None:
    one = summarize_run(runs["single"], write=False).summary
    many = summarize_run(runs["dist"], write=False).summary
    assert many.requests == one.requests and many.ok == one.ok == one.requests
    tokens = [int(pc.sum(read_records(out).column("output_tokens")).as_py()) for out in (runs["single"], runs["dist"])]
    assert tokens[0] == tokens[1] > 0  # the same requests, every answer whole (EOS ignored)
    # the window closes on the clock: a token arriving at its edge falls either side
    window = many.output_tokens_in_window, one.output_tokens_in_window
    assert abs(window[0] - window[1]) <= 0.05 * window[1], window
    # the simulator's fixed model: TTFT 50 ms; both runs shared it at once, on a box loaded to 8
    a, b = many.ttft.pct(50)[0], one.ttft.pct(50)[0]
    assert abs(a - b) < 30.0 + 0.5 * max(a, b), (a, b)


def test_a_master_whose_workers_never_come_gives_up_in_one_line(runs: dict[str, Any]) -> None:
    code, stderr, out = runs["lonely"]
    assert code == 2
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("loadgen: error: --expect-workers 2: only 0 workers connected")
    assert "nothing was sent" in last and "Traceback" not in stderr
    assert not list(out.glob("records*"))


def test_neither_help_nor_run_imports_locust() -> None:
    code = (
        "import sys; from loadgen.cli.main import build_parser; build_parser(); "
        "import loadgen.cli.run_cmd, loadgen.cli.sweep_cmd, loadgen.client.run, loadgen.distributed.master; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('locust', 'gevent', 'zmq')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    help_out = subprocess.run([*LOADGEN, "worker", "--help"], capture_output=True, text=True, timeout=60)
    assert "--master-host" in help_out.stdout
