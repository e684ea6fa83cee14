"""How much load can loadgen's client generate before it distorts what it measures?

Drives a deliberately cheap SSE server in a separate process (pinned to its own
core, so it is not the bottleneck) and reports:

  (a) client CPU time per streamed token: 64 streams x 128 tokens, one token per
      chunk, the server writing back to back;
  (b) 1,000 concurrent streams at 20 ms between tokens on one client core:
      schedule lag p50/p99 and ITL error (measured gap minus the server's 20 ms);
  (c) client memory per in-flight stream.

Targets (issue "Core"): (a) <= 4 us/token, (b) lag p99 <= 5 ms, (c) <= 50 KB.

    python benchmarks/client_capacity.py [--streams 1000] [--tokens 128]
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

from loadgen.engine import Engine, EngineConfig, Plan
from loadgen.records import RecordWriter, read_stream
from loadgen.workload import SyntheticChat


def _chunk(i: int) -> bytes:
    body = {"id": "b", "object": "chat.completion.chunk", "created": 0, "model": "bench",
            "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _tail(n: int) -> bytes:
    fin = {"id": "b", "object": "chat.completion.chunk", "created": 0, "model": "bench",
           "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    usage = {"id": "b", "object": "chat.completion.chunk", "created": 0, "model": "bench", "choices": [],
             "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8}}
    return b"data: " + orjson.dumps(fin) + b"\n\ndata: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"


HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: keep-alive\r\n\r\n")


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
            self.buf = self.buf[head_end + 4 + length:]
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

    asyncio.run(main())


def _start_server(tokens: int, gap_s: float) -> tuple[mp.Process, str]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_serve, args=(q, tokens, gap_s, 1), daemon=True)
    p.start()
    return p, f"http://127.0.0.1:{q.get(timeout=30)}/v1"


async def _drive(url: str, offsets_ns: np.ndarray, tokens: int, path: Path) -> tuple[Engine, float, float]:
    cfg = EngineConfig(url=url, model="bench", run_id="bench", flush_interval_s=0.2)
    wl = SyntheticChat(input_tokens=8, output_tokens=tokens)
    with RecordWriter(path) as w:
        engine = Engine(cfg, w)
        cpu0, t0 = time.process_time(), time.perf_counter()
        await engine.run(Plan(wl.session, offsets_ns, np.arange(len(offsets_ns))), time.perf_counter_ns() + 100_000_000)
        return engine, time.process_time() - cpu0, time.perf_counter() - t0


def part_a(streams: int, tokens: int, tmp: Path) -> None:
    """CPU per token at ``tokens`` per answer, and split into a per-request and a per-token part
    (from a second round with 8x longer answers), so the figure can be read for any answer length."""
    cost = {}
    for n in (tokens, 8 * tokens):
        proc, url = _start_server(n, 0.0)
        try:
            # one warm-up round (imports, first connections), then the measured round
            asyncio.run(_drive(url, np.zeros(streams, dtype=np.int64), n, tmp / "warm.arrows"))
            _, cpu, wall = asyncio.run(_drive(url, np.zeros(streams, dtype=np.int64), n, tmp / "a.arrows"))
        finally:
            proc.kill()
        rec = read_stream(tmp / "a.arrows").to_pydict()
        assert rec["status"].count("ok") == streams, "the benchmark server failed requests"
        cost[n] = cpu / sum(rec["output_tokens"]) * 1e6
    per_token = (cost[8 * tokens] * 8 * tokens - cost[tokens] * tokens) / (7 * tokens)
    per_request = (cost[tokens] - per_token) * tokens
    print(f"(a) {streams} streams x {tokens} tokens, one token per chunk, server writing back to back: "
          f"client CPU {cost[tokens]:.2f} us/token (target <= 4) = {per_request:.0f} us per request "
          f"+ {per_token:.2f} us per token")


def part_bc(streams: int, gap_ms: float, tmp: Path) -> None:
    tokens = 200
    proc, url = _start_server(tokens, gap_ms / 1e3)
    try:
        ramp_s = 2.0
        offs = np.linspace(0, ramp_s * 1e9, streams).astype(np.int64)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        engine, cpu, wall = asyncio.run(_drive(url, offs, tokens, tmp / "b.arrows"))
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finally:
        proc.kill()
    rec = read_stream(tmp / "b.arrows").to_pydict()
    lag = (np.array(rec["t_sent"], dtype=float) - np.array(rec["t_sched"], dtype=float)) / 1e6
    gaps = np.concatenate([np.diff(np.asarray(c)) for c in rec["chunk_ns"] if len(c) > 1]) / 1e6
    err = gaps - gap_ms
    n_tok = sum(rec["output_tokens"])
    print(f"(b) {streams} streams, {gap_ms:g} ms between tokens, one client core: {rec['status'].count('ok')} ok; "
          f"client CPU {cpu / wall:.0%} of a core, {cpu * 1e6 / max(n_tok, 1):.1f} us/token")
    print(f"    schedule lag p50 {np.percentile(lag, 50):.2f} ms, p99 {np.percentile(lag, 99):.2f} ms "
          f"(target p99 <= 5); ITL error p50 {np.percentile(err, 50):+.2f} ms, "
          f"p99 |err| {np.percentile(np.abs(err), 99):.2f} ms; loop lag max {engine.live.loop_lag_max_ms:.1f} ms")
    print(f"(c) peak RSS grew {(rss1 - rss0) / 1024:.1f} MiB for {streams} in-flight streams: "
          f"{(rss1 - rss0) / streams:.1f} KB per stream (target <= 50)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    args = ap.parse_args()
    try:
        os.sched_setaffinity(0, {0})  # the client gets one core
    except (AttributeError, OSError):
        pass
    with tempfile.TemporaryDirectory() as d:
        part_a(64, args.tokens, Path(d))
        part_bc(args.streams, args.gap_ms, Path(d))


if __name__ == "__main__":
    main()
