"""``loadgen`` commands as forked children of one interpreter that imported loadgen once.

Why: a ``loadgen run`` spends ~4 s of a 2-core machine importing scipy, matplotlib, pyarrow
and aiohttp before it sends anything, and ~0.3 s more on its first chart; a suite of 50
short runs would spend most of its time there. Each command here is still a process of its
own (its own pid to kill, its own exit status and peak RSS from ``wait4``, its own stdout
and stderr files), running the very ``loadgen.cli.main.main(argv)`` that ``python -m
loadgen`` runs, forked after the imports.

Protocol (JSON lines): the runner prints ``{"ready": true}`` once imported; each line on its
stdin ``{"id", "argv", "cwd", "env", "stdout", "stderr"}`` starts a child and is answered
``{"id", "pid"}``, and its end ``{"id", "status", "maxrss_kib"}`` (``status`` as ``wait4``
gives it). End of stdin stops the runner after its last child.

``Runner`` is the other side, for the tests: ``start(...) -> pid``, ``wait(pid, deadline)``.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = ["Runner"]

# What `loadgen run` imports on its way (the report's charts, the statistics, the client),
# including what it imports lazily: each child would import these again on its own.
_PRELOAD = (
    "loadgen.cli.main",
    "loadgen.cli.run_cmd",
    "loadgen.cli.live",
    "loadgen.client.run",
    "loadgen.client.shards",
    "loadgen.client.scrape",
    "loadgen.client.prometheus",
    "loadgen.workload.load",
    "loadgen.analysis.run_summary",
    "loadgen.conformance.ci_outputs",
    "loadgen.report.terminal",
    "loadgen.report.html",
    "loadgen.report.chart_style",
    "matplotlib.backends.backend_svg",
    "matplotlib.backends.backend_agg",
    "PIL.PngImagePlugin",
    "pyarrow.dataset",
    "rich.live",
    "uvloop",
)


def _warm_up() -> None:
    """What every run does once per process: build the parsers (every command module), draw
    a chart to SVG and PNG (fonts loaded and cached). ~0.3 s of CPU saved in every child."""
    from loadgen.cli.main import build_parser
    from loadgen.report.chart_style import new_axes, new_figure, to_png, to_svg

    build_parser()
    fig = new_figure()
    ax = new_axes(fig)
    ax.plot([1, 2], [3, 4], label="warm")
    ax.set_title("warm-up")
    ax.legend()
    to_svg(fig)
    to_png(fig)


def _child(req: dict[str, Any]) -> None:
    """In the forked child: become the command, then exit with its code (never return)."""
    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own fd
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        sys.argv = ["loadgen", *req["argv"]]
        from loadgen.cli.main import main

        code = main(req["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported as python itself would, then exit 1
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed stream loses nothing more
                pass
        os._exit(code)


def serve() -> None:
    """The runner's loop: start children as asked, report each as it ends."""
    import importlib

    try:
        for name in _PRELOAD:
            importlib.import_module(name)
        _warm_up()
    except Exception:  # noqa: BLE001, S110 - a broken tree: each child then shows the error itself
        pass
    say = sys.stdout
    say.write('{"ready":true}\n')
    say.flush()
    running: dict[int, int] = {}  # pid -> request id
    pending = b""
    open_in = True
    while open_in or running:
        if open_in and select.select([0], [], [], 0.05)[0]:
            data = os.read(0, 65536)
            open_in = bool(data)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = orjson.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req)
                running[pid] = req["id"]
                say.write(orjson.dumps({"id": req["id"], "pid": pid}).decode() + "\n")
                say.flush()
        elif not open_in:
            time.sleep(0.05)
        while running:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if not pid:
                break
            rid = running.pop(pid)
            say.write(orjson.dumps({"id": rid, "status": status, "maxrss_kib": usage.ru_maxrss}).decode() + "\n")
            say.flush()


class Runner:
    """The test side: one runner process, any number of commands at once."""

    def __init__(self, cwd: Path) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in: IO[str] = self._proc.stdin
        self._out: IO[str] = self._proc.stdout
        if orjson.loads(self._out.readline() or "{}").get("ready") is not True:
            raise RuntimeError("the loadgen runner did not start")
        self._lock = threading.Lock()
        self._ids = 0
        self._pids: dict[int, int] = {}
        self._ends: dict[int, tuple[int, int]] = {}
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="loadgen-runner", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._out:
            msg = orjson.loads(line)
            with self._changed:
                if "pid" in msg:
                    self._pids[msg["id"]] = msg["pid"]
                else:
                    self._ends[msg["id"]] = (msg["status"], msg["maxrss_kib"])
                self._changed.notify_all()

    def start(self, argv: list[str], cwd: Path, env: dict[str, str], stdout: Path, stderr: Path) -> int:
        """Start ``loadgen *argv``; its id (for ``wait``) once the runner has forked it."""
        with self._lock:
            self._ids += 1
            rid = self._ids
            req = {"id": rid, "argv": argv, "cwd": str(cwd), "env": env, "stdout": str(stdout), "stderr": str(stderr)}
            self._in.write(orjson.dumps(req).decode() + "\n")
            self._in.flush()
        with self._changed:
            self._changed.wait_for(lambda: rid in self._pids, timeout=30)
        return rid

    def wait(self, rid: int, deadline: float) -> tuple[int, int, bool]:
        """(wait status, peak RSS KiB, killed): SIGKILL at ``deadline`` (time.monotonic) if still running."""
        killed = False
        with self._changed:
            while rid not in self._ends:
                left = deadline - time.monotonic()
                if left <= 0 and not killed:
                    os.kill(self._pids[rid], 9)
                    killed = True
                self._changed.wait(max(left, 0.05) if not killed else 1.0)
            status, rss = self._ends.pop(rid)
        return status, rss, killed

    def close(self) -> None:
        self._in.close()
        self._proc.wait(60)
        self._out.close()
        self._reader.join(5)


if __name__ == "__main__":
    serve()
