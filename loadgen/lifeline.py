"""A child process's lifeline to the process that started it: it dies with its parent, and hears its orders.

A worker process or the built-in simulator must never outlive the run that started it
(a load generator whose parent was killed must not go on sending). Two guards, because
each alone has a gap:

- the parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``): the kernel kills
  the child at once when its parent ends, however it ends. It is tied to the parent
  *thread* that started the child, not the process: a child started from a thread that
  later ends would be killed while its parent lives. So it is asked for only when the
  parent started the child from its main thread (``pdeathsig_safe``); elsewhere it is a
  no-op, and the pipe below is the guard.
- a pipe from the parent, read by a watchdog thread in the child. The parent holds the
  only write end, so end of file means the parent is gone (SIGKILL, a crash, an exit that
  forgot its children): the child exits at once, without running anything else. The same
  pipe carries the parent's orders, one line each: ``stop REASON`` (stop sending, drain)
  and ``cut REASON`` (end the drain now).

A child started as a command (the simulator) runs under ``python -m loadgen.lifeline
PARENT_PID FD PDEATHSIG MODULE [ARGS...]``, which sets both guards, ignores SIGINT (the
parent stops it explicitly) and then runs ``python -m MODULE ARGS``.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable

__all__ = [
    "CUT",
    "EXIT_PARENT_GONE",
    "STOP",
    "Lifelines",
    "die_with_parent",
    "hold",
    "pdeathsig_safe",
    "watch_parent",
]

STOP, CUT = "stop", "cut"
EXIT_PARENT_GONE = 70  # the exit status of a child whose parent went away (EX_SOFTWARE)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

Order = Callable[[str, str], None]  # (STOP or CUT, reason)


def pdeathsig_safe() -> bool:
    """Whether a child started from the calling thread may ask for the parent-death signal:
    only the main thread lives as long as the process (the signal follows the thread)."""
    return threading.current_thread() is threading.main_thread()


def die_with_parent(parent_pid: int, pdeathsig: bool = True) -> bool:
    """Ask the kernel to SIGKILL this process when its parent ends (Linux; elsewhere nothing),
    then exit at once if the parent ``parent_pid`` is already gone (it may have died before
    the request was made). Returns whether the signal was set."""
    armed = False
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent_pid:
        os._exit(EXIT_PARENT_GONE)
    return armed


def watch_parent(fd: int, on_order: Order | None = None) -> threading.Thread:
    """Read the parent's orders from ``fd`` in a daemon thread; at end of file (the parent is
    gone) end this process at once: no request is sent, nothing more is run."""

    def watch() -> None:
        pending = b""
        while True:
            try:
                data = os.read(fd, 4096)
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            except OSError:
                data = b""
            if not data:
                os._exit(EXIT_PARENT_GONE)
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                kind, _, reason = line.decode("utf-8", "replace").partition(" ")
                if on_order is not None and kind in (STOP, CUT):
                    on_order(kind, reason)

    thread = threading.Thread(target=watch, name="loadgen lifeline", daemon=True)
    thread.start()
    return thread


def hold(fd: int, parent_pid: int, *, pdeathsig: bool, on_order: Order | None = None) -> threading.Thread:
    """Both guards, in the child: the parent-death signal (when ``pdeathsig``) and the watchdog."""
    die_with_parent(parent_pid, pdeathsig)
    return watch_parent(fd, on_order)


class Lifelines:
    """The parent's ends of its children's lifelines: orders go to every child; closing them
    (or the parent dying) ends every child still holding one."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def open(self) -> int:
        """A new lifeline; returns the child's (read) end, to be passed to the child and then
        closed here. The write end stays with this process and is inherited by no child."""
        read, write = os.pipe()
        self._fds.append(write)
        return read

    def adopt(self, write_fd: int) -> None:
        """Hold a write end made elsewhere (a ``multiprocessing`` pipe's)."""
        self._fds.append(write_fd)

    def send(self, kind: str, reason: str) -> None:
        """Order every child (safe in a signal handler: one small write per pipe, errors ignored)."""
        line = f"{kind} {reason}\n".encode()
        for fd in self._fds:
            try:
                os.write(fd, line)
            except OSError:  # a child already gone
                pass

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def main(argv: list[str]) -> None:
    """``python -m loadgen.lifeline PARENT_PID FD PDEATHSIG MODULE [ARGS...]``."""
    parent_pid, fd, pdeathsig, module, *args = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the parent's to handle
    hold(int(fd), int(parent_pid), pdeathsig=pdeathsig == "1")
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
