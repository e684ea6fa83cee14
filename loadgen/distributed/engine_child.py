"""The engine process of a worker: asyncio (uvloop), never gevent; it sends its shard and writes its records.

A worker's control process is a Locust worker, gevent-patched; the engine must not run
there (a patched socket or a greenlet switch inside the loop would move every stamp). So
the worker starts this module as a plain child process::

    python -m loadgen.distributed.engine_child PARENT_PID LIFELINE_FD PDEATHSIG

It holds a lifeline to the worker (``loadgen.lifeline``: it dies with the worker, and the
worker's ``stop`` and ``cut`` orders reach its engine), and waits, its imports done (a worker
starts its first one as it connects, so the first point starts without waiting for them), for
its job: one frame on stdin (``frames``: the master's settings, workload, target, run id, shard
and the folder for its stream), answers ``("ready", pid)``, waits for ``("start", start_ns)`` (the common start on
this machine's monotonic clock), and runs ``client.point.run_engine``. While it runs it
writes ``("live", counters)`` twice a second on stdout; its last frame is
``("health", client)``. Its records go to its stream file, which the worker reads as it
grows (``relay``).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys
from pathlib import Path
from typing import IO, Any

from loadgen import clock
from loadgen.client.engine import Engine
from loadgen.client.interrupts import Stopper
from loadgen.client.point import run_engine
from loadgen.client.settings import api_key_from_env
from loadgen.distributed.frames import encode_frame, read_frame
from loadgen.distributed.protocol import STREAM_FILE
from loadgen.lifeline import STOP, hold

__all__ = ["main", "LIVE_EVERY_S"]

LIVE_EVERY_S = 0.5


def _send(out: IO[bytes], obj: Any) -> None:
    out.write(encode_frame(obj))
    out.flush()


async def _report(out: IO[bytes], engine: Engine) -> None:
    while True:
        await asyncio.sleep(LIVE_EVERY_S)
        _send(out, ("live", engine.live.snapshot()))


def main(argv: list[str]) -> int:
    parent_pid, fd, pdeathsig = int(argv[0]), int(argv[1]), argv[2] == "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker forwards a stop
    stopper = Stopper()
    hold(fd, parent_pid, pdeathsig=pdeathsig, on_order=stopper.order)
    signal.signal(signal.SIGTERM, lambda signum, frame: stopper.order(STOP, "SIGTERM"))
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    frame = read_frame(inp.read)
    if frame is None:
        return 1
    job = {**pickle.loads(frame["job"]), **{k: v for k, v in frame.items() if k != "job"}}
    api_key = api_key_from_env(job.get("api_key_env"))
    settings, workload = job["settings"], job["workload"]
    secrets = settings.http.secrets(api_key, job["url"], settings.stage_endpoints.values())
    _send(out, ("ready", os.getpid()))
    start = read_frame(inp.read)
    if start is None:
        return 1
    reporters: list[asyncio.Task[None]] = []
    client = clock.run(
        run_engine(
            settings,
            workload,
            job["url"],
            job["model"],
            Path(job["dir"]),
            job["run_id"],
            api_key=api_key,
            secrets=secrets,
            stopper=stopper,
            stream_name=STREAM_FILE,
            shard=job["shard"],
            shards=job["shards"],
            start_ns=int(start[1]),
            on_engine=lambda engine: reporters.append(asyncio.get_running_loop().create_task(_report(out, engine))),
        )
    )
    _send(out, ("health", client))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
