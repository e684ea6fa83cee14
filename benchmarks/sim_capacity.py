"""How many tokens per second can the built-in simulator emit on one core and stay on time?

The simulator runs in its own process pinned to one core; a deliberately cheap
raw-socket client (closed loop, keep-alive, no parsing beyond finding the end of
each answer) runs on the other, so the client is not what limits. For each
concurrency the simulator's own ``/metrics`` give the emitted tokens and how
many engine steps went out late (> 2 ms after their modelled instant).

Target (issue "Built-in simulated engine"): >= 20,000 tokens/s while on time
(fewer than 1 % of steps late).

    python benchmarks/sim_capacity.py [--gpu b200] [--model llama-3.1-8b] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import orjson

from loadgen.prom import fetch_metrics, metrics_url
from loadgen.sim.process import start_sim


class _Stream(asyncio.Protocol):
    """One keep-alive connection sending the same request again as each answer ends."""

    def __init__(self, request: bytes, stop_at: float) -> None:
        self.request, self.stop_at = request, stop_at
        self.tail = b""
        self.done = asyncio.get_running_loop().create_future()
        self.answers = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.t.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        seen = self.tail + data
        self.tail = seen[-16:]
        if b"[DONE]" in seen:
            self.answers += 1
            self.tail = b""
            if time.monotonic() < self.stop_at:
                self.t.write(self.request)  # type: ignore[attr-defined]
            elif not self.done.done():
                self.done.set_result(self.answers)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(self.answers)


async def _load(host: str, port: int, model: str, concurrency: int, seconds: float, out_tokens: int) -> int:
    body = orjson.dumps({"model": model, "stream": True, "max_tokens": out_tokens, "ignore_eos": True,
                         "messages": [{"role": "user", "content": "the of and to in " * 20}]})
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    stop_at = time.monotonic() + seconds
    streams = []
    for _ in range(concurrency):
        _, proto = await loop.create_connection(lambda: _Stream(request, stop_at), host, port)
        streams.append(proto)
    return sum(await asyncio.gather(*(s.done for s in streams)))


async def _measure(url: str, model: str, concurrency: int, seconds: float, out_tokens: int) -> dict[str, float]:
    hostport = url.split("//")[1].split("/")[0]
    host, port = hostport.rsplit(":", 1)
    before = await fetch_metrics(metrics_url(url)) or {}
    t0 = time.perf_counter()
    answers = await _load(host, int(port), model, concurrency, seconds, out_tokens)
    wall = time.perf_counter() - t0
    after = await fetch_metrics(metrics_url(url)) or {}

    def delta(name: str) -> float:
        return after.get(f"vllm:{name}", 0.0) - before.get(f"vllm:{name}", 0.0)

    return {"answers": answers, "tokens_per_s": delta("generation_tokens_total") / wall,
            "steps": delta("steps_total"), "late": delta("late_steps_total"),
            "max_late_ms": after.get("vllm:max_lateness_seconds", 0.0) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="b200")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--concurrency", default="32,64,128,256,512")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    best = 0.0
    for c in levels:
        flags = ["--gpu", args.gpu, "--model", args.model, "--max-num-seqs", str(max(levels))]
        with start_sim(flags) as sim:
            try:
                os.sched_setaffinity(sim.proc.pid, {1})
                os.sched_setaffinity(0, {0})
            except (AttributeError, OSError):
                pass
            r = asyncio.run(_measure(sim.url, args.model, c, args.seconds, args.output_tokens))
        late_pct = 100 * r["late"] / max(r["steps"], 1)
        on_time = late_pct < 1.0
        if on_time:
            best = max(best, r["tokens_per_s"])
        print(f"concurrency {c:4d}: {r['tokens_per_s']:9.0f} tokens/s emitted, {int(r['steps'])} steps, "
              f"{late_pct:5.1f}% late (max {r['max_late_ms']:.1f} ms) {'on time' if on_time else 'BEHIND'}")
    print(f"highest on-time rate: {best:.0f} tokens/s on one core (target >= 20,000)")


if __name__ == "__main__":
    main()
