"""How many tokens per second can the built-in simulator emit on one core and stay on time?

The simulator runs in its own process pinned to one core; a deliberately cheap
raw-socket client (closed loop, keep-alive, no parsing beyond finding the end of
each answer) runs on the other, so the client is not what limits. For each
concurrency the simulator's own ``/metrics`` give the emitted tokens and how
many engine steps went out late (the last of a step's tokens written to its
socket > 2 ms after the step's modelled end), over a window that starts after a
warm-up; the CPU of both processes is printed, and the time the simulator spent
waiting for its core (other processes on it) and the time a hypervisor took the
core away (steal): lateness that is not the simulator's own.

Target (issue "Built-in simulated engine"): >= 20,000 tokens/s while on time
(fewer than 1 % of steps late).

    python benchmarks/sim_capacity.py [--gpu b200] [--model llama-3.1-8b] [--weight-dtype fp8] [--seconds 8]
                                      [--truth] [--loop auto|uvloop|asyncio|both] [--floor 64] [--virtual]

``--truth`` recomputes the late steps from the simulator's ground-truth file (each
token's write instant against its modelled instant), independently of its own count.
``--loop`` picks the simulator's event loop the way ``loadgen sim`` does (``LOADGEN_LOOP``,
loadgen/clock.py; ``auto``: uvloop where installed); ``both`` measures every level on each.
``--floor BATCH`` first measures the machine without the simulator: from the simulator's core,
rounds of BATCH bare loopback sends at absolute instants one step time (3.3 ms) apart, a
round late when its last send returns > 2 ms after its instant. The share of late rounds
is lateness no simulator could avoid there (a hypervisor or another process taking the
core for a millisecond or more).
``--virtual`` first times the engine's scheduler alone: ``simulate()`` of 256 sequences x 200
tokens in virtual time (no sockets, no clock), the planning and bookkeeping every real-time step
pays; best of 5, in tokens/s on one core. It must stay far above the target, or no real-time
run can reach it.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import select
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadgen import clock as aio
from loadgen.client.prometheus import fetch_metrics, metrics_url
from loadgen.sim.model import SimRequest
from loadgen.sim.process import start_sim
from loadgen.sim.roofline import RooflineModel


def _load(host: str, port: int, request: bytes, concurrency: int, stop: threading.Event) -> int:
    """Closed loop over ``concurrency`` keep-alive connections: send, read until ``[DONE]``, send again.

    A plain epoll loop, no asyncio and no parsing (a few microseconds per read): the simulator,
    not this client, must be what limits (``main`` reports both processes' CPU to show it).
    """
    ep = select.epoll()
    socks: dict[int, socket.socket] = {}
    tails: dict[int, bytes] = {}
    for _ in range(concurrency):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        sock.setblocking(False)
        socks[sock.fileno()] = sock
        tails[sock.fileno()] = b""
        ep.register(sock.fileno(), select.EPOLLIN)
    answers = 0
    try:
        while socks:
            for fd, _ in ep.poll(1.0):
                sock = socks[fd]
                try:
                    data = sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError:  # reset: treated as closed
                    data = b""
                seen = tails[fd] + data
                if data and b"[DONE]" not in seen:
                    tails[fd] = seen[-16:]
                    continue
                if data:
                    answers += 1
                    tails[fd] = b""
                    if not stop.is_set():
                        sock.send(request)
                        continue
                ep.unregister(fd)
                sock.close()
                del socks[fd]
    finally:
        for sock in socks.values():
            sock.close()
        ep.close()
    return answers


def _cpu_s(pid: int) -> tuple[float, float]:
    """(CPU seconds, seconds spent runnable but waiting for a CPU) of a process so far.

    From Linux's /proc/PID/schedstat (zeros elsewhere). The wait is time other processes held
    the simulator's core: a step that came due then went out late for a reason not the simulator's.
    """
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def _steal_s(cpu: int) -> float:
    """Seconds the hypervisor kept CPU ``cpu`` from this (virtual) machine so far (0 if unknown)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith(f"cpu{cpu} "):
                    return int(line.split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    return 0.0


def _measure(
    url: str, sim_pid: int, model: str, concurrency: int, seconds: float, warmup: float, out_tokens: int
) -> dict[str, Any]:
    """Load the simulator for ``warmup`` + ``seconds``; figures are over the last ``seconds`` only
    (the first arrivals all land at once: a ramp, not the steady state being measured)."""
    hostport = url.split("//")[1].split("/")[0]
    host, port = hostport.rsplit(":", 1)
    body = orjson.dumps(
        {
            "model": model,
            "stream": True,
            "max_tokens": out_tokens,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "the of and to in " * 20}],
        }
    )
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    stop = threading.Event()
    answers: list[int] = []
    client = threading.Thread(target=lambda: answers.append(_load(host, int(port), request, concurrency, stop)))
    client.start()
    try:
        time.sleep(warmup)
        before = asyncio.run(fetch_metrics(metrics_url(url))) or {}
        t0, cpu0, (sim0, wait0), steal0 = time.perf_counter_ns(), time.process_time(), _cpu_s(sim_pid), _steal_s(1)
        time.sleep(seconds)
        t1 = time.perf_counter_ns()
        wall = (t1 - t0) / 1e9
        sim1, wait1 = _cpu_s(sim_pid)
        client_cpu, sim_cpu, sim_wait = time.process_time() - cpu0, sim1 - sim0, wait1 - wait0
        steal = _steal_s(1) - steal0
        after = asyncio.run(fetch_metrics(metrics_url(url))) or {}
    finally:
        stop.set()
        client.join()

    def delta(name: str) -> float:
        return after.get(f"vllm:{name}", 0.0) - before.get(f"vllm:{name}", 0.0)

    return {
        "answers": answers[0] if answers else 0,
        "tokens_per_s": delta("generation_tokens_total") / wall,
        "steps": delta("steps_total"),
        "late": delta("late_steps_total"),
        "max_late_ms": after.get("vllm:max_lateness_seconds", 0.0) * 1e3,
        "requests": delta("request_success_total"),
        "held": delta("frontend_waits_total"),
        "held_s": delta("frontend_wait_seconds_total"),
        "client_cpu": client_cpu / wall,
        "sim_cpu": sim_cpu / wall,
        "sim_wait": sim_wait / wall,
        "steal": steal / wall,
        "window_ns": (t0, t1),
    }


def _floor(batch: int, period_s: float, seconds: float) -> str:
    """An engine without a simulator: at instants ``period_s`` apart, a round of ``batch`` 180-byte
    sends, one to each of ``batch`` loopback TCP sockets, from a process pinned to CPU 1 (where the
    simulator runs) while this one reads on CPU 0. A round is late, as a step is, when its last send
    returns more than 2 ms after its instant: the share of late rounds is what this machine allows."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sender: the simulator's side, without the simulator
        code = 1
        try:
            os.close(rd)
            os.sched_setaffinity(0, {1})
            ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # 1 us of timer slack, as the engine asks (sim/engine_loop.py)
            conns = [srv.accept()[0] for _ in range(batch)]
            for c in conns:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            payload, rounds = b"x" * 180, []
            due = time.perf_counter_ns()
            deadline = due + int(seconds * 1e9)
            while due < deadline:  # like the engine: absolute instants, a late round does not move the next
                due += int(period_s * 1e9)
                time.sleep(max(0.0, (due - time.perf_counter_ns()) / 1e9))
                for c in conns:
                    c.send(payload)
                rounds.append(time.perf_counter_ns() - due)
            for c in conns:
                c.close()
            os.write(wr, orjson.dumps(rounds))
            code = 0
        finally:
            os._exit(code)
    os.close(wr)
    srv.close()
    ep = select.epoll()
    socks = {}
    for _ in range(batch):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        socks[s.fileno()] = s
        ep.register(s.fileno(), select.EPOLLIN)
    while socks:
        for fd, _ in ep.poll(1.0):
            try:
                data = socks[fd].recv(1 << 16)
            except BlockingIOError:
                continue
            if not data:
                ep.unregister(fd)
                socks.pop(fd).close()
    ep.close()
    with os.fdopen(rd, "rb") as f:
        rounds_ns = np.asarray(orjson.loads(f.read()) or [0]) / 1e6
    os.waitpid(pid, 0)
    return (
        f"floor (no simulator): rounds of {batch} loopback sends every {1e3 * period_s:.1f} ms from CPU 1, "
        f"done p50 {np.median(rounds_ns):.2f} ms, p99 {np.percentile(rounds_ns, 99):.2f} ms after their instant; "
        f"{100 * (rounds_ns > 2).mean():.1f}% of rounds late (> 2 ms)"
    )


def _truth_lateness(path: Path, window_ns: tuple[int, int], threshold_ms: float = 2.0) -> str:
    """The simulator's lateness recomputed from its ground truth, independently of its own count:
    each step (the tokens sharing a modelled instant inside the window) is late by its last token's
    write time minus that instant."""
    lo, hi = window_ns
    last: dict[int, int] = {}
    lateness: list[int] = []
    for line in path.read_bytes().splitlines():
        t = orjson.loads(line)
        for m, w in zip(t["model_ns"], t.get("written_ns") or [], strict=False):
            if lo <= m < hi:
                last[m] = max(last.get(m, w), w)
                lateness.append(w - m)
    if not last:
        return "truth: no tokens in the window"
    steps = np.asarray([w - m for m, w in last.items()]) / 1e6
    tok = np.asarray(lateness) / 1e6
    return (
        f"truth: {100 * (steps > threshold_ms).mean():.1f}% of {len(steps)} steps late; token write lateness "
        f"p50 {np.median(tok):.2f} ms, p99 {np.percentile(tok, 99):.2f} ms, max {tok.max():.1f} ms"
    )


def _virtual(gpu: str, model: str, sequences: int = 256, tokens: int = 200, repeats: int = 5) -> str:
    """The scheduler's speed in virtual time: ``sequences`` decoding ``tokens`` each, all at once."""
    best = 0.0
    for _ in range(repeats):
        m = RooflineModel(gpu, model, max_num_seqs=sequences, prefix_cache=False)
        for i in range(sequences):
            m.submit(SimRequest(str(i), [i] * 64, tokens, 0))
        t = time.perf_counter()
        m.simulate()
        best = max(best, sequences * tokens / (time.perf_counter() - t))
    return f"virtual scheduler ({sequences} sequences): {best:.0f} tokens/s planned and emitted (best of {repeats})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="b200")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--weight-dtype", default=None, help="bf16 | fp8 | fp4 (default: the model's)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per level")
    ap.add_argument("--warmup", type=float, default=1.5, help="seconds of load before measuring")
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--concurrency", default="32,64,68,72,80,96,128,256")
    ap.add_argument(
        "--truth",
        action="store_true",
        help="also recompute the lateness from the simulator's ground truth (--truth file)",
    )
    ap.add_argument(
        "--loop",
        default="auto",
        choices=("auto", "uvloop", "asyncio", "both"),
        help="the simulator's event loop (auto: uvloop where installed); both: each in turn",
    )
    ap.add_argument(
        "--floor",
        type=int,
        default=0,
        metavar="BATCH",
        help="first time rounds of BATCH bare loopback sends every 3.3 ms from the simulator's core",
    )
    ap.add_argument("--virtual", action="store_true", help="first time the scheduler alone, in virtual time")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.virtual:
        print(_virtual(args.gpu, args.model), flush=True)
    if args.floor:
        print(_floor(args.floor, 0.0033, args.seconds), flush=True)
    loops = ("uvloop", "asyncio") if args.loop == "both" else (args.loop,)
    best: dict[str, float] = {}
    for loop in loops:
        name = _use_loop(loop)
        best[name] = 0.0
        for c in levels:
            r = _level(args, levels, c)
            if _report(name, c, r):
                best[name] = max(best[name], r["tokens_per_s"])
    for name, rate in best.items():
        print(f"highest on-time rate ({name}): {rate:.0f} tokens/s on one core (target >= 20,000)")


def _report(loop: str, c: int, r: dict[str, Any]) -> bool:
    """Print one level's figures; whether it was on time (< 1 % of steps late)."""
    late_pct = 100 * r["late"] / max(r["steps"], 1)
    on_time = bool(late_pct < 1.0)
    held = (
        (
            f"; {int(r['held'])} of ~{int(r['requests'])} requests held for headroom, "
            f"{1e3 * r['held_s'] / r['held']:.1f} ms on average"
        )
        if r["held"]
        else ""
    )
    print(
        f"{loop:7s} concurrency {c:4d}: {r['tokens_per_s']:9.0f} tokens/s emitted, {int(r['steps'])} steps, "
        f"{late_pct:5.1f}% late (max since start {r['max_late_ms']:.1f} ms) "
        f"{'on time' if on_time else 'BEHIND'}; "
        f"CPU: sim {100 * r['sim_cpu']:.0f}% (+{100 * r['sim_wait']:.1f}% waiting for its core, "
        f"{100 * r['steal']:.1f}% stolen by the hypervisor), "
        f"client {100 * r['client_cpu']:.0f}%{held}"
        + ("  (client near saturation: the figure may be the client's)" if r["client_cpu"] > 0.8 else ""),
        flush=True,
    )
    if r.get("truth"):
        print("                          " + r["truth"], flush=True)
    return on_time


def _use_loop(loop: str) -> str:
    """Make the simulators started from now on run on ``loop`` (they inherit LOADGEN_LOOP); its name."""
    if loop == "auto":
        os.environ.pop(aio.LOOP_ENV, None)
    else:
        os.environ[aio.LOOP_ENV] = loop
    return aio.loop_name()


def _level(args: argparse.Namespace, levels: list[int], c: int) -> dict[str, Any]:
    """One load level on a fresh simulator (pinned to CPU 1, this process to CPU 0)."""
    flags = ["--gpu", args.gpu, "--model", args.model, "--max-num-seqs", str(max(levels))]
    if args.weight_dtype:
        flags += ["--weight-dtype", args.weight_dtype]
    truth = Path(tempfile.mkdtemp()) / "truth.jsonl"
    if args.truth:
        flags += ["--truth", str(truth)]
    try:
        with start_sim(flags) as sim:
            try:
                os.sched_setaffinity(sim.proc.pid, {1})
                os.sched_setaffinity(0, {0})
            except (AttributeError, OSError):
                pass
            r = _measure(sim.url, sim.proc.pid, args.model, c, args.seconds, args.warmup, args.output_tokens)
        if args.truth:
            r["truth"] = _truth_lateness(truth, r["window_ns"])
    finally:
        shutil.rmtree(truth.parent, ignore_errors=True)
    return r


if __name__ == "__main__":
    main()
