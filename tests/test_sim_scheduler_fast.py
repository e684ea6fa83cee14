"""The scheduler's bulk decode (steady decodes kept as counts) decides exactly what the walk does.

The same requests go into two engines: one steps with the per-sequence walk (``simulate``, as the
real-time loop does), the other with ``bulk_decode`` on. Every token's instant, every request's
ground truth and every counter must be the same, through prefix-cache hits, preemptions, a
reservation scheduler, a watermark and cancels in mid-run.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from loadgen.sim.model import SimRequest
from loadgen.sim.roofline import RooflineModel


def _record(r: SimRequest, ends: list[int], g0: int, g1: int) -> None:
    """What ``SimRequest.emit`` records, for tokens handed over in bulk."""
    stamps = ends[g0:g1]
    r.emit_ns.extend(stamps)
    r.model_ns.extend(stamps)
    r.emitted += len(stamps)
    if r.emitted >= r.max_tokens:
        r.finished = True


def _requests(seed: int, n: int) -> list[SimRequest]:
    """Arrivals over ~2 s; prompts of 20-400 tokens, a third of them sharing a 64-token head."""
    rng = random.Random(seed)
    out, t = [], 0
    for i in range(n):
        t += rng.randrange(0, 60_000_000)
        head = [7] * 64 if rng.random() < 0.35 else []
        prompt = head + [rng.randrange(1000) for _ in range(rng.randrange(20, 400))]
        out.append(SimRequest(f"r{i}", prompt, rng.choice([1, 2, 17, 64, 150]), t))
    return out


def _run(bulk: bool, seed: int, n: int, cancel: int, **kw: Any) -> tuple[list[tuple[Any, ...]], dict[str, float]]:
    eng = RooflineModel("h100", "llama-3.1-8b", **kw)
    if bulk:
        assert eng.bulk_decode(_record)
    reqs = _requests(seed, n)
    for r in reqs:
        eng.submit(r)
    eng.simulate(until_ns=reqs[n // 2].arrival_ns)
    for r in reqs[:: max(1, n // max(1, cancel))][:cancel]:  # the client went away in mid-run
        eng.cancel(r)
    eng.simulate()
    rows = [
        (r.emit_ns, r.model_ns, r.queue_wait_ns, r.prefill_end_ns, r.cached_tokens, r.preemptions, r.finished)
        for r in reqs
    ]
    return rows, eng.stats()


CASES = {
    "roomy pool, prefix hits": {"max_num_seqs": 64},
    "short pool: preemption": {"num_gpu_blocks_override": 180, "max_num_seqs": 48},
    "short pool, no prefix cache": {"num_gpu_blocks_override": 150, "prefix_cache": False},
    "reservation scheduler": {"num_gpu_blocks_override": 400, "admission": "reserve"},
    "watermark, small budget": {"num_gpu_blocks_override": 300, "kv_watermark": 0.05, "max_batch_tokens": 512},
    "blocks of 64": {"block_size": 64, "num_gpu_blocks_override": 60},
}


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("seed", [1, 2])
def test_bulk_decode_gives_every_token_and_counter_the_walk_gives(kw: dict[str, Any], seed: int):
    walk, walk_stats = _run(False, seed, 90, 6, **kw)
    bulk, bulk_stats = _run(True, seed, 90, 6, **kw)
    assert bulk == walk
    assert bulk_stats == walk_stats
    assert walk_stats["generation_tokens_total"] > 2000  # the case did run, and decoded


def test_the_short_pool_cases_do_preempt():
    """(So that the fallback to the walk is what the equivalence above pins.)"""
    assert _run(True, 1, 90, 0, num_gpu_blocks_override=180, max_num_seqs=48)[1]["num_preemptions_total"] > 0


def test_a_steady_step_walks_no_sequence_and_counts_every_decode():
    eng = RooflineModel("h100", "llama-3.1-8b")
    assert eng.bulk_decode(_record)
    reqs = [SimRequest(f"r{i}", [i] * 100, 50, 0) for i in range(40)]
    for r in reqs:
        eng.submit(r)
    first = eng._schedule(0)
    assert first is not None and len(first.items) == 40 and first.steady == 0  # the prefills
    eng._complete(first, int(first.seconds * 1e9))
    step = eng._schedule(eng._t_model)
    assert step is not None and step.items == [] and step.steady == 40
    assert step.seconds == eng.decode_step_s(40, 100)  # priced from the totals as the walk prices it


def test_bulk_decode_is_refused_with_speculative_decoding():
    eng = RooflineModel("h100", "llama-3.1-8b", spec_tokens=2, spec_acceptance=0.5)
    assert not eng.bulk_decode(_record)
