"""The simulator's fidelity terms: the per-layer floor, preemption and its recompute, admission
policies, speculative decoding's token accounting, and the prefill/decode split."""

from __future__ import annotations

import pytest

from loadgen.sim.disaggregated import DisaggregatedModel
from loadgen.sim.model import SimRequest
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.sequences import StepPlan


def reqs(n: int, prompt: int, out: int, arrival_ns: int = 0) -> list[SimRequest]:
    return [SimRequest(str(i), [i + 1] * prompt, out, arrival_ns) for i in range(n)]


def run(engine: RooflineModel, rs: list[SimRequest]) -> list[tuple[StepPlan, int]]:
    """Every step and the tokens it computed, as the virtual-time loop drives an engine."""
    for r in rs:
        engine.submit(r)
    plans = []
    while (start := engine._next_start()) is not None:
        step = engine.step_at(start)
        if step is None:
            break
        plans.append((step[0], sum(s.step_tokens for s in step[0].items)))
        engine.finish_at(*step)
    return plans


def test_moe_small_batch_decode_is_held_up_by_the_layer_floor() -> None:
    moe = RooflineModel("h200", "gpt-oss-120b")
    # 36 layers x (15 us + 80 us for MoE) + 0.5 ms step overhead: above its 0.8 ms weight read
    assert moe.decode_step_s(1, 1000) == pytest.approx(36 * 95e-6 + 0.5e-3)
    bare = RooflineModel("h200", "gpt-oss-120b", layer_floor_s=0.0, moe_layer_floor_s=0.0)
    assert bare.decode_step_s(1, 1000) < 1.5e-3
    dense = RooflineModel("h100", "llama-3.1-8b")  # 32 x 15 us is far below its 6 ms weight read
    assert dense.decode_step_s(1, 1000) == pytest.approx(
        RooflineModel("h100", "llama-3.1-8b", layer_floor_s=0.0).decode_step_s(1, 1000)
    )


def test_recompute_preemption_accounts_for_every_token_computed_again() -> None:
    # a pool of 64 blocks x 16 tokens holds two of these 500-token sequences, not four
    m = RooflineModel("h100", "llama-3.1-8b", num_gpu_blocks_override=64, prefix_cache=False)
    rs = reqs(4, 300, 200)
    computed = sum(n for _, n in run(m, rs))
    st = m.stats()
    assert st["num_preemptions_total"] >= 1 and st["num_preemptions_total"] == sum(r.preemptions for r in rs)
    assert all(r.emitted == 200 for r in rs)
    # without preemption each request computes its prompt and all but its last token
    assert computed == 4 * (300 + 199) + st["recomputed_tokens_total"] > 4 * (300 + 199)


def test_reserve_admission_never_preempts() -> None:
    m = RooflineModel("h100", "llama-3.1-8b", num_gpu_blocks_override=64, prefix_cache=False, admission="reserve")
    rs = reqs(4, 300, 200)
    plans = run(m, rs)
    assert m.stats()["num_preemptions_total"] == 0 and m.stats()["recomputed_tokens_total"] == 0
    assert all(r.emitted == 200 for r in rs)
    assert max(len(p.items) for p, _ in plans) == 2  # two whole sequences fit, so two run at once
    assert m.pool.num_used == 0


def chunks(r: SimRequest) -> list[int]:
    out: dict[int, int] = {}
    for t in r.emit_ns:
        out[t] = out.get(t, 0) + 1
    return list(out.values())


def test_speculative_decoding_emits_exactly_max_tokens_in_verified_chunks() -> None:
    always = RooflineModel("h100", "llama-3.1-8b", spec_tokens=3, spec_acceptance=1.0)
    (r,) = reqs(1, 100, 10)
    run(always, [r])
    assert chunks(r) == [1, 4, 4, 1]  # the first token, then 1 + 3 accepted drafts, capped at max_tokens
    assert always.stats()["generation_tokens_total"] == 10 and always.pool.num_used == 0
    never = RooflineModel("h100", "llama-3.1-8b", spec_tokens=3, spec_acceptance=0.0, spec_draft_cost=0.1)
    (q,) = reqs(1, 100, 10)
    run(never, [q])
    assert chunks(q) == [1] * 10
    plain = RooflineModel("h100", "llama-3.1-8b")
    (p,) = reqs(1, 100, 10)
    run(plain, [p])
    assert q.emit_ns[-1] > p.emit_ns[-1]  # verifying drafts that all fail costs time for nothing


def test_speculative_acceptance_is_drawn_per_request_the_same_every_run() -> None:
    def pattern() -> list[list[int]]:
        m = RooflineModel("h100", "llama-3.1-8b", spec_tokens=4, spec_acceptance=0.6)
        rs = reqs(3, 50, 40)
        run(m, rs)
        assert m.stats()["generation_tokens_total"] == 120
        return [chunks(r) for r in rs]

    a = pattern()
    assert a == pattern() and all(sum(c) == 40 and max(c) <= 5 for c in a)


def test_disaggregated_first_token_from_prefill_rest_after_the_kv_transfer() -> None:
    d = DisaggregatedModel("h100", "llama-3.1-8b", prefill={}, decode={}, kv_transfer_gb_s=10.0)
    (r,) = reqs(1, 1000, 5)
    run(d, [r])
    pre, dec = d.prefill_pool[0], d.decode_pool[0]
    assert d.gpus == 2 and dec is d
    assert r.emit_ns[0] == int(pre.prefill_time_s(1000) * 1e9)
    # 1000 tokens x 128 KiB of BF16 KV (32 layers x 8 heads x 128 x 2 x 2 B) at 10 GB/s, + 0.5 ms
    xfer = 1000 * 131072 / 10e9 + 0.0005
    assert d.transfer_s(1000) == pytest.approx(xfer)
    second = r.emit_ns[0] + int(xfer * 1e9) + int(dec.decode_step_s(1, 1000) * 1e9)
    assert abs(r.emit_ns[1] - second) <= 2
    st = d.stats()
    assert (st["prompt_tokens_total"], st["generation_tokens_total"], st["request_success_total"]) == (1000, 5, 1)
    assert dec.stats()["prefix_cache_hits_total"] == 0  # the transferred KV is no cache hit
