"""How much load can loadgen's client generate before it distorts what it measures?

One fast fake SSE server in a separate process (pinned to its own core, on uvloop, so it is not
the bottleneck) writes one event per token, each its own write (a round over every stream's next
token, then a turn of its loop), as a serving engine streams. The client (this process, pinned to
the other core) is measured four ways in one run, so their ratios are taken together:

  raw      a bare uvloop Protocol that sends a prepared request and only stamps each read (the
           floor: what reading costs on this machine before any HTTP, SSE or record work);
  least    the same Protocol doing the least that measuring a stream takes, in plain Python: a
           distinct prompt's JSON body per request, the status line, chunked framing, each SSE
           event parsed and its content counted, first and last token stamped, a tuple kept per
           request (no schedule, timeouts, fingerprint, validation, record or file): how close
           to raw a client written in Python comes before it does any of loadgen's work;
  lean     loadgen's engine on its own HTTP/1.1 (``--transport lean``, client/wire);
  aiohttp  loadgen's engine on aiohttp (``--transport aiohttp``).

  (a) client CPU per streamed token: 64 closed-loop streams of 512 tokens in / 128 out; the
      median of 3 runs after a warm-up run (``--rounds`` 20 of every stream's request each, 4
      paced), in two cases:
      - back to back (issue 18's method): the server writes as fast as its core lets it. A
        client slower than the server then finds several events waiting at each read, and
        pays for one read where the raw client pays for each (loadgen read ~0.04 times per
        token here, the raw client ~1.0): its CPU per token is not comparable with raw's;
      - paced: every stream's next token on a 2 ms tick (``PACED_S``), slow enough that every
        client keeps up and reads each event on its own, as from a serving engine's decode
        steps: the like-for-like figure.
      Each client's reads per token is printed beside it (for the engine: distinct arrival
      stamps per output chunk). The fixed cost per request is the CPU per request of answers
      of one token, back to back; a paced answer's CPU less that, per token after the first,
      is the cost of each further token (of reading and counting one event).
  (b) schedule lag p99 (``t_sent - t_sched``) at 400 and 800 open-loop streams (a 2 s ramp)
      with 20 ms between tokens (200 each), on one core: the server emits every stream's token
      on one shared tick, as an engine's decode step does; ITL error beside it.
  (c) memory per in-flight stream: the process's RSS at its peak during (b) over its RSS
      before, per stream in flight at the most (what the engine counted, sampled with the RSS:
      under a loaded machine's lag fewer than all are in flight at once). The prompts' text
      (workload.base: blocks of a seed's word stream, decoded once, a few MB that do not grow
      with streams) is built before the first RSS is taken. RSS also holds what the allocators
      keep after a burst (and a loaded machine's lag changes how many are in flight), so a
      second pass (``--traced``, apart: tracing slows the client) takes the Python heap's
      growth per stream in flight from ``tracemalloc``, when the most are in flight.

Targets (issue 18): (a) lean <= 1.2x raw per token and <= 2x raw per request (least's own ratios
show how much of either a client written in Python has left for its work); (b) lag p99 <= 5 ms at
800 streams; (c) <= 16 KB per stream.

    python benchmarks/client_capacity.py [--only a|b] [--rounds 20] [--repeats 3] [--traced lean|aiohttp]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadgen import clock as aio
from loadgen.client.config import EngineConfig, Plan
from loadgen.client.engine import Engine
from loadgen.records import RecordWriter, read_stream
from loadgen.workload.base import SyntheticChat

INPUT, OUTPUT, STREAMS = 512, 128, 64
HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Connection: keep-alive\r\n\r\n"
)
_CHUNK = {"id": "b", "object": "chat.completion.chunk", "created": 0, "model": "bench"}


def _event(body: dict[str, Any]) -> bytes:
    data = b"data: " + orjson.dumps({**_CHUNK, **body}) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _answer(n: int) -> tuple[list[bytes], bytes]:
    """One framed event per token, and the tail (finish, usage, [DONE], the last chunk)."""
    tokens = [
        _event({"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}) for i in range(n)
    ]
    usage = {"prompt_tokens": INPUT, "completion_tokens": n, "total_tokens": n + INPUT}
    tail = _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    tail += _event({"choices": [], "usage": usage}) + b"%x\r\ndata: [DONE]\n\n\r\n0\r\n\r\n" % len(b"data: [DONE]\n\n")
    return tokens, tail


# -- the server (its own process) ------------------------------------------------------------------
class _Conn(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
        self.s, self.buf = server, b""
        self.t: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].lower()
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0]) if b"content-length:" in head else 0
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            self.s.start(self)


class _Server:
    """Streams ``tokens`` events to each request: a round over every stream per ``gap_s`` tick,
    or (``gap_s`` 0) per turn of the loop, each event its own write."""

    def __init__(self, tokens: int, gap_s: float) -> None:
        self.tokens, self.gap_s = tokens, gap_s
        self.chunks, self.tail = _answer(tokens)
        self.active: list[list[Any]] = []  # [conn, next token]
        self.wake = asyncio.Event()

    def start(self, conn: _Conn) -> None:
        conn.t.write(HEAD)
        self.active.append([conn, 0])
        self.wake.set()

    def _round(self) -> None:
        still = []
        for item in self.active:
            conn, k = item
            if conn.t is None or conn.t.is_closing():
                continue
            last = k + 1 == self.tokens
            conn.t.write(self.chunks[k] + self.tail if last else self.chunks[k])
            item[1] = k + 1
            if not last:
                still.append(item)
        self.active = still

    async def pump(self) -> None:
        loop = asyncio.get_running_loop()
        nxt = loop.time()
        while True:
            if self.gap_s > 0:
                nxt += self.gap_s
                await asyncio.sleep(max(0.0, nxt - loop.time()))
            elif not self.active:
                self.wake.clear()
                await self.wake.wait()
            else:
                await asyncio.sleep(0)
            self._round()


def _serve(port_q: Any, tokens: int, gap_s: float) -> None:
    try:
        os.sched_setaffinity(0, {1})
    except (AttributeError, OSError):
        pass

    async def main() -> None:
        srv = _Server(tokens, gap_s)
        server = await asyncio.get_running_loop().create_server(lambda: _Conn(srv), "127.0.0.1", 0, backlog=4096)
        port_q.put(server.sockets[0].getsockname()[1])
        await srv.pump()

    aio.run(main())


def _start_server(tokens: int, gap_s: float) -> tuple[Any, int]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_serve, args=(q, tokens, gap_s), daemon=True)
    p.start()
    return p, int(q.get(timeout=30))


# -- the clients --------------------------------------------------------------------------------------
class _Counts:
    """What the connections of a bare client share: the requests still to send, the reads made."""

    def __init__(self, left: int) -> None:
        self.left, self.reads = left, 0


class _Raw(asyncio.Protocol):
    """The floor: sends a prepared request, stamps every read, sends the next at the answer's end."""

    def __init__(self, request: bytes, counts: _Counts, done: asyncio.Future[None]) -> None:
        self.request, self.counts, self.done = request, counts, done
        self.stamps: list[int] = []
        self.t: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.t.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.stamps.append(time.perf_counter_ns())
        self.counts.reads += 1
        if data.endswith(b"0\r\n\r\n"):
            self.stamps = []
            if self.counts.left > 0:
                self.counts.left -= 1
                self.t.write(self.request)
            elif not self.done.done():
                self.done.set_result(None)


class _Least(asyncio.Protocol):
    """The least a client written in Python must do to measure a stream, request by request."""

    _TEXT = " ".join(f"w{i % 997}" for i in range(1 << 16))  # the prompts: windows of one text

    def __init__(self, tokens: int, kept: list[tuple[int, ...]], counts: _Counts, done: asyncio.Future[None]) -> None:
        self.max_tokens, self.kept, self.counts, self.done = tokens, kept, counts, done
        self.t: Any = None
        self.seq = self.status = self.tokens = self.t_sent = self.t_first = self.t_last = 0
        self.buf = self.events = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.send()

    def send(self) -> None:
        self.seq += 1
        at = (self.seq * 7919 + id(self)) % (len(self._TEXT) - INPUT * 4)
        message = {"role": "user", "content": self._TEXT[at : at + INPUT * 4]}
        body = orjson.dumps({"model": "bench", "messages": [message], "max_tokens": self.max_tokens, "stream": True})
        self.status = self.tokens = self.t_first = self.t_last = 0
        self.buf = self.events = b""
        self.t_sent = time.perf_counter_ns()
        self.t.write(b"%s%d\r\n\r\n%s" % (_LEAST_HEAD, len(body), body))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.counts.reads += 1
        buf = self.buf + data
        if not self.status:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            self.status, buf = int(buf[9:12]), buf[end + 4 :]
        ended = False
        while (nl := buf.find(b"\r\n")) >= 0:  # chunked framing
            size = int(buf[:nl], 16)
            if size == 0:
                ended, buf = True, b""
                break
            if len(buf) < nl + size + 4:
                break
            self.events += buf[nl + 2 : nl + 2 + size]
            buf = buf[nl + size + 4 :]
        self.buf, events = buf, self.events
        while (k := events.find(b"\n\n")) >= 0:  # server-sent events
            line, events = events[:k], events[k + 2 :]
            if line.startswith(b"data: {"):
                choices = orjson.loads(line[6:]).get("choices")
                if choices and choices[0].get("delta", {}).get("content"):
                    self.tokens += 1
                    self.t_first = self.t_first or now
                    self.t_last = now
        self.events = events
        if ended:
            self.kept.append((self.seq, self.status, self.t_sent, self.t_first, self.t_last, self.tokens))
            if self.counts.left > 0:
                self.counts.left -= 1
                self.send()
            elif not self.done.done():
                self.done.set_result(None)


_LEAST_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: "


def _request_bytes() -> bytes:
    body = b'{"model":"bench","messages":[{"role":"user","content":"' + b"w " * (INPUT * 2) + b'"}],"stream":true}'
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def _bare(port: int, count: int, protocol: Callable[[_Counts, asyncio.Future[None]], Any]) -> tuple[float, int]:
    """CPU seconds of ``count`` requests over STREAMS connections of a bare client (``protocol``
    of the shared counts and its connection's end), and the reads they took."""
    loop = asyncio.get_running_loop()
    counts = _Counts(count - STREAMS)
    dones = [loop.create_future() for _ in range(STREAMS)]
    cpu0 = time.process_time()
    conns = [await loop.create_connection(partial(protocol, counts, d), "127.0.0.1", port) for d in dones]
    await asyncio.gather(*dones)
    cpu = time.process_time() - cpu0
    for t, _ in conns:
        t.close()
    return cpu, counts.reads


async def _raw(port: int, count: int) -> tuple[float, int]:
    return await _bare(port, count, partial(_Raw, _request_bytes()))


async def _least(port: int, count: int, tokens: int) -> tuple[float, int]:
    kept: list[tuple[int, ...]] = []
    got = await _bare(port, count, partial(_Least, tokens, kept))
    assert len(kept) == count and all(k[1] == 200 and k[5] == tokens for k in kept), "least: answers went wrong"
    return got


async def _engine(
    url: str,
    tokens: int,
    path: Path,
    transport: str,
    *,
    offsets: np.ndarray | None = None,
    count: int = 0,
    traced: list[float] | None = None,
) -> tuple[Engine, float, float, int, int]:
    """One engine run (closed loop of STREAMS users, or open loop at ``offsets``): the engine, its
    CPU seconds, wall seconds, the peak RSS growth (bytes) while it ran and the most requests in
    flight at once."""
    cfg = EngineConfig(url=url, model="bench", run_id="bench", flush_interval_s=0.2, transport=transport)
    session = SyntheticChat(input_tokens=INPUT, output_tokens=tokens).session
    plan = (
        Plan(session, offsets, np.arange(len(offsets)))
        if offsets is not None
        else Plan(session, concurrency=STREAMS, count=count)
    )
    if offsets is not None:
        for i in range(len(offsets)):
            session(i)  # the prompts' text blocks (a cache per seed), before the base is taken
    peak = [0, 0]
    heap0 = tracemalloc.get_traced_memory()[0]

    async def watch(base: int) -> None:
        while True:
            inflight = engine.live.inflight
            peak[0] = max(peak[0], _rss() - base)
            if inflight > peak[1] and traced is not None:  # the heap per stream at the most in flight
                traced[:] = [(tracemalloc.get_traced_memory()[0] - heap0) / inflight, inflight]
            peak[1] = max(peak[1], inflight)
            await asyncio.sleep(0.05)

    with RecordWriter(path) as w:
        engine = Engine(cfg, w)
        watcher = asyncio.ensure_future(watch(_rss()))
        cpu0, t0 = time.process_time(), time.perf_counter()
        await engine.run(plan, time.perf_counter_ns() + 100_000_000)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        watcher.cancel()
    return engine, cpu, wall, peak[0], peak[1]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- the parts ------------------------------------------------------------------------------------------
CLIENTS = ("raw", "least", "lean", "aiohttp")


PACED_S = 0.002  # (a)'s paced case: every stream's next token on this tick


def _reads_per_chunk(path: Path, count: int, who: str) -> float:
    """The distinct arrival stamps per output chunk of a run's records: the reads that carried
    output, per chunk (1.0: each chunk its own read; less: several arrived in one read)."""
    table = read_stream(path)
    status = table.column("status").to_pylist()
    assert status.count("ok") == count, f"{who}: the benchmark server failed requests"
    stamps = [s or [] for s in table.column("chunk_ns").to_pylist()]
    return sum(len(set(s)) for s in stamps) / max(sum(len(s) for s in stamps), 1)


def _client_run(who: str, port: int, tmp: Path, tokens: int, count: int) -> tuple[float, float]:
    """One run of ``count`` requests of ``tokens``-token answers: CPU seconds, reads per token."""
    if who == "raw":
        cpu, reads = aio.run(_raw(port, count))
        return cpu, reads / (count * tokens)
    if who == "least":
        cpu, reads = aio.run(_least(port, count, tokens))
        return cpu, reads / (count * tokens)
    url = f"http://127.0.0.1:{port}/v1"
    _, cpu, _, _, _ = aio.run(_engine(url, tokens, tmp / "a.arrows", who, count=count))
    return cpu, _reads_per_chunk(tmp / "a.arrows", count, who)


def part_a(tmp: Path, rounds: int, repeats: int) -> None:
    """CPU per token (128-token answers, back to back and paced) and per request (1-token answers)
    of each client, with the reads each took per token."""
    cases = (  # (name, tokens per answer, the server's tick, requests per run)
        ("back to back", OUTPUT, 0.0, STREAMS * rounds),
        ("paced", OUTPUT, PACED_S, STREAMS * max(rounds // 5, 2)),
        ("1-token", 1, 0.0, STREAMS * rounds),
    )
    cost: dict[tuple[str, str], tuple[float, float]] = {}  # (us per token, reads per token)
    for case, n, tick, count in cases:
        proc, port = _start_server(n, tick)
        try:
            for who in CLIENTS:
                runs = [_client_run(who, port, tmp, n, count) for _ in range(repeats + 1)][1:]  # the first warms
                cost[who, case] = (
                    float(np.median([cpu / (count * n) * 1e6 for cpu, _ in runs])),
                    float(np.median([reads for _, reads in runs])),
                )
        finally:
            proc.kill()
    print(
        f"(a) {STREAMS} streams, {INPUT} in / {OUTPUT} out, one event per write, median of {repeats} runs, "
        f"{aio.loop_name()}; us of client CPU, (x raw's), reads per token:"
    )
    paced = f"paced ({PACED_S * 1e3:g} ms tick)"
    print(f"    {'':8s} {'back to back':>30s} {paced:>30s} {'per request (1-token)':>24s} {'further token':>16s}")
    # a paced answer's CPU less one request's fixed cost, per token after the first
    further = {who: (cost[who, "paced"][0] * OUTPUT - cost[who, "1-token"][0]) / (OUTPUT - 1) for who in CLIENTS}
    for who in CLIENTS:
        cells = []
        for case in ("back to back", "paced"):
            tok, reads = cost[who, case]
            cells.append(f"{tok:6.2f} ({tok / cost['raw', case][0]:.2f}x), {reads:.2f} reads")
        req = cost[who, "1-token"][0]
        print(
            f"    {who:8s} {cells[0]:>30s} {cells[1]:>30s} {req:9.0f} us ({req / cost['raw', '1-token'][0]:.2f}x) "
            f"{further[who]:6.2f} ({further[who] / further['raw']:.2f}x)"
        )
    print(
        "    back to back, a client slower than the server reads several events at once (reads per token"
        " under 1): compare per token where each client read one event a read (paced)"
    )
    print("    targets: lean <= 1.20x raw per token, <= 2.00x raw per request")


def part_bc(tmp: Path, streams: int, transport: str, gap_ms: float = 20.0, tokens: int = 200) -> None:
    proc, port = _start_server(tokens, gap_ms / 1e3)
    try:
        offs = np.linspace(0, 2e9, streams).astype(np.int64)
        url = f"http://127.0.0.1:{port}/v1"
        engine, cpu, wall, grew, most = aio.run(_engine(url, tokens, tmp / "b.arrows", transport, offsets=offs))
    finally:
        proc.kill()
    rec = read_stream(tmp / "b.arrows").to_pydict()
    lag = (np.array(rec["t_sent"], dtype=float) - np.array(rec["t_sched"], dtype=float)) / 1e6
    gaps = np.concatenate([np.diff(np.asarray(c)) for c in rec["chunk_ns"] if len(c) > 1]) / 1e6
    err = gaps - gap_ms
    print(
        f"(b) {transport:8s} {streams} streams x {gap_ms:g} ms: {rec['status'].count('ok')} ok, client CPU "
        f"{cpu / wall:.0%} of a core; schedule lag p50 {np.percentile(lag, 50):.2f} ms, p99 "
        f"{np.percentile(lag, 99):.2f} ms (target <= 5); ITL error p50 {np.percentile(err, 50):+.2f} ms, "
        f"p99 |err| {np.percentile(np.abs(err), 99):.2f} ms; loop lag p99 {engine.probe.lag_p99_ms:.1f} ms"
    )
    print(
        f"(c) {transport:8s} RSS grew {grew / 2**20:.1f} MiB at the peak, {most} streams in flight at the most: "
        f"{grew / max(most, 1) / 1024:.1f} KB per stream (target <= 16)"
    )


def part_c_traced(tmp: Path, streams: int, transport: str, gap_ms: float = 20.0, tokens: int = 200) -> None:
    """(c) again, as the Python heap's growth per in-flight stream (``tracemalloc``)."""
    proc, port = _start_server(tokens, gap_ms / 1e3)
    per: list[float] = []
    try:
        offs = np.linspace(0, 1e9, streams).astype(np.int64)
        tracemalloc.start(1)
        aio.run(_engine(f"http://127.0.0.1:{port}/v1", tokens, tmp / "c.arrows", transport, offsets=offs, traced=per))
        tracemalloc.stop()
    finally:
        proc.kill()
    if not per:
        raise SystemExit(f"(c) {transport}: no request was ever in flight")
    print(
        f"(c) {transport:8s} Python heap (tracemalloc) at the most in flight ({per[1]:.0f} of {streams}): "
        f"{per[0] / 1024:.1f} KB per stream (target <= 16)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", choices=["a", "b"], help="run just one part")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one-b", metavar="STREAMS:TRANSPORT", help=argparse.SUPPRESS)  # (b) in a fresh process
    ap.add_argument("--traced", metavar="TRANSPORT", help="only (c)'s traced pass, 800 streams on TRANSPORT")
    args = ap.parse_args()
    try:
        os.sched_setaffinity(0, {0})  # the client gets one core
    except (AttributeError, OSError):
        pass
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().strip()}")
    if args.traced:
        with tempfile.TemporaryDirectory() as d:
            part_c_traced(Path(d), 800, args.traced)
        return
    if args.one_b:
        streams, transport = args.one_b.split(":")
        with tempfile.TemporaryDirectory() as d:
            part_bc(Path(d), int(streams), transport)
        return
    with tempfile.TemporaryDirectory() as d:
        if args.only != "b":
            part_a(Path(d), args.rounds, args.repeats)
    if args.only != "a":
        for streams in (800, 400):  # each in a fresh process: its RSS growth is its own
            for transport in ("lean", "aiohttp"):
                subprocess.run([sys.executable, __file__, "--one-b", f"{streams}:{transport}"], check=True)
        for transport in ("lean", "aiohttp"):
            subprocess.run([sys.executable, __file__, "--traced", transport], check=True)
    with open("/proc/loadavg") as f:
        print(f"load average after: {f.read().strip()}")


if __name__ == "__main__":
    main()
