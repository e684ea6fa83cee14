"""Start the simulator in its own process, on loopback, and stop it by PID.

``run`` and ``sweep`` use this when given no endpoint: the simulator gets its
own interpreter (its own core on a multi-core box), so its work never shares an
event loop or a GIL with the engine it is being measured by.

Its lifetime is the parent's to decide: it runs in a session (process group) of its own and
ignores SIGINT (a terminal's Ctrl-C goes to the run, which drains against a simulator
that keeps serving, and stops it after), and it holds a lifeline (loadgen.lifeline):
when the parent dies, however, the simulator dies with it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO, TypeVar

from loadgen.errors import EndpointError
from loadgen.lifeline import Lifelines, pdeathsig_safe

__all__ = ["ChildServer", "SimProcess", "start_sim", "sim_command", "READY"]

READY = "LOADGEN_SIM_READY "
_Child = TypeVar("_Child", bound="ChildServer")


class SimStartError(EndpointError):
    pass


class ChildServer:
    """A server running as a child process: stopped by PID, its stderr kept in a file
    (a pipe nobody drains could block it). Subclasses provide ``proc`` and ``errlog``."""

    proc: subprocess.Popen[str]
    errlog: IO[str]
    lifeline: Lifelines | None = None  # the parent's end of the child's lifeline, if it holds one

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM by PID, then SIGKILL if it lingers; then its lifeline is let go."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self.lifeline is not None:
            self.lifeline.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.errlog.close()

    def stderr_text(self) -> str:
        self.errlog.seek(0)
        return self.errlog.read()

    def __enter__(self: _Child) -> _Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class SimProcess(ChildServer):
    proc: subprocess.Popen[str]
    url: str
    errlog: IO[str]
    lifeline: Lifelines | None = None


def sim_command(args: list[str], parent_pid: int, fd: int, pdeathsig: bool) -> list[str]:
    """``loadgen sim ARGS`` on loopback, run under a lifeline to ``parent_pid`` (read end ``fd``)."""
    sim = ["loadgen", "sim", *args, "--host", "127.0.0.1", "--port", "0", "--announce"]
    return [sys.executable, "-m", "loadgen.lifeline", str(parent_pid), str(fd), "1" if pdeathsig else "0", *sim]


def start_sim(args: list[str], timeout: float = 30.0) -> SimProcess:
    """Run ``loadgen sim ARGS --host 127.0.0.1 --port 0`` and wait until it listens."""
    lifeline = Lifelines()
    fd = lifeline.open()
    cmd = sim_command(args, os.getpid(), fd, pdeathsig_safe())
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    errlog = tempfile.TemporaryFile(mode="w+")  # a pipe nobody drains could block the sim
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=errlog, text=True, env=env, pass_fds=(fd,), start_new_session=True
        )
    except BaseException:
        lifeline.close()
        errlog.close()
        raise
    finally:
        os.close(fd)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if line.startswith(READY):
                return SimProcess(proc, line[len(READY) :].strip(), errlog, lifeline)
            if not line and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    lifeline.close()
    errlog.seek(0)
    err = errlog.read()
    errlog.close()
    proc.stdout.close()
    raise SimStartError(f"the simulator did not start: {err.strip()[-500:] or 'no output'}")
