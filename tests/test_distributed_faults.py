"""A distributed run that loses a worker, or its master, mid-point; a distributed sweep stopped by SIGINT.

A worker killed mid-run stops heartbeating: the master finishes the point with the others,
records each request of the lost shard that has no record home as ``not_sent`` (with the
reason), and the run is suspect (``worker_lost``); every scheduled request still ends as
exactly one record. A master killed mid-run goes silent: its workers end their engines
(sending nothing more) within a second and exit 3. A two-point sweep (``sweep --master``)
runs its points one after the other on the same worker, a fresh engine each; a SIGINT to the
command in its second point reaches that engine: it stops sending, every scheduled request
of both points is exactly one record (the unsent ones ``not_sent``, saying why), the command
exits 130 and its worker 0. The three scenarios run side by side in one setup (separate
local processes on loopback), to keep the suite short.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.analysis.run_summary import summarize_run
from loadgen.records import read_records
from loadgen.schedule import Arrival, offsets_ns
from loadgen.sim.process import SimProcess
from tests.distributed_procs import alive, cleaning, engine_pid, launch_master, port_of, start_worker

LOSE = ("--rate", "16", "--duration", "2.5", "--seed", "5", "--arrival", "poisson", "--drain", "20")
ORPHAN = ("--rate", "8", "--duration", "5", "--seed", "6")
RATES = (4.0, 24.0)  # the stopped sweep's points, 3 s each (its second is stopped well before its end)
SWEEP = ("--rates", "4,24", "--point-duration", "3", "--warmup", "0", "--arrival", "constant", "--seed", "7")


def _wait_for_file(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path} in {timeout_s} s"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def faults(fixed_sim: SimProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    logs = tmp_path_factory.mktemp("faults")
    with cleaning() as procs:
        lose = launch_master(fixed_sim.url, logs / "lose", logs, *LOSE, "--expect-workers", "2", name="lose")
        orphan = launch_master(fixed_sim.url, logs / "orphan", logs, *ORPHAN, name="orphan")
        stopped = launch_master(fixed_sim.url, logs / "stopped", logs, *SWEEP, name="stopped", command="sweep")
        procs += [lose, orphan, stopped]
        lose_port = port_of(lose)
        keep, victim = start_worker(lose_port, logs, "keep"), start_worker(lose_port, logs, "victim")
        left = start_worker(port_of(orphan), logs, "left")
        held = start_worker(port_of(stopped), logs, "held")
        procs += [keep, victim, left, held]
        victim_engine = engine_pid(victim)
        left_engine = engine_pid(left)
        time.sleep(1.0)  # both points are sending
        victim.kill()  # SIGKILL to its control process: its engine dies with it
        orphan.kill()  # SIGKILL to the command: its master process dies with it
        killed = time.monotonic()
        while alive(left_engine) and time.monotonic() - killed < 10.0:
            time.sleep(0.02)
        engine_gone_s = time.monotonic() - killed
        _wait_for_file(logs / "stopped" / "records-p001-w00.arrows")  # the second point's first records are home
        stop_ns = time.perf_counter_ns()  # the master's clock too: one machine's monotonic clock
        os.kill(stopped.pid, signal.SIGINT)
        codes = {"lose": lose.wait(), "keep": keep.wait(20), "left": left.wait(20)}
        codes.update({"stopped": stopped.wait(), "held": held.wait(20)})
    meta = orjson.loads((logs / "lose" / "run.json").read_bytes())
    (lost,) = [w["shard"] for w in meta["client"]["workers"] if w["worker_pid"] == victim.pid]
    return {
        "out": logs / "lose",
        "meta": meta,
        "lost": lost,
        "codes": codes,
        "victim_engine_alive": alive(victim_engine),
        "engine_gone_s": engine_gone_s,
        "left": left,
        "lose": lose,
        "sweep": logs / "stopped",
        "stopped": stopped,
        "stop_ns": stop_ns,
    }


def test_the_master_finishes_without_the_lost_worker(faults: dict[str, Any]) -> None:
    assert faults["codes"]["lose"] == 0, faults["lose"].stderr()[-2000:]
    assert faults["codes"]["keep"] == 0
    assert not faults["victim_engine_alive"]  # it died with its worker
    assert f"worker {faults['lost']} (" in faults["lose"].stderr() and "lost" in faults["lose"].stderr()


def test_every_scheduled_request_ends_as_one_record(faults: dict[str, Any]) -> None:
    planned = len(offsets_ns(Arrival("poisson", rate=16.0), 5, duration_s=2.5))
    d = read_records(faults["out"]).select(["request", "shard", "status", "error"]).to_pydict()
    assert len(d["request"]) == planned
    assert len(set(d["request"])) == planned
    rows = list(zip(d["shard"], d["status"], d["error"], strict=True))
    lost = faults["lost"]
    assert all(status == "ok" for shard, status, _ in rows if shard != lost)
    unsent = [error for shard, status, error in rows if status == "not_sent"]
    assert unsent, "the victim's shard had requests left when it was killed"
    assert all(shard == lost for shard, status, _ in rows if status == "not_sent")
    assert all(f"worker {lost}" in e and "was lost: it stopped heartbeating" in e for e in unsent)


def test_the_run_is_suspect_with_the_reason(faults: dict[str, Any]) -> None:
    (lost,) = faults["meta"]["client"]["workers_lost"]
    assert lost["shard"] == faults["lost"] and lost["not_sent"] > 0 and "heartbeating" in lost["reason"]
    report = summarize_run(faults["out"], write=False)
    assert report.validity.suspect and "worker_lost" in report.validity.codes


def test_workers_of_a_killed_master_stop_at_once(faults: dict[str, Any]) -> None:
    assert faults["codes"]["left"] == 3  # EXIT_MASTER_LOST
    assert "master silent" in faults["left"].stderr()


@pytest.mark.timing
def test_their_engines_stop_sending_within_a_second(faults: dict[str, Any]) -> None:
    # the worker acts after 0.8 s of silence (protocol.MASTER_SILENCE_S); a loaded box adds its delays
    assert faults["engine_gone_s"] < 3.0


def _points(out: Path) -> dict[int, dict[str, list[Any]]]:
    d = read_records(out).select(["point", "request", "status", "error", "t_sched", "t_sent"]).to_pydict()
    points: dict[int, dict[str, list[Any]]] = {}
    for i, k in enumerate(d["point"]):
        rows = points.setdefault(k, {key: [] for key in d if key != "point"})
        for key, rows_of_key in rows.items():
            rows_of_key.append(d[key][i])
    return points


def test_a_stopped_sweep_exits_130_and_its_worker_0(faults: dict[str, Any]) -> None:
    assert faults["codes"]["stopped"] == 130, faults["stopped"].stderr()[-2000:]
    assert faults["codes"]["held"] == 0  # its master quit in order
    assert "Traceback" not in faults["stopped"].stderr()


def test_the_sweep_ran_both_points_on_the_same_worker_a_fresh_engine_each(faults: dict[str, Any]) -> None:
    meta = orjson.loads((faults["sweep"] / "run.json").read_bytes())
    first, second = meta["points"]
    assert (first["state"], second["state"]) == ("complete", "interrupted")
    (w0,), (w1,) = first["client"]["workers"], second["client"]["workers"]
    assert w0["worker_pid"] == w1["worker_pid"] and w0["engine_pid"] != w1["engine_pid"]
    assert second["client"]["stop_reason"] == "SIGINT"


def test_every_scheduled_request_of_the_stopped_sweep_is_one_record(faults: dict[str, Any]) -> None:
    points = _points(faults["sweep"])
    assert sorted(points) == [0, 1]
    for k, rate in enumerate(RATES):
        planned = len(offsets_ns(Arrival("constant", rate=rate), 7, duration_s=3.0))
        assert sorted(points[k]["request"]) == list(range(planned)), k
    assert set(points[0]["status"]) == {"ok"}
    second = list(zip(points[1]["status"], points[1]["error"], strict=True))
    assert any(status == "ok" for status, _ in second)  # it was sending when the stop came
    unsent = [error for status, error in second if status == "not_sent"]
    assert unsent and all("stopped (SIGINT)" in e for e in unsent)
    assert {status for status, _ in second} <= {"ok", "not_sent"}  # the drain let what was in flight finish


@pytest.mark.timing
def test_nothing_is_sent_a_second_after_the_stop(faults: dict[str, Any]) -> None:
    second = _points(faults["sweep"])[1]
    late = faults["stop_ns"] + 1_000_000_000  # the stop crosses master, worker and engine: 1 s on a loaded box
    sent = [t for t in second["t_sent"] if t is not None]
    assert sent and max(sent) < late
    due_later = [s for s, t in zip(second["status"], second["t_sched"], strict=True) if t > late]
    assert due_later and set(due_later) == {"not_sent"}
