"""The simulator's calibration table (docs/simulator.md section 6): every row, misses included.

Each row is a published offline-throughput figure (all requests queued at t=0, as
``trtllm-bench throughput`` runs them) and the simulator's ``offline_throughput`` of the same
GPU, model, TP, weight dtype and ISL/OSL, with the defaults of ``RooflineModel`` (no constant
tuned per row). Printed per row: the figure with an FP8 KV cache under both admission policies
(``reserve``: TensorRT-LLM's GUARANTEED_NO_EVICT scheduler, the like-for-like one for these rows;
``vllm``: first-chunk admission with recompute preemption, and the preemptions it made), and with a
BF16 KV cache (reserve). Usage:

    python benchmarks/sim_calibration.py [--requests 900] [--rows 20000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, NamedTuple

from loadgen.sim.model import SimRequest
from loadgen.sim.roofline import RooflineModel

A = "TensorRT-LLM 1.0 perf-overview (2025), total output tok/s"
B = "TensorRT-LLM 1.x perf-overview, GPT-OSS 120B H200 TP1, output tok/s per GPU"


class Row(NamedTuple):
    model: str
    gpu: str
    tp: int
    weights: str
    isl: int
    osl: int
    published: float
    source: str


ROWS = [
    Row("llama-3.1-8b", "h100", 1, "fp8", 1000, 1000, 15220, A),
    Row("llama-3.1-8b", "h100", 1, "fp8", 128, 2048, 22714, A),
    Row("llama-3.1-8b", "h100", 1, "fp8", 2048, 128, 3450, A),
    Row("llama-3.1-8b", "h100", 1, "fp8", 20000, 2000, 1351, A),
    Row("llama-3.1-8b", "h200", 1, "fp8", 1000, 1000, 17744, A),
    Row("llama-3.1-70b", "h100", 2, "fp8", 1000, 1000, 4205, A),
    Row("llama-3.1-70b", "h200", 1, "fp8", 1000, 1000, 2909, A),
    Row("llama-3.1-70b", "h200", 1, "fp8", 2048, 128, 442, A),
    Row("llama-3.1-70b", "b200", 1, "fp4", 1000, 1000, 7007, A),
    Row("gpt-oss-120b", "h200", 1, "fp4", 1000, 1000, 6868, B),
]


def offline(row: Row, n: int, **options: Any) -> tuple[float, int]:
    """Output tok/s of ``n`` requests queued at t=0, and the preemptions made."""
    sim = RooflineModel(row.gpu, row.model, tp=row.tp, weight_dtype=row.weights, prefix_cache=True, **options)
    # distinct prompts (token i repeated) share no block, so the prefix cache only serves a
    # preempted request its own blocks back, as vLLM V1's does
    reqs = [SimRequest(str(i), [i] * row.isl, row.osl, 0) for i in range(n)]
    for r in reqs:
        sim.submit(r)
    end = sim.simulate()
    return sum(r.emitted for r in reqs) / (end / 1e9), int(sim.stats()["num_preemptions_total"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=900)
    ap.add_argument("--rows", default="", help="only rows whose ISL is one of these (comma-separated)")
    args = ap.parse_args()
    only = {int(v) for v in args.rows.split(",") if v}
    print(
        "| model | GPU | TP | weights | ISL/OSL | published | sim FP8 KV reserve | ratio | sim FP8 KV vllm | ratio | "
        "preemptions | sim BF16 KV reserve | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    for row in ROWS:
        if only and row.isl not in only:
            continue
        res, _ = offline(row, args.requests, kv_dtype="fp8", admission="reserve")
        vll, pre = offline(row, args.requests, kv_dtype="fp8", admission="vllm")
        bf, _ = offline(row, args.requests, kv_dtype="bf16", admission="reserve")
        per_gpu = row.source == B
        div = row.tp if per_gpu else 1
        p = row.published
        print(
            f"| {row.model} | {row.gpu.upper()} | {row.tp} | {row.weights} | {row.isl}/{row.osl} | {p:,.0f} | "
            f"{res / div:,.0f} | {res / div / p:.2f} | {vll / div:,.0f} | {vll / div / p:.2f} | {pre:,} | "
            f"{bf / div:,.0f} | {bf / div / p:.2f} |",
            flush=True,
        )
    print(f"\n{args.requests} requests a row; {time.perf_counter() - t0:.0f} s here")


if __name__ == "__main__":
    main()
