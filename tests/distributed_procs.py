"""Masters and workers of distributed runs as separate local processes on loopback (tests/test_distributed*.py).

Every process here is started as a command (``python -m loadgen ...``): Locust, which
gevent-patches the process that imports it, is imported only in those processes, never in
the pytest process. Each command's output goes to a file, read back by the test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOADGEN = [sys.executable, "-m", "loadgen"]
_PORT = re.compile(r"master: waiting for \d+ workers? on 127\.0\.0\.1:(\d+)")
_ENGINE = re.compile(r"engine pid (\d+)")


class Proc:
    """A command started in the background, its stdout and stderr in files."""

    def __init__(self, argv: list[str], logs: Path, name: str) -> None:
        self.out, self.err = logs / f"{name}.out", logs / f"{name}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_for(self, pattern: re.Pattern[str], timeout_s: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = pattern.search(self.stderr())
            if found:
                return found
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.popen.args!r} ended ({self.popen.returncode}): {self.stderr()[-2000:]}")
            time.sleep(0.05)
        raise AssertionError(
            f"no {pattern.pattern!r} from {self.popen.args!r} in {timeout_s} s: {self.stderr()[-2000:]}"
        )

    def wait(self, timeout_s: float = 90.0) -> int:
        return self.popen.wait(timeout_s)

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)


def run_argv(url: str, out: Path, *flags: str, command: str = "run") -> list[str]:
    """``loadgen run`` (or ``sweep``) of a short fixed chat against ``url`` (a few seconds of schedule, one
    seed, one salt)."""
    return [
        *LOADGEN,
        command,
        "--endpoint",
        url,
        "--input-tokens",
        "64",
        "--output-tokens",
        "16",
        "--salt",
        "disttest1",
        "--no-live",
        "--no-report",
        "--out",
        str(out),
        *flags,
    ]


def launch_master(url: str, out: Path, logs: Path, *flags: str, name: str = "master", command: str = "run") -> Proc:
    """A ``loadgen run --master`` (or ``sweep``) on a free loopback port, started (``port_of`` waits for it)."""
    return Proc(run_argv(url, out, "--master", "--master-bind-port", "0", *flags, command=command), logs, name)


def port_of(master: Proc) -> int:
    """The port a master listens on, once it says so."""
    return int(master.wait_for(_PORT).group(1))


def start_master(url: str, out: Path, logs: Path, *flags: str, name: str = "master") -> tuple[Proc, int]:
    """A ``loadgen run --master`` on a free loopback port; returns it and the port it listens on."""
    master = launch_master(url, out, logs, *flags, name=name)
    return master, port_of(master)


def start_worker(port: int, logs: Path, name: str) -> Proc:
    return Proc([*LOADGEN, "worker", "--master-host", "127.0.0.1", "--master-port", str(port)], logs, name)


def engine_pid(worker: Proc) -> int:
    """The pid of the engine process the worker started for its point (it says so on stderr)."""
    return int(worker.wait_for(_ENGINE).group(1))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


@contextmanager
def cleaning(*procs: Proc) -> Iterator[list[Proc]]:
    """Kill whatever is left of the processes (by their own pids) when the test ends."""
    held = list(procs)
    try:
        yield held
    finally:
        for p in held:
            p.kill()
