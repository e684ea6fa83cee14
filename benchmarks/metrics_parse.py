"""How much CPU one ``/metrics`` scrape spends parsing, for a real engine's body and at the bounds.

The scraper parses once per interval (1 s by default) in the client's own process, so
for a real engine this must stay at a few milliseconds. The bodies: a vLLM-shaped one
(two engines, 14 histograms of 25 buckets, 12 gauges and 12 counters, as
prometheus_client renders them: ~90 KiB, ~1000 lines, of which ~100 are parsed); then
the worst an untrusted endpoint can make one parse cost: ordinary and escaped-quote
sample lines just under ``MAX_SAMPLE_BYTES`` (the most that is parsed), 4 MiB of sample
lines (refused before parsing) and 4 MiB of bucket lines (skipped before parsing).

Run: ``python benchmarks/metrics_parse.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from loadgen.client.metric_names import parse_engine_metrics
from loadgen.client.prometheus import MAX_BYTES, MAX_LINE, MAX_SAMPLE_BYTES, PrometheusTextError

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def vllm_body() -> str:
    reg = CollectorRegistry()
    labels = ["engine", "model_name"]
    buckets = [0.001 * 2**i for i in range(25)]
    for i in range(14):
        h = Histogram(f"vllm:histogram_{i}_seconds", "A latency.", labels, buckets=buckets, registry=reg)
        for engine in ("0", "1"):
            h.labels(engine, MODEL).observe(0.1)
    for i in range(12):
        g = Gauge(f"vllm:gauge_{i}", "A level.", labels, registry=reg)
        c = Counter(f"vllm:counter_{i}", "A count.", labels, registry=reg)
        for engine in ("0", "1"):
            g.labels(engine, MODEL).set(3)
            c.labels(engine, MODEL).inc(5)
    return generate_latest(reg).decode()


def bodies() -> dict[str, str]:
    line = f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 7.0\n'
    escaped = 'vllm:x{a="' + '\\"' * (MAX_LINE // 2 - 10) + '"} 1\n'
    bucket = f'vllm:ttft_seconds_bucket{{le="0.1",model_name="{MODEL}"}} 1\n'
    return {
        "vLLM-shaped": vllm_body(),
        "sample lines, just under the budget": line * (MAX_SAMPLE_BYTES // len(line) - 1),
        "escaped-quote lines, just under the budget": escaped * (MAX_SAMPLE_BYTES // len(escaped) - 1),
        "sample lines, 4 MiB (refused)": line * (MAX_BYTES // len(line)),
        "bucket lines, 4 MiB (skipped)": bucket * (MAX_BYTES // len(bucket)),
    }


def timed(parse: Callable[[], dict[str, float]], repeat: int) -> tuple[float, float, str]:
    """Min and median ms of ``repeat`` parses, and what the parse gave."""
    times, said = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            said = f"{len(parse())} names"
        except PrometheusTextError as e:
            said = str(e)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0] * 1e3, times[len(times) // 2] * 1e3, said


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    parse_engine_metrics("vllm:warm_up 1\n")  # the parser's import is not a scrape's cost
    print(f"{'body':46} {'KiB':>6} {'lines':>7} {'min ms':>8} {'median':>8}  result")
    for name, text in bodies().items():
        lo, mid, said = timed(partial(parse_engine_metrics, text), args.repeat)
        print(f"{name:46} {len(text) / 1024:6.0f} {text.count(chr(10)):7} {lo:8.2f} {mid:8.2f}  {said[:60]}")


if __name__ == "__main__":
    main()
