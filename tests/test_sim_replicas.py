"""``loadgen sim --replicas N``: N independent simulated engines behind one port, on loopback.

The kernel spreads connections over the replicas (SO_REUSEPORT): requests sent each on a
connection of its own land on every replica, each answered by exactly one, whose ground
truth and metrics are its own (on its own address), and whose report the parent prints at
a stop. The replicas stop with the parent: at a SIGTERM, in order; at a SIGKILL, at once
(their lifelines). Two parents, started side by side, cover both ends.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.sim.process import READY
from loadgen.sim.replicas import REPLICA, read_metrics, truth_path
from tests.distributed_procs import alive

SENT = 45  # P(a replica of 3 gets none) = 3 * (2/3)**45: about 4e-8


class Parent:
    """A ``loadgen sim --replicas N --announce`` and its stdout, read line by line in a thread."""

    def __init__(self, n: int, *flags: str) -> None:
        argv = [sys.executable, "-m", "loadgen", "sim", "--ttft-ms", "5", "--itl-ms", "1", "--port", "0"]
        argv += ["--replicas", str(n), "--announce", *flags]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def announced(self, timeout_s: float = 60.0) -> tuple[str, list[tuple[int, int, str]]]:
        """The shared URL and each replica's (index, pid, own URL), from the --announce lines."""
        replicas: list[tuple[int, int, str]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.proc.poll() is None, f"the parent ended ({self.proc.returncode}) before it served"
                continue
            if line.startswith(REPLICA):
                i, pid, own = line[len(REPLICA) :].split()
                replicas.append((int(i), int(pid), own))
            elif line.startswith(READY):
                return line[len(READY) :].strip(), replicas
        raise AssertionError(f"no {READY!r} line in {timeout_s} s")

    def rest(self, timeout_s: float = 30.0) -> str:
        """What it printed after it served, once it has ended."""
        self.proc.wait(timeout_s)
        self.reader.join(timeout_s)
        return "".join(self.lines.get() for _ in range(self.lines.qsize()))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _chat(url: str, seq: int) -> dict[str, Any]:
    """One chat request on a connection of its own (urllib opens one per request)."""
    body = orjson.dumps({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3})
    headers = {"Content-Type": "application/json", "X-Loadgen-Run": "rep", "X-Loadgen-Seq": str(seq)}
    req = urllib.request.Request(url + "/chat/completions", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer: dict[str, Any] = orjson.loads(resp.read())
    return answer


def _metrics(own: str) -> dict[str, float]:
    with urllib.request.urlopen(own.removesuffix("/v1") + "/metrics", timeout=10) as resp:
        return read_metrics(resp.read().decode())


def _gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    truth = tmp_path_factory.mktemp("replicas") / "truth.jsonl"
    three, two = Parent(3, "--truth", str(truth)), Parent(2)  # side by side: their start-up is most of the cost
    try:
        url, replicas = three.announced()
        _, doomed = two.announced()
        answers = [_chat(url, k) for k in range(SENT)]
        live = {i: _metrics(own) for i, _, own in replicas}
        three.proc.send_signal(signal.SIGTERM)
        os.kill(two.proc.pid, signal.SIGKILL)
        report = three.rest()
        two.proc.wait(10)
        return {
            "truth": truth,
            "replicas": replicas,
            "answers": answers,
            "live": live,
            "code": three.proc.returncode,
            "report": report,
            "stopped": _gone([pid for _, pid, _ in replicas]),
            "doomed": [pid for _, pid, _ in doomed],
            "killed_gone": _gone([pid for _, pid, _ in doomed]),
        }
    finally:
        three.kill()
        two.kill()


def test_every_replica_listens_on_its_own_address_too(served: dict[str, Any]) -> None:
    replicas = served["replicas"]
    assert [i for i, _, _ in replicas] == [0, 1, 2]
    assert len({pid for _, pid, _ in replicas}) == 3 and len({own for _, _, own in replicas}) == 3


def test_requests_spread_over_every_replica_each_served_once(served: dict[str, Any]) -> None:
    assert all(a["choices"][0]["finish_reason"] == "length" for a in served["answers"])
    rids: list[set[str]] = []
    for i in range(3):
        lines = Path(truth_path(str(served["truth"]), i)).read_bytes().splitlines()
        rids.append({orjson.loads(line)["rid"] for line in lines})
    assert all(rids), [len(r) for r in rids]  # every replica served some
    assert sum(len(r) for r in rids) == SENT  # none twice
    assert set().union(*rids) == {f"rep-{k}" for k in range(SENT)}


def test_each_replica_meters_only_its_own_requests(served: dict[str, Any]) -> None:
    served_by = [served["live"][i]["request_success_total"] for i in range(3)]
    truth_lines = [len(Path(truth_path(str(served["truth"]), i)).read_bytes().splitlines()) for i in range(3)]
    assert served_by == truth_lines
    assert sum(served_by) == SENT


def test_a_stop_reports_each_replica_and_ends_them_all(served: dict[str, Any]) -> None:
    assert served["code"] == 0
    for i, pid, own in served["replicas"]:
        n = int(served["live"][i]["request_success_total"])
        line = re.search(
            rf"^loadgen sim: replica {i} \(pid {pid}, {re.escape(own)}\): (\d+) requests, .*$", served["report"], re.M
        )
        assert line is not None, served["report"]
        assert int(line.group(1)) == n
        assert line.group(0).endswith(f"truth in {truth_path(str(served['truth']), i)}")
    assert served["stopped"]


def test_replicas_die_with_a_killed_parent(served: dict[str, Any]) -> None:
    assert len(served["doomed"]) == 2
    assert served["killed_gone"]
