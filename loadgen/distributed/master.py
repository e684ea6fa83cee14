"""The master side of a distributed run, in the ``loadgen`` command's process (which never imports Locust).

``Master`` starts the master's control process (``master_node``: Locust's master runner,
gevent-patched, so a process of its own on a lifeline to this one), waits for
``--expect-workers`` workers (a timeout is one ``ConfigError`` line: nothing was sent),
and then sends load points: ``Master.run_point`` has ``client.run.run_point``'s
signature, so ``loadgen run`` and ``loadgen sweep`` send each point through it instead
of through local processes (``point_sender``). The job (resolved settings, workload,
target, run id) goes to the workers pickled; the records come home into the run folder
as one stream per worker (``{stem}-wNN.arrows``, on the master's monotonic clock), and
``merge.merge_point`` makes the point's client health, the lost workers' ``not_sent``
records included. A stop order given to the command's ``Stopper`` reaches every worker's
engine.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from loadgen.client.config import LiveCounters
from loadgen.client.engine import Engine
from loadgen.client.interrupts import Stopper
from loadgen.client.settings import RunSettings
from loadgen.distributed.frames import encode_frame, read_frame
from loadgen.distributed.merge import merge_point
from loadgen.distributed.protocol import DEFAULT_PORT, live_counters
from loadgen.errors import ConfigError, LoadgenError
from loadgen.lifeline import Lifelines
from loadgen.redaction import Secrets
from loadgen.workload.base import Workload

__all__ = ["MasterOptions", "Master", "LOOPBACK"]

LOOPBACK = ("127.0.0.1", "::1", "localhost")
_QUIT_WAIT_S = 5.0


@dataclass(frozen=True)
class MasterOptions:
    """Where the master listens, how many workers it waits for and how long, and its web UI."""

    bind_host: str = "127.0.0.1"
    bind_port: int = DEFAULT_PORT
    expect_workers: int = 1
    expect_timeout_s: float = 60.0
    web_host: str | None = None  # None: no web UI
    web_port: int = 8089

    def __post_init__(self) -> None:
        if not 1 <= self.expect_workers <= 4096:
            raise ConfigError(f"--expect-workers {self.expect_workers}: must be an integer in [1, 4096]")
        if not 0 <= self.bind_port <= 65535:
            raise ConfigError(f"--master-bind-port {self.bind_port}: must be in [0, 65535]")

    def argv(self, fd: int) -> list[str]:
        web = [self.web_host, str(self.web_port)] if self.web_host is not None else []
        return [
            str(fd),
            str(os.getpid()),
            self.bind_host,
            str(self.bind_port),
            str(self.expect_workers),
            repr(self.expect_timeout_s),
            *web,
        ]


class Master:
    """The master's control process for one command, and the point sender that uses it."""

    def __init__(self, options: MasterOptions, say: Callable[[str], None] | None = None) -> None:
        self.options = options
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.workers: list[dict[str, Any]] = []
        self.port = options.bind_port
        self._proc: subprocess.Popen[bytes] | None = None
        self._lifelines = Lifelines()

    # -- the control process --------------------------------------------------------------
    def __enter__(self) -> Master:
        fd = self._lifelines.open()
        cmd = [sys.executable, "-m", "loadgen.distributed.master_node", *self.options.argv(fd)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=[fd])
        os.close(fd)
        try:
            self._wait_for_workers()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _wait_for_workers(self) -> None:
        o = self.options
        frame = self._read()
        if frame is None:
            raise ConfigError(
                f"--master-bind-host {o.bind_host} --master-bind-port {o.bind_port}: the master could not listen "
                "there (the port in use, or an address this machine does not have?)"
            )
        self.port = int(frame[2])
        n = o.expect_workers
        self.say(f"master: waiting for {n} worker{'s' if n > 1 else ''} on {o.bind_host}:{self.port}")
        if o.web_host is not None:
            self.say(f"master: Locust web UI on http://{o.web_host}:{o.web_port}")
        frame = self._read()
        if frame is None:
            raise LoadgenError("the master process ended while it waited for workers")
        if frame[0] == "timeout":
            raise ConfigError(
                f"--expect-workers {n}: only {frame[1]} worker{'s' if frame[1] != 1 else ''} connected to "
                f"{o.bind_host}:{self.port} within --expect-workers-timeout {o.expect_timeout_s:g} s; "
                "nothing was sent"
            )
        self.workers = list(frame[1])
        hosts = ", ".join(f"{w['host']} (pid {w['pid']}, clock {w['clock_offset_ms']:+.2f} ms)" for w in self.workers)
        self.say(f"master: {len(self.workers)} worker{'s' if len(self.workers) > 1 else ''} ready: {hosts}")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            self._send(("quit",), proc)
            proc.wait(_QUIT_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            self._lifelines.close()
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    f.close()

    def _send(self, frame: Any, proc: subprocess.Popen[bytes] | None = None) -> None:
        proc = proc or self._proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.write(encode_frame(frame))
        proc.stdin.flush()

    def _read(self) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        out: IO[bytes] = self._proc.stdout
        return read_frame(out.read)

    # -- a point ------------------------------------------------------------------------------
    def run_point(
        self,
        settings: RunSettings,
        workload: Workload,
        url: str,
        model: str,
        run_dir: Path,
        run_id: str,
        *,
        api_key: str | None = None,
        secrets: Secrets | None = None,
        stopper: Stopper | None = None,
        stem: str = "records",
        on_live: Callable[[int, LiveCounters], None] | None = None,
        on_engine: Callable[[Engine], None] | None = None,
    ) -> dict[str, Any]:
        """Send one point across the workers (``client.run.run_point``'s signature; the API key is
        each worker's own, from its environment); returns the merged client health."""
        if settings.workers > 1:
            raise ConfigError(
                f"--workers {settings.workers} with --master: each worker runs one engine process; "
                "start more `loadgen worker` processes instead"
            )
        concurrency = settings.arrival.concurrency
        if settings.arrival.kind == "closed" and concurrency is not None and concurrency < len(self.workers):
            raise ConfigError(f"--concurrency {concurrency} is fewer users than the {len(self.workers)} workers")
        stopper = stopper if stopper is not None else Stopper()
        job = pickle.dumps(
            {"settings": settings, "workload": workload, "url": url, "model": model, "run_id": run_id},
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        point = {"point": settings.point, "stem": stem, "run_dir": str(run_dir.resolve()), "job": job}
        stopper.forward(self._lifelines)
        try:
            self._send(("point", point))
            result = self._collect(on_live)
        finally:
            stopper.forward(None)
        if "error" in result:
            raise LoadgenError(f"distributed point {settings.point}: {result['error']}")
        merged = merge_point(result, settings, workload, run_dir, run_id=run_id, stem=stem, url=url, model=model)
        for lost in merged["workers_lost"]:
            self.say(
                f"master: worker {lost['shard']} ({lost['host']}) lost: {lost['reason']}; "
                f"{lost['not_sent']} of its requests recorded not_sent"
            )
        if merged["distributed"]["clock_warning"]:
            self.say(f"master: warning: {merged['distributed']['clock_warning']}")
        self.workers = [w["worker"] for w in result["shards"] if not w.get("lost")]
        return merged

    def _collect(self, on_live: Callable[[int, LiveCounters], None] | None) -> dict[str, Any]:
        while True:
            frame = self._read()
            if frame is None:
                raise LoadgenError("the master process ended during the point")
            if frame[0] == "live" and on_live is not None:
                on_live(int(frame[1]), live_counters(frame[2]))
            elif frame[0] == "done":
                result: dict[str, Any] = frame[1]
                return result
