"""A loadgen worker: an ordinary Locust worker process that relays its master's orders and its engine's records.

Run as ``python -m loadgen.distributed.worker --master-host H --master-port P`` (what
``loadgen worker`` starts). Importing Locust gevent-patches this process, so the engine
never runs here: for each point the master prepares, the worker starts
``loadgen.distributed.engine_child`` (a plain asyncio process, on a lifeline to this one),
hands it the job, tells the master it is ready, maps the master's common start onto this
machine's monotonic clock, and then only relays: the engine's records (read from its
stream file as it grows, moved onto the master's clock: ``relay``), its counters twice a
second, the master's stop orders, and its client health at the end.

If the master goes silent (no ``TICK`` for ``MASTER_SILENCE_S``) while a point runs, the
worker ends its engine at once (the lifeline closes: the engine sends nothing more) and
exits with ``EXIT_MASTER_LOST``; between points it gives up on a master silent for
``MASTER_GONE_S``. When the master quits, the worker exits 0, as a Locust worker does.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gevent
import locust
import orjson
from gevent import subprocess
from locust.env import Environment
from locust.event import Events
from locust.rpc.protocol import Message
from locust.runners import WorkerRunner

from loadgen.distributed import protocol as p
from loadgen.distributed.clock_sync import to_monotonic
from loadgen.distributed.frames import encode_frame, read_frame
from loadgen.distributed.protocol import STREAM_FILE
from loadgen.distributed.relay import StreamTail, chunks, shifted
from loadgen.distributed.web import request_events
from loadgen.lifeline import Lifelines

__all__ = ["main"]


def _plain(data: Any) -> Any:
    """``data`` as msgpack can carry it (numpy scalars as numbers): through JSON."""
    return orjson.loads(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))


class _Engine:
    """An engine process on a lifeline to this one. The first is started when the worker connects,
    ahead of its point (its imports take seconds); each next one when its point is prepared, never
    while a point sends (its imports would take the cores the running engine's timing needs), nor
    after the last (a wasted start): the master waits for every engine to be ready."""

    def __init__(self) -> None:
        self.lifelines = Lifelines()
        fd = self.lifelines.open()
        cmd = [sys.executable, "-m", "loadgen.distributed.engine_child", str(os.getpid()), str(fd), "1"]
        self.proc: Any = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=[fd])
        os.close(fd)

    def send(self, frame: Any) -> None:
        self.proc.stdin.write(encode_frame(frame))
        self.proc.stdin.flush()

    def read(self) -> Any:
        return read_frame(self.proc.stdout.read)

    def close(self) -> None:
        self.lifelines.close()  # the engine ends at once, sending nothing more
        if self.proc.poll() is None:
            self.proc.kill()


class _Point:
    """One point's engine process on this worker, and what it has sent home."""

    def __init__(self, data: dict[str, Any], work_dir: Path, engine: _Engine) -> None:
        self.point, self.shard, self.shards = int(data["point"]), int(data["shard"]), int(data["shards"])
        self.dir = Path(tempfile.mkdtemp(prefix=f"loadgen-p{self.point}-w{self.shard}-", dir=work_dir))
        self.engine = engine
        self.tail = StreamTail(self.dir / STREAM_FILE)
        self.shift_ns = 0
        self.schema_sent = False
        self.started = False
        self.web = bool(data.get("web"))  # fire Locust request events for the master's web UI
        self.cpu0 = time.process_time()

    def close(self) -> None:
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Worker:
    def __init__(self, runner: WorkerRunner, api_key_env: str | None, work_dir: Path) -> None:
        self.runner = runner
        self.api_key_env = api_key_env
        self.work_dir = work_dir
        self.heard: float | None = None  # monotonic time of the master's last tick
        self.point: _Point | None = None
        self.spare: _Engine | None = _Engine()
        self.orders: list[tuple[str, str]] = []
        for kind, handler in (
            (p.PING, self.on_ping),
            (p.TICK, self.on_tick),
            (p.PREPARE, self.on_prepare),
            (p.START, self.on_start),
            (p.ORDER, self.on_order),
        ):
            runner.register_message(kind, handler)

    def send(self, kind: str, data: dict[str, Any]) -> None:
        self.runner.send_message(kind, data)

    # -- the master's messages (each handled in Locust's receiving greenlet: none blocks) -----
    def on_ping(self, environment: Environment, msg: Message) -> None:
        self.send(p.PONG, {"seq": msg.data["seq"], "wall_ns": time.time_ns()})

    def on_tick(self, environment: Environment, msg: Message) -> None:
        self.heard = time.monotonic()

    def on_prepare(self, environment: Environment, msg: Message) -> None:
        self.heard = time.monotonic()
        if self.point is not None:
            self.point.close()
        self.orders = []
        engine, self.spare = self.spare, None
        if engine is None or engine.proc.poll() is not None:
            engine = _Engine()
        self.point = _Point(msg.data, self.work_dir, engine)
        gevent.spawn(self._prepare, self.point, msg.data["job"])

    def on_start(self, environment: Environment, msg: Message) -> None:
        pt = self.point
        if pt is None or pt.started or pt.point != msg.data["point"]:
            return
        start_ns = to_monotonic(int(msg.data["start_wall_ns"]), time.time_ns(), time.perf_counter_ns())
        pt.shift_ns = int(msg.data["start_perf_ns"]) - start_ns
        pt.started = True
        pt.engine.send(("start", start_ns))
        gevent.spawn(self._relay, pt)
        gevent.spawn(self._watch, pt)

    def on_order(self, environment: Environment, msg: Message) -> None:
        kind, reason = str(msg.data["kind"]), str(msg.data["reason"])
        self.orders.append((kind, reason))
        if self.point is not None:
            self.point.engine.lifelines.send(kind, reason)

    # -- one point ----------------------------------------------------------------------
    def _prepare(self, pt: _Point, job: bytes) -> None:
        for kind, reason in self.orders:
            pt.engine.lifelines.send(kind, reason)
        frame = {"job": job, "dir": str(pt.dir), "shard": pt.shard, "shards": pt.shards}
        pt.engine.send({**frame, "api_key_env": self.api_key_env})
        ready = pt.engine.read()
        if ready is None:
            self._done(pt, None, f"the engine process ended before it was ready (exit {pt.engine.proc.wait()})")
            return
        print(
            f"loadgen worker: point {pt.point}: shard {pt.shard} of {pt.shards}, engine pid {ready[1]}",
            file=sys.stderr,
            flush=True,
        )
        self.send(p.READY, {"point": pt.point, "shard": pt.shard, "engine_pid": ready[1]})

    def _watch(self, pt: _Point) -> None:
        """Pass the engine's counters on until its health, its last frame; then the last records."""
        client = None
        while True:
            frame = pt.engine.read()
            if frame is None:
                break
            if frame[0] == "live":
                self.send(
                    p.LIVE, {"point": pt.point, "shard": pt.shard, "counters": p.live_data(frame[1], pt.shift_ns)}
                )
            elif frame[0] == "health":
                client = frame[1]
        code = pt.engine.proc.wait()
        error = None if client is not None else f"the engine process ended without its health (exit {code})"
        self._done(pt, client, error)

    def _relay(self, pt: _Point) -> None:
        while self.point is pt and not pt.tail.ended:
            self._send_records(pt)
            gevent.sleep(p.RELAY_S)

    def _send_records(self, pt: _Point) -> None:
        batches = [shifted(b, pt.shift_ns) for b in pt.tail.read()]
        if pt.web:
            for b in batches:
                request_events(self.runner.environment, b)
        for messages, rows in chunks(batches):
            data: dict[str, Any] = {"point": pt.point, "shard": pt.shard, "messages": messages, "rows": rows}
            if not pt.schema_sent and pt.tail.schema is not None:
                data["schema"] = pt.tail.schema.serialize().to_pybytes()
                pt.schema_sent = True
            self.send(p.RECORDS, data)

    def _done(self, pt: _Point, client: dict[str, Any] | None, error: str | None) -> None:
        try:
            self._send_records(pt)  # what landed since the last pass
        except (OSError, ValueError) as e:
            error = error or f"the engine's records could not be read: {e}"
        if client is not None:
            client = {**_plain(client), "shift_ns": pt.shift_ns}
        cpu = time.process_time() - pt.cpu0
        self.send(p.DONE, {"point": pt.point, "shard": pt.shard, "client": client, "error": error, "cpu_seconds": cpu})
        if self.point is pt:
            self.point = None
        pt.close()

    # -- the master's silence -----------------------------------------------------------
    def watchdog(self) -> None:
        while True:
            gevent.sleep(0.05)
            if self.heard is None:
                continue
            silent = time.monotonic() - self.heard
            if self.point is not None and silent > p.MASTER_SILENCE_S:
                self.point.close()
                print(f"loadgen worker: master silent for {silent:.2f} s: engine stopped", file=sys.stderr, flush=True)
                os._exit(p.EXIT_MASTER_LOST)
            if silent > p.MASTER_GONE_S:
                print(f"loadgen worker: master silent for {silent:.0f} s: exiting", file=sys.stderr, flush=True)
                os._exit(p.EXIT_MASTER_LOST)


def hello() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "locust": locust.__version__,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="loadgen worker")
    parser.add_argument("--master-host", required=True)
    parser.add_argument("--master-port", type=int, default=p.DEFAULT_PORT)
    parser.add_argument("--api-key-env", default=None)
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    work_dir = Path(args.work_dir or tempfile.gettempdir())
    host = f"[{args.master_host}]" if ":" in args.master_host else args.master_host
    env = Environment(user_classes=[], events=Events())  # type: ignore[no-untyped-call]  # Locust's Events() is unannotated
    try:
        runner = env.create_worker_runner(host, args.master_port)
    except ConnectionError:
        print(f"loadgen worker: no master answered at {args.master_host}:{args.master_port}", file=sys.stderr)
        return 2
    worker = Worker(runner, args.api_key_env, work_dir)
    worker.send(p.HELLO, hello())
    print(f"loadgen worker: connected to {args.master_host}:{args.master_port}", file=sys.stderr, flush=True)
    gevent.spawn(worker.watchdog)
    runner.greenlet.join()
    if worker.point is not None:
        worker.point.close()
    if worker.spare is not None:
        worker.spare.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
