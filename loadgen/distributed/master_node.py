"""The master's control process: a Locust master runner that hands out shards and writes the records home.

Started by the ``loadgen`` command (``distributed.master``) as
``python -m loadgen.distributed.master_node LIFELINE_FD PARENT_PID BIND_HOST BIND_PORT EXPECT TIMEOUT_S
[WEB_HOST WEB_PORT]``; Locust's import gevent-patches it, which is why it is a process of
its own. It speaks frames (``frames``) with the command on stdin and stdout, and reads the
command's stop orders (and its end: end of file) on its lifeline.

Workers connect with Locust's protocol; each says ``HELLO``, is pinged ``PING_COUNT``
times (``clock_sync``), and counts as ready. When ``EXPECT`` are ready the command hears
``("workers", infos)``; if they are not within ``TIMEOUT_S``, ``("timeout", ready, expected)``.
For each ``("point", job)`` the master pings the workers again, prepares shard i of n on
the i-th, fixes the common start once every engine is ready, appends each worker's
``RECORDS`` to its copy of the shard's stream in the run folder as they come, passes the
counters on, and answers ``("done", result)`` once every worker is done or lost (it stopped
heartbeating: Locust marks it missing). It ticks every ``TICK_S`` so that workers whose
master is gone stop at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.os
import pyarrow as pa
import pyarrow.ipc as ipc
from gevent.event import Event
from gevent.fileobject import FileObjectPosix
from locust.env import Environment
from locust.event import Events
from locust.rpc.protocol import Message
from locust.runners import STATE_MISSING, MasterRunner

from loadgen.distributed import protocol as p
from loadgen.distributed.clock_sync import PING_COUNT, ClockOffset, PingSample, estimate_offset
from loadgen.distributed.frames import encode_frame, read_frame
from loadgen.lifeline import CUT, EXIT_PARENT_GONE, STOP, die_with_parent
from loadgen.stream_file import StreamFile

__all__ = ["main"]

log = logging.getLogger("loadgen.master")
_PING_TIMEOUT_S = 2.0


class _Shard:
    """One worker's part of the running point."""

    def __init__(self, client_id: str, shard: int) -> None:
        self.client_id, self.shard = client_id, shard
        self.ready = Event()
        self.file: StreamFile | None = None
        self.engine_pid: int | None = None
        self.done: dict[str, Any] | None = None
        self.lost: str | None = None
        self.rows = self.chunks = self.bytes = 0
        self.heard_ns = time.time_ns()

    @property
    def over(self) -> bool:
        return self.done is not None or self.lost is not None


class Master:
    def __init__(self, runner: MasterRunner, expect: int, out: FileObjectPosix) -> None:
        self.runner, self.expect, self.out = runner, expect, out
        self.workers: dict[str, dict[str, Any]] = {}  # client id -> hello, offset (ready once measured)
        self.gone: set[str] = set()
        self.announced = False
        self.pongs: dict[tuple[str, int], tuple[int, Event, list[int]]] = {}
        self.seq = 0
        self.shards: dict[str, _Shard] = {}
        self.point: dict[str, Any] | None = None
        self.ingest = {"records": 0, "chunks": 0, "bytes": 0, "seconds": 0.0}
        self.web = False  # with a web UI, workers fire Locust request events
        for kind, handler in (
            (p.HELLO, self.on_hello),
            (p.PONG, self.on_pong),
            (p.READY, self.on_ready),
            (p.RECORDS, self.on_records),
            (p.LIVE, self.on_live),
            (p.DONE, self.on_done),
        ):
            runner.register_message(kind, handler)

    def tell(self, *frame: Any) -> None:
        self.out.write(encode_frame(frame))
        self.out.flush()

    # -- workers joining ------------------------------------------------------------------
    def on_hello(self, environment: Environment, msg: Message) -> None:
        index = self.runner.get_worker_index(msg.node_id)  # type: ignore[no-untyped-call]  # Locust's is unannotated
        info = {**msg.data, "client_id": msg.node_id, "index": int(index)}
        self.workers[msg.node_id] = info
        gevent.spawn(self._measure_new, msg.node_id)

    def _measure_new(self, client_id: str) -> None:
        offset = self.measure(client_id)
        if offset is None:
            return
        self.workers[client_id]["offset"] = offset
        if not self.announced and len(self.ready_workers()) >= self.expect:
            self.announced = True
            self.tell("workers", [self.info(c) for c in self.ready_workers()])

    def ready_workers(self) -> list[str]:
        alive = [
            c
            for c, w in self.workers.items()
            if "offset" in w and c not in self.gone and c in self.runner.clients and not self._missing(c)
        ]
        return sorted(alive, key=lambda c: int(self.workers[c]["index"]))

    def _missing(self, client_id: str) -> bool:
        node = self.runner.clients.get(client_id)
        return node is None or node.state == STATE_MISSING

    def info(self, client_id: str) -> dict[str, Any]:
        w = self.workers[client_id]
        offset: ClockOffset = w["offset"]
        keep = ("host", "pid", "cpus", "python", "locust", "index")
        return {**{k: w.get(k) for k in keep}, **offset.json()}

    # -- clocks -----------------------------------------------------------------------------
    def measure(self, client_id: str) -> ClockOffset | None:
        samples = []
        for _ in range(PING_COUNT):
            self.seq += 1
            key, done, got = (client_id, self.seq), Event(), list[int]()
            self.pongs[key] = (time.time_ns(), done, got)
            self.runner.send_message(p.PING, {"seq": self.seq}, client_id=client_id)
            if done.wait(_PING_TIMEOUT_S):
                samples.append(PingSample(self.pongs[key][0], got[0], got[1]))
            self.pongs.pop(key, None)
        try:
            return estimate_offset(samples)
        except ValueError:
            return None

    def on_pong(self, environment: Environment, msg: Message) -> None:
        now = time.time_ns()
        entry = self.pongs.get((msg.node_id, int(msg.data["seq"])))
        if entry is not None:
            entry[2].extend([int(msg.data["wall_ns"]), now])
            entry[1].set()

    # -- a point ------------------------------------------------------------------------------
    def run_point(self, job: dict[str, Any]) -> None:
        clients = self.ready_workers()
        if not clients:
            self.tell("done", {"error": "no worker is connected"})
            return
        jobs = [gevent.spawn(self.measure, c) for c in clients]
        gevent.joinall(jobs)
        for c, g in zip(clients, jobs, strict=True):
            if g.value is not None:
                self.workers[c]["offset"] = g.value
        self.point = job
        self.shards = {c: _Shard(c, i) for i, c in enumerate(clients)}
        n = len(clients)
        for c, sh in self.shards.items():
            data = {"point": job["point"], "shard": sh.shard, "shards": n, "job": job["job"], "web": self.web}
            self.runner.send_message(p.PREPARE, data, client_id=c)
        deadline = time.monotonic() + p.READY_TIMEOUT_S
        for sh in self.shards.values():
            while not sh.ready.wait(0.2) and not sh.over:
                self._check_lost()
                if time.monotonic() > deadline:
                    sh.lost = "its engine did not start in time"
        start_wall = time.time_ns() + int(p.START_MARGIN_S * 1e9)
        start_perf = time.perf_counter_ns() + (start_wall - time.time_ns())
        for c, sh in self.shards.items():
            if not sh.over:
                offset: ClockOffset = self.workers[c]["offset"]
                data = {
                    "point": job["point"],
                    "start_wall_ns": start_wall + offset.offset_ns,
                    "start_perf_ns": start_perf,
                }
                self.runner.send_message(p.START, data, client_id=c)
        while not all(sh.over for sh in self.shards.values()):
            gevent.sleep(0.2)
            self._check_lost()
        for sh in self.shards.values():
            if sh.file is not None:
                sh.file.close()
        result = {
            "point": job["point"],
            "start_wall_ns": start_wall,
            "start_perf_ns": start_perf,
            "shards": [self._shard_result(sh) for sh in self.shards.values()],
            "ingest": dict(self.ingest),
        }
        self.point, self.shards = None, {}
        self.tell("done", result)

    def _shard_result(self, sh: _Shard) -> dict[str, Any]:
        done = sh.done or {}
        return {
            "shard": sh.shard,
            "worker": self.info(sh.client_id),
            "engine_pid": sh.engine_pid,
            "client": done.get("client"),
            "error": done.get("error"),
            "relay_cpu_seconds": done.get("cpu_seconds"),
            "lost": sh.lost,
            "records_received": sh.rows,
            "chunks_received": sh.chunks,
            "bytes_received": sh.bytes,
            "stream": sh.file.path.name if sh.file is not None else None,
        }

    def _check_lost(self) -> None:
        for c, sh in self.shards.items():
            if not sh.over and self._missing(c):
                sh.lost = f"it stopped heartbeating (last heard {(time.time_ns() - sh.heard_ns) / 1e9:.1f} s ago)"
                self.gone.add(c)
                log.warning("worker %s (shard %d) lost: %s", c, sh.shard, sh.lost)

    def _shard_of(self, msg: Message) -> _Shard | None:
        sh = self.shards.get(msg.node_id)
        if sh is None or self.point is None or msg.data.get("point") != self.point["point"] or sh.lost:
            return None
        sh.heard_ns = time.time_ns()
        return sh

    def on_ready(self, environment: Environment, msg: Message) -> None:
        sh = self._shard_of(msg)
        if sh is not None:
            sh.engine_pid = msg.data.get("engine_pid")
            sh.ready.set()

    def on_records(self, environment: Environment, msg: Message) -> None:
        sh = self._shard_of(msg)
        if sh is None or self.point is None:
            return
        t0 = time.perf_counter()
        if sh.file is None:
            schema = ipc.read_schema(pa.py_buffer(msg.data["schema"]))
            path = Path(self.point["run_dir"]) / f"{self.point['stem']}-w{sh.shard:02d}.arrows"
            sh.file = StreamFile(path, schema)
        for message in msg.data["messages"]:
            sh.file.append(message, 0)
            sh.bytes += len(message)
        sh.file.sync()
        sh.rows += int(msg.data["rows"])
        sh.chunks += 1
        self.ingest["records"] += int(msg.data["rows"])
        self.ingest["chunks"] += 1
        self.ingest["bytes"] += sum(len(m) for m in msg.data["messages"])
        self.ingest["seconds"] += time.perf_counter() - t0

    def on_live(self, environment: Environment, msg: Message) -> None:
        sh = self._shard_of(msg)
        if sh is not None:
            self.tell("live", sh.shard, msg.data["counters"])

    def on_done(self, environment: Environment, msg: Message) -> None:
        sh = self._shard_of(msg)
        if sh is not None:
            sh.done = dict(msg.data)
            sh.ready.set()

    def order(self, kind: str, reason: str) -> None:
        for c in self.shards:
            self.runner.send_message(p.ORDER, {"kind": kind, "reason": reason}, client_id=c)

    def tick(self) -> None:
        while True:
            for c in list(self.workers):
                if c in self.runner.clients:
                    self.runner.send_message(p.TICK, None, client_id=c)
            gevent.sleep(p.TICK_S)


def _lifeline(fd: int, master: Master) -> None:
    """The command's orders, one line each; end of file: the command is gone, and so is this process."""
    gevent.os.make_nonblocking(fd)
    pending = b""
    while True:
        data = gevent.os.nb_read(fd, 4096)
        if not data:
            os._exit(EXIT_PARENT_GONE)
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            kind, _, reason = line.decode("utf-8", "replace").partition(" ")
            if kind in (STOP, CUT):
                master.order(kind, reason)


def _expect(master: Master, timeout_s: float) -> None:
    gevent.sleep(timeout_s)
    if not master.announced:
        master.announced = True
        master.tell("timeout", len(master.ready_workers()), master.expect)


def main(argv: list[str]) -> int:
    fd, parent_pid, host, port = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    expect, timeout_s = int(argv[4]), float(argv[5])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command forwards a Ctrl-C as an order
    die_with_parent(parent_pid)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    out = FileObjectPosix(sys.stdout.fileno(), "wb", close=False)
    inp = FileObjectPosix(sys.stdin.fileno(), "rb", close=False)
    env = Environment(user_classes=[], events=Events())  # type: ignore[no-untyped-call]  # Locust's Events() is unannotated
    runner = env.create_master_runner(f"[{host}]" if ":" in host else host, port)
    master = Master(runner, expect, out)
    if len(argv) > 6:
        from loadgen.distributed.web import start_web

        start_web(env, argv[6], int(argv[7]))
        master.web = True
    gevent.spawn(_lifeline, fd, master)
    gevent.spawn(master.tick)
    master.tell("listening", host, runner.server.port)
    gevent.spawn(_expect, master, timeout_s)
    while True:
        frame = read_frame(inp.read)
        if frame is None or frame[0] == "quit":
            break
        if frame[0] == "point":
            gevent.spawn(master.run_point, frame[1]).join()
    runner.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
