"""How much load can loadgen's client generate before it distorts what it measures?

Drives a deliberately cheap SSE server in a separate process (pinned to its own
core, on uvloop, so it is not the bottleneck) and reports:

  (a) client CPU time per streamed token: 64 streams x 128 tokens, one token per
      chunk, the server writing back to back. Measured over a sustained run (64
      users, each sending its next request when its answer ended, 20 rounds), so
      the figure is the steady state of a real run rather than one-off setup;
  (b) 1,000 concurrent streams at 20 ms between tokens on one client core:
      schedule lag p50/p99 and ITL error (measured gap minus the server's 20 ms).
      The server emits every stream's token on one shared 20 ms tick, as an
      inference engine's decode step does, so the client gets 1,000 reads at once;
      ``--sweep`` repeats (b) for fewer streams to find how many one core keeps up with;
  (c) client memory per in-flight stream.
  floor: the same load as (b) read by a bare uvloop Protocol that only stamps and
      counts: what a read costs on this machine before any HTTP or SSE work.

Targets (issue "Core"): (a) <= 4 us/token, (b) lag p99 <= 5 ms, (c) <= 50 KB.

    python benchmarks/client_capacity.py [--streams 1000] [--tokens 128] [--sweep]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from loadgen import clock as aio
from loadgen.client.config import EngineConfig, Plan
from loadgen.client.engine import Engine
from loadgen.records import RecordWriter, read_stream
from loadgen.workload.base import SyntheticChat


def _chunk(i: int) -> bytes:
    body = {
        "id": "b",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _tail(n: int) -> bytes:
    fin = {
        "id": "b",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
    }
    usage = {
        "id": "b",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [],
        "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8},
    }
    return b"data: " + orjson.dumps(fin) + b"\n\ndata: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"


HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Connection: keep-alive\r\n\r\n"
)


def _framed(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Conn(asyncio.Protocol):
    """Answers every request with n tokens: back to back, or one per ``gap_s`` on a shared tick."""

    def __init__(self, server: _Server) -> None:
        self.s = server
        self.buf = b""
        self.t: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0]) if b"content-length:" in head else 0
            if len(self.buf) < head_end + 4 + length:
                return
            self.buf = self.buf[head_end + 4 + length :]
            self.s.start(self)


class _Server:
    def __init__(self, tokens: int, gap_s: float) -> None:
        self.tokens, self.gap_s = tokens, gap_s
        self.chunks = [_framed(_chunk(i)) for i in range(tokens)]
        self.tail = _framed(_tail(tokens)) + b"0\r\n\r\n"
        self.active: list[list] = []  # [conn, next token]

    def start(self, conn: _Conn) -> None:
        assert conn.t is not None
        if self.gap_s <= 0:
            conn.t.write(HEAD + b"".join(self.chunks) + self.tail)
            return
        conn.t.write(HEAD)
        self.active.append([conn, 0])

    async def tick(self) -> None:
        loop = asyncio.get_running_loop()
        nxt = loop.time()
        while True:
            nxt += self.gap_s
            await asyncio.sleep(max(0.0, nxt - loop.time()))
            still = []
            for item in self.active:
                conn, k = item
                if conn.t is None or conn.t.is_closing():
                    continue
                conn.t.write(self.chunks[k] if k + 1 < self.tokens else self.chunks[k] + self.tail)
                item[1] = k + 1
                if k + 1 < self.tokens:
                    still.append(item)
            self.active = still


def _serve(port_q: mp.Queue, tokens: int, gap_s: float, core: int) -> None:
    try:
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError):
        pass

    async def main() -> None:
        srv = _Server(tokens, gap_s)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Conn(srv), "127.0.0.1", 0, backlog=4096)
        port_q.put(server.sockets[0].getsockname()[1])
        await srv.tick() if gap_s > 0 else await asyncio.Event().wait()

    aio.run(main())


def _start_server(tokens: int, gap_s: float) -> tuple[mp.Process, str]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_serve, args=(q, tokens, gap_s, 1), daemon=True)
    p.start()
    return p, f"http://127.0.0.1:{q.get(timeout=30)}/v1"


async def _drive(
    url: str, tokens: int, path: Path, *, offsets_ns: np.ndarray | None = None, users: int = 0, count: int = 0
) -> tuple[Engine, float, float]:
    """One engine run: open loop at ``offsets_ns``, or ``users`` closed-loop users sending ``count`` requests."""
    cfg = EngineConfig(url=url, model="bench", run_id="bench", flush_interval_s=0.2)
    session = SyntheticChat(input_tokens=8, output_tokens=tokens).session
    if offsets_ns is not None:
        plan = Plan(session, offsets_ns, np.arange(len(offsets_ns)))
    else:
        plan = Plan(session, concurrency=users, count=count)
    with RecordWriter(path) as w:
        engine = Engine(cfg, w)
        cpu0, t0 = time.process_time(), time.perf_counter()
        await engine.run(plan, time.perf_counter_ns() + 100_000_000)
        return engine, time.process_time() - cpu0, time.perf_counter() - t0


def part_a(streams: int, tokens: int, tmp: Path, rounds: int = 20, repeats: int = 3) -> None:
    """CPU per token at ``tokens`` per answer, and split into a per-request and a per-token part
    (from runs with 1-token answers), so the figure can be read for any answer length.
    Each figure is the median of ``repeats`` runs: this kind of machine is noisy."""
    cost = {}
    for n in (tokens, 1):
        proc, url = _start_server(n, 0.0)
        try:
            aio.run(_drive(url, n, tmp / "warm.arrows", users=streams, count=streams))  # imports, connections
            runs = []
            for _ in range(repeats):
                _, cpu, wall = aio.run(_drive(url, n, tmp / "a.arrows", users=streams, count=streams * rounds))
                rec = read_stream(tmp / "a.arrows").to_pydict()
                assert rec["status"].count("ok") == streams * rounds, "the benchmark server failed requests"
                runs.append(cpu / sum(rec["output_tokens"]) * 1e6)
        finally:
            proc.kill()
        cost[n] = float(np.median(runs))
    per_request = cost[1]
    per_token = (cost[tokens] * tokens - per_request) / (tokens - 1)
    print(
        f"(a) {streams} streams x {tokens} tokens, one token per chunk, server writing back to back, "
        f"{rounds} rounds ({aio.loop_name()}): client CPU {cost[tokens]:.2f} us/token (target <= 4) "
        f"= {per_request:.0f} us per request + {per_token:.2f} us per further token"
    )


def part_bc(streams: int, gap_ms: float, tmp: Path, memory: bool = True) -> float:
    tokens = 200
    proc, url = _start_server(tokens, gap_ms / 1e3)
    try:
        ramp_s = 2.0
        offs = np.linspace(0, ramp_s * 1e9, streams).astype(np.int64)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        engine, cpu, wall = aio.run(_drive(url, tokens, tmp / "b.arrows", offsets_ns=offs))
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finally:
        proc.kill()
    rec = read_stream(tmp / "b.arrows").to_pydict()
    lag = (np.array(rec["t_sent"], dtype=float) - np.array(rec["t_sched"], dtype=float)) / 1e6
    gaps = np.concatenate([np.diff(np.asarray(c)) for c in rec["chunk_ns"] if len(c) > 1]) / 1e6
    err = gaps - gap_ms
    n_tok = sum(rec["output_tokens"])
    print(
        f"(b) {streams} streams, {gap_ms:g} ms between tokens, one client core: {rec['status'].count('ok')} ok; "
        f"client CPU {cpu / wall:.0%} of a core, {cpu * 1e6 / max(n_tok, 1):.1f} us/token"
    )
    print(
        f"    schedule lag p50 {np.percentile(lag, 50):.2f} ms, p99 {np.percentile(lag, 99):.2f} ms "
        f"(target p99 <= 5); ITL error p50 {np.percentile(err, 50):+.2f} ms, "
        f"p99 |err| {np.percentile(np.abs(err), 99):.2f} ms; loop lag p99 {engine.probe.lag_p99_ms:.1f} ms, "
        f"max {engine.probe.lag_max_ms:.1f} ms; read-stamp lateness p99 {engine.probe.read_p99_ms:.2f} ms"
    )
    if memory:
        print(
            f"(c) peak RSS grew {(rss1 - rss0) / 1024:.1f} MiB for {streams} in-flight streams: "
            f"{(rss1 - rss0) / streams:.1f} KB per stream (target <= 50)"
        )
    return float(np.percentile(lag, 99))


class _Counting(asyncio.Protocol):
    """The floor: a client that sends one request and only stamps and counts what comes back."""

    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Length: 2\r\n\r\n{}"

    def __init__(self, done: asyncio.Future[None], counts: list[int]) -> None:
        self.done, self.counts = done, counts

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        time.perf_counter_ns()
        self.counts[0] += 1
        if data.endswith(b"0\r\n\r\n"):
            self.t.close()
            self.done.set_result(None)


def part_floor(streams: int, gap_ms: float) -> None:
    proc, url = _start_server(200, gap_ms / 1e3)
    port = int(url.rsplit(":", 1)[1].split("/")[0])

    async def main() -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        counts = [0]

        async def one(delay: float) -> None:
            await asyncio.sleep(delay)
            done = loop.create_future()
            await loop.create_connection(lambda: _Counting(done, counts), "127.0.0.1", port)
            await done

        cpu0 = time.process_time()
        await asyncio.gather(*(one(2.0 * i / streams) for i in range(streams)))
        return time.process_time() - cpu0, counts[0]

    try:
        cpu, reads = aio.run(main())
    finally:
        proc.kill()
    print(
        f"floor: a bare {aio.loop_name()} Protocol reading the same {streams} streams spends "
        f"{cpu * 1e6 / reads:.1f} us per read (connections included): this machine's cost before any HTTP or SSE"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--sweep", action="store_true", help="also find how many streams one core keeps up with")
    ap.add_argument("--only", choices=["a", "b"], help="run just one part")
    args = ap.parse_args()
    try:
        os.sched_setaffinity(0, {0})  # the client gets one core
    except (AttributeError, OSError):
        pass
    with tempfile.TemporaryDirectory() as d:
        if args.only != "b":
            part_a(64, args.tokens, Path(d))
        if args.only == "a":
            return
        part_bc(args.streams, args.gap_ms, Path(d))
        part_floor(args.streams, args.gap_ms)
        if args.sweep:
            kept_up = 0
            for n in (800, 600, 400, 300, 200, 100):
                if n >= args.streams:
                    continue
                if part_bc(n, args.gap_ms, Path(d), memory=False) <= 5.0:
                    kept_up = n
                    break
            print(
                f"one client core keeps lag p99 <= 5 ms up to about {kept_up} streams at {args.gap_ms:g} ms "
                f"({kept_up * 1e3 / args.gap_ms:,.0f} reads/s)"
            )


if __name__ == "__main__":
    main()
