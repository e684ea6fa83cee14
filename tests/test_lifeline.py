"""A child's lifeline: it dies with its parent by either guard alone, and hears the parent's orders.

Each case is three generations of real processes: this test, a "parent" it kills with
SIGKILL, and the parent's child under ``python -m loadgen.lifeline``. A fourth process
can hold a copy of the lifeline's write end, so that only the parent-death signal can
end the child (the pipe never reaches end of file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from loadgen.lifeline import EXIT_PARENT_GONE

PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    pdeathsig, holder = sys.argv[1], sys.argv[2] == "1"
    read, write = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "loadgen.lifeline", str(os.getpid()), str(read), pdeathsig,
         "timeit", "-n", "1", "import time; time.sleep(60)"],
        pass_fds=(read,),
    )
    os.close(read)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    keeper = subprocess.Popen(sleeper, pass_fds=(write,)) if holder else None
    print(child.pid, keeper.pid if keeper else 0, flush=True)
    time.sleep(60)
    """
)


def _state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2]


def alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def wait_until(predicate: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"not within {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - start


def kill_parent_and_time_child(pdeathsig: str, holder: bool) -> float | None:
    """Seconds from SIGKILL of the parent until its child is gone (None: still alive after 3 s)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, pdeathsig, "1" if holder else "0"], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child, keeper = map(int, parent.stdout.readline().split())
    try:
        wait_until(lambda: alive(child) and threads(child) >= 2, 20)  # both guards are set before the watchdog runs
        parent.kill()
        parent.wait()
        try:
            return wait_until(lambda: not alive(child), 3.0)
        except AssertionError:
            return None
    finally:
        for pid in (child, keeper):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        parent.stdout.close()


@pytest.mark.timing
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize(
    "pdeathsig, holder, guard",
    [
        ("1", False, "both guards"),
        ("0", False, "the pipe watchdog alone"),
        ("1", True, "the parent-death signal alone (another process holds the pipe open)"),
    ],
)
def test_a_child_dies_within_a_second_of_its_parent(pdeathsig: str, holder: bool, guard: str) -> None:
    took = kill_parent_and_time_child(pdeathsig, holder)
    assert took is not None and took < 1.0, f"{guard}: the child outlived its parent ({took})"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_without_either_guard_the_child_would_outlive_its_parent() -> None:
    """The check above can fail: with the signal off and the pipe held open, the child lives on."""
    assert kill_parent_and_time_child("0", True) is None


WATCHED = textwrap.dedent(
    """
    import os, sys, time
    from loadgen.lifeline import watch_parent
    read, write = os.pipe()
    watch_parent(read, lambda kind, reason: print(kind, reason, flush=True))
    os.write(write, b"stop SIGINT\\nnoise\\ncut second SIGINT: drain cut short\\n")
    time.sleep(0.5)
    os.close(write)  # as if the parent were gone
    time.sleep(10)
    print("still running", flush=True)
    """
)


def test_the_watchdog_passes_orders_on_and_exits_at_end_of_file() -> None:
    r = subprocess.run([sys.executable, "-c", WATCHED], capture_output=True, text=True, timeout=30)
    assert r.stdout.splitlines() == ["stop SIGINT", "cut second SIGINT: drain cut short"]
    assert r.returncode == EXIT_PARENT_GONE


ARMED = textwrap.dedent(
    """
    import ctypes, os, signal
    from loadgen.lifeline import die_with_parent
    print(die_with_parent(os.getppid()))
    got = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(got), 0, 0, 0)  # PR_GET_PDEATHSIG
    print(got.value == signal.SIGKILL)
    die_with_parent(os.getppid() + 12345, pdeathsig=False)  # not our parent: as if it had died already
    print("not reached")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_die_with_parent_arms_the_signal_and_exits_if_the_parent_is_already_gone() -> None:
    r = subprocess.run([sys.executable, "-c", ARMED], capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == ["True", "True"]
    assert r.returncode == EXIT_PARENT_GONE
