"""The roofline continuous-batching simulator: profiles, analytic step times, scheduling,
KV capacity, preemption and prefix caching, in virtual time (the asyncio loop that runs it on a
clock: test_sim_engine_loop.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.sim import profiles
from loadgen.sim.model import SimRequest
from loadgen.sim.roofline import RooflineModel, offline_throughput
from loadgen.sim.step_cost import CapacityError

H100 = profiles.gpu("h100")
L8B = profiles.model("llama-3.1-8b")


def sim(**kw) -> RooflineModel:
    kw.setdefault("gpu", H100)
    kw.setdefault("model", L8B)
    return RooflineModel(**kw)


def req(rid: str, prompt: list[int] | int, max_tokens: int, arrival_ns: int = 0) -> SimRequest:
    ids = list(range(prompt)) if isinstance(prompt, int) else prompt
    return SimRequest(rid, ids, max_tokens, arrival_ns)


# ---- profiles -----------------------------------------------------------------------------
def test_builtin_profiles_load_and_cite_sources():
    assert {"h100", "h200", "b200", "mi300x"} <= set(profiles.list_gpus())
    names = {"llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"}
    assert names <= set(profiles.list_models())
    for g in profiles.list_gpus():
        assert profiles.gpu(g).sources
    for m in profiles.list_models():
        assert profiles.model(m).sources


def test_lookup_by_alias_any_case_and_clear_error():
    assert profiles.gpu("H100-SXM").name == "h100"
    assert profiles.model("DeepSeek-R1").name == "deepseek-v3"
    with pytest.raises(profiles.ProfileError, match=r"unknown gpu 'h300'.*h100.*mi300x"):
        profiles.gpu("h300")
    with pytest.raises(profiles.ProfileError, match=r"unknown model 'llama-9b'.*llama-3.1-8b"):
        profiles.model("llama-9b")


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"hbm_tb_s": None}, "hbm_tb_s"),
        ({"hbm_tb_s": "fast"}, "hbm_tb_s"),
        ({"hbm_gib": -1}, "hbm_gib"),
        ({"colour": "green"}, "colour"),
    ],
)
def test_bad_gpu_file_names_file_and_field(tmp_path, edit, field):
    data = {
        "name": "x",
        "display_name": "X",
        "hbm_gib": 1,
        "hbm_tb_s": 1,
        "bf16_tflops": 1,
        "interconnect_gb_s": 1,
        "allreduce_latency_us": 1,
        "sources": ["me"],
    }
    data.update(edit)
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "x.yaml"
    path.write_text(profiles.yaml.safe_dump(data))
    with pytest.raises(profiles.ProfileError, match=rf"x\.yaml: field '{field}'"):
        profiles.gpu(str(path))


def test_bad_model_fields_are_rejected(tmp_path):
    good = dataclasses.asdict(L8B)
    good.update(aliases=[], sources=["me"], moe=None, mla=None, sliding_window=None)
    for edit, field in [
        ({"weight_dtype": "int3"}, "weight_dtype"),
        ({"params_active_b": 9.0}, "params_active_b"),
        ({"moe": {"experts": 8}}, "moe.experts_per_token"),
        ({"layers": 32.5}, "layers"),
    ]:
        data = {k: v for k, v in {**good, **edit}.items() if v is not None}
        path = tmp_path / "m.yaml"
        path.write_text(profiles.yaml.safe_dump(data))
        with pytest.raises(profiles.ProfileError, match=rf"m\.yaml: field '{field}'"):
            profiles.model(str(path))


def test_moe_split_and_dtype_fallback():
    mix = profiles.model("mixtral-8x7b")
    assert mix.expert_params == pytest.approx(5.633e9, rel=1e-3)
    assert mix.dense_params + 8 * mix.expert_params == pytest.approx(46.7e9)
    assert H100.peak_flops("fp4") == H100.peak_flops("bf16")  # no FP4 tensor cores
    assert profiles.gpu("b200").peak_flops("fp4") == 4 * profiles.gpu("b200").peak_flops("bf16")


# ---- sizes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "tp", "kv", "expected"),
    [
        ("llama-3.1-8b", 1, "bf16", 2 * 8 * 128 * 2 * 32),
        ("llama-3.1-8b", 2, "fp8", 2 * 4 * 128 * 1 * 32),
        ("llama-3.1-70b", 16, "bf16", 2 * 1 * 128 * 2 * 80),  # 8 KV heads replicated to 16
        ("deepseek-v3", 8, "bf16", (512 + 64) * 2 * 61),  # MLA latent, not split by TP
        ("gpt-oss-120b", 1, "bf16", 2 * 8 * 64 * 2 * 18),  # full-attention layers only
    ],
)
def test_kv_bytes_per_token(model, tp, kv, expected):
    m = RooflineModel("b200" if tp < 8 else "h200", model, tp=tp, kv_dtype=kv, num_gpu_blocks_override=100)
    assert m.kv_bytes_per_token == expected


def test_kv_capacity_is_hbm_minus_weights_over_kv_per_token():
    tiny = dataclasses.replace(H100, name="tiny", hbm_gib=20)
    m = sim(gpu=tiny)
    free = 20 * 2**30 * 0.9 - 8.03e9 * 2
    assert m.kv_capacity_tokens() == int(free // (131072 * 16)) * 16
    assert m.max_model_len == m.kv_capacity_tokens()


def test_weights_that_do_not_fit_name_the_tp_needed():
    with pytest.raises(CapacityError, match="needs tp >= 2"):
        RooflineModel("h100", "llama-3.1-70b")
    with pytest.raises(CapacityError, match="divide"):
        RooflineModel("h100", "llama-3.1-70b", tp=3)
    assert RooflineModel("h100", "llama-3.1-70b", tp=2).kv_capacity_tokens() > 10_000


# ---- the roofline -------------------------------------------------------------------------
def test_batch1_decode_is_weight_bytes_over_bandwidth():
    m = sim()
    expected = 8.03e9 * 2 / (3.35e12 * 0.8) + m.step_overhead_s
    assert m.decode_step_s(1, 0) == pytest.approx(expected, rel=1e-3)


def test_prefill_is_compute_bound_and_linear_in_prompt_length():
    m = sim()
    t1, t2, t4 = (m.prefill_time_s(n) for n in (1000, 2000, 4000))
    assert t2 == pytest.approx(2 * 8.03e9 * 2000 / (989.4e12 * 0.5), rel=0.08)
    assert 1.9 < (t4 - m.step_overhead_s) / (t2 - m.step_overhead_s) < 2.15
    assert (t4 - t2) / 2000 == pytest.approx((t2 - t1) / 1000, rel=0.1)
    # Beyond the token budget a prompt takes several chunked steps.
    long = m.prefill_time_s(20_000)
    assert long > m.prefill_time_s(8192) * 2


def test_decode_is_flat_until_the_arithmetic_intensity_crossover():
    m = sim()
    # Crossover batch: compute = memory where 2*P*b/(peak*mfu) = 2*P/(bw*mbu) (bf16 weights)
    # i.e. b* = peak*mfu / (bw*mbu): ~185 on H100 (the ~300 FLOPs/byte ridge, times 0.5/0.8).
    ridge = 989.4e12 / 3.35e12
    assert 290 < ridge < 300
    b_star = ridge * 0.5 / 0.8
    t1 = m.decode_step_s(1, 0)
    assert m.decode_step_s(int(b_star / 4), 0) < 1.05 * t1
    assert m.decode_step_s(int(b_star * 0.9), 0) < 1.05 * t1
    assert m.decode_step_s(int(b_star * 4), 0) > 3.5 * t1
    per_tok = [b / m.decode_step_s(b, 0) for b in (1, 32, 128, int(4 * b_star), int(8 * b_star))]
    assert per_tok == sorted(per_tok)  # throughput rises...
    assert per_tok[-1] / per_tok[-2] < 1.05  # ...and saturates


def test_decode_cost_grows_with_context():
    m = sim()
    assert m.decode_step_s(64, 8000) > 1.5 * m.decode_step_s(64, 100)
    assert m.step_time_s([100] * 64) == pytest.approx(m.decode_step_s(64, 100))


def test_h200_decodes_faster_than_h100():
    h100, h200 = sim(), sim(gpu=profiles.gpu("h200"))
    r = h100.decode_step_s(32, 2000) / h200.decode_step_s(32, 2000)
    assert 1.3 < r < 4.8 / 3.35 + 0.01


def test_moe_reads_only_touched_experts_at_small_batch():
    mix = RooflineModel("h100", "mixtral-8x7b", tp=2)
    dense = RooflineModel("h100", "llama-3.1-70b", tp=2)
    assert mix.decode_step_s(64, 0) / mix.decode_step_s(1, 0) > 2.5  # 2 of 8 -> all 8
    assert dense.decode_step_s(64, 0) / dense.decode_step_s(1, 0) < 1.1


def test_tensor_parallel_adds_communication():
    one = RooflineModel("h200", "llama-3.1-70b", weight_dtype="fp8")
    four = RooflineModel("h200", "llama-3.1-70b", weight_dtype="fp8", tp=4)
    t1, t4 = one.decode_step_s(1, 0), four.decode_step_s(1, 0)
    assert t4 < t1 / 2  # weights split four ways...
    assert t4 > (t1 - one.step_overhead_s) / 4 + four.step_overhead_s  # ...plus all-reduces


# ---- scheduling in virtual time -----------------------------------------------------------
def test_queueing_starts_at_the_predicted_kv_capacity():
    m = sim(num_gpu_blocks_override=40, prefix_cache=False)
    assert m.kv_capacity_tokens() == 640
    rs = [req(str(i), 90, 3) for i in range(10)]  # 90 + 3 tokens: 6 blocks each
    for r in rs:
        m.submit(r)
    m.simulate(until_ns=1)  # exactly one step
    st = m.stats()
    fit = m.kv_capacity_tokens() // (6 * 16)
    assert (st["num_requests_running"], st["num_requests_waiting"]) == (fit, 10 - fit)
    assert st["kv_cache_usage_perc"] == pytest.approx(fit * 6 / 40)
    m.simulate()
    assert all(r.finished and r.emitted == 3 for r in rs)
    assert [r.queue_wait_ns == 0 for r in rs] == [True] * fit + [False] * (10 - fit)
    assert m.stats()["num_preemptions_total"] == 0
    assert m.stats()["kv_cache_usage_perc"] == 0


def test_decodes_that_outgrow_the_cache_preempt_the_newest():
    m = sim(num_gpu_blocks_override=40, prefix_cache=False)
    rs = [req(str(i), 90, 20) for i in range(6)]  # 6 blocks at admission, 7 by the end
    for r in rs:
        m.submit(r)
    m.simulate()
    assert m.stats()["num_preemptions_total"] >= 1
    assert rs[-1].preemptions >= 1 and rs[0].preemptions == 0
    for r in rs:
        assert r.emitted == 20 and len(r.emit_ns) == 20
        assert r.emit_ns == sorted(r.emit_ns)

    # The preempted sequence stalls while it re-prefills prompt + generated tokens.
    def worst_gap(r: SimRequest) -> int:
        return max(b - a for a, b in zip(r.emit_ns, r.emit_ns[1:], strict=False))

    assert worst_gap(rs[-1]) > 1.5 * worst_gap(rs[0])
    st = m.stats()
    assert st["request_success_total"] == 6 and st["generation_tokens_total"] == 120


def test_chunked_prefill_shares_steps_with_running_decodes():
    m = sim(max_batch_tokens=512, max_num_seqs=8)
    a = req("a", 100, 50)
    b = req("b", list(range(1000, 3000)), 5, arrival_ns=50_000_000)
    m.submit(a)
    m.submit(b)
    m.simulate()
    # While b prefills in 512-token chunks (4 steps), a keeps decoding every step.
    during = [t for t in a.emit_ns if b.prefill_start_ns <= t <= b.prefill_end_ns]
    assert len(during) >= 4
    assert b.prefill_end_ns - b.prefill_start_ns > 3 * m.decode_step_s(1, 100) * 1e9


def test_max_num_seqs_caps_concurrency():
    m = sim(max_num_seqs=3)
    for i in range(5):
        m.submit(req(str(i), 20, 10))
    m.simulate(until_ns=1)
    assert m.stats()["num_requests_running"] == 3
    assert m.stats()["num_requests_waiting"] == 2


def test_repeated_prefix_skips_prefill():
    m = sim()
    base = list(range(5000, 9000))
    first = req("1", base, 2)
    second = req("2", base[:3900] + list(range(100)), 2, arrival_ns=10**10)
    m.submit(first)
    m.submit(second)
    m.simulate()
    ttft = lambda r: r.emit_ns[0] - r.arrival_ns  # noqa: E731
    assert first.cached_tokens == 0
    assert second.cached_tokens == 3900 // 16 * 16
    assert ttft(second) < 0.2 * ttft(first)
    assert ttft(first) == pytest.approx(m.prefill_time_s(4000) * 1e9, rel=1e-6)
    st = m.stats()
    assert st["prefix_cache_queries_total"] == 8000
    assert st["prefix_cache_hits_total"] == second.cached_tokens
    # An identical prompt hits everything but the last token (it must be computed).
    third = req("3", base, 1, arrival_ns=2 * 10**10)
    m.submit(third)
    m.simulate()
    assert third.cached_tokens == 3999 // 16 * 16
    assert m.reset_prefix_cache() > 0


def test_step_times_are_exact_model_times_without_drift():
    m = sim()
    r = req("a", 200, 30, arrival_ns=123_456)
    m.submit(r)
    m.simulate()
    assert r.queue_wait_ns == 0 and r.prefill_start_ns == 123_456
    assert r.prefill_end_ns == r.emit_ns[0] == 123_456 + int(m.prefill_time_s(200) * 1e9)
    for k in range(1, 30):  # decode k attends to the prompt + k tokens already in KV
        assert r.emit_ns[k] - r.emit_ns[k - 1] == int(m.decode_step_s(1, 200 + k - 1) * 1e9)


def test_edge_requests():
    m = sim(num_gpu_blocks_override=10)
    with pytest.raises(ValueError, match="max_model_len"):
        m.submit(req("big", 150, 20))
    zero = req("zero", 20, 0)
    empty = req("empty", [], 3)
    m.submit(zero)
    m.submit(empty)
    m.simulate()
    assert zero.finished and zero.emitted == 0 and zero.prefill_end_ns is not None
    assert empty.finished and empty.emitted == 3
    waiting = req("w", 20, 5, arrival_ns=10**12)
    m.submit(waiting)
    m.cancel(waiting)
    assert waiting.cancelled and m.stats()["num_requests_waiting"] == 0


def test_saturation_estimate_matches_an_overloaded_open_loop_run():
    m = sim(max_num_seqs=64, prefix_cache=False)
    est = m.saturation_estimate(512, 128)
    assert est.bound == "max_num_seqs" and est.concurrency == 64
    gap = int(1e9 / (1.5 * est.requests_per_s))  # offered load 1.5x capacity
    rs = [req(str(i), [i] * 512, 128, arrival_ns=i * gap) for i in range(600)]
    for r in rs:
        m.submit(r)
    m.simulate()
    done = sorted(r.emit_ns[-1] for r in rs)
    got = 400 * 128 / ((done[500] - done[100]) / 1e9)  # steady state, queue never empty
    assert got == pytest.approx(est.output_tokens_per_s, rel=0.2)
    # All requests queued at t=0 instead run in lock-step waves, below the estimate.
    offline = offline_throughput(H100, L8B, 512, 128, 256, max_num_seqs=64)
    assert offline["output_tokens_per_s"] < got
    small = sim(num_gpu_blocks_override=200, max_num_seqs=256)
    assert small.saturation_estimate(512, 128).bound == "kv_cache"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 120), st.integers(0, 40), st.integers(0, 30_000_000)),
        min_size=1,
        max_size=25,
    ),
    st.integers(12, 40),
    st.integers(1, 8),
    st.booleans(),
)
def test_any_workload_finishes_with_consistent_truth(reqs, blocks, max_seqs, caching):
    """Random prompts (4 shared prefixes), lengths and arrivals on a tiny KV pool, with
    preemption and prefix caching in play: every request completes exactly, in order,
    and every block comes back."""
    m = sim(num_gpu_blocks_override=blocks, max_num_seqs=max_seqs, max_batch_tokens=64, prefix_cache=caching)
    rs = []
    for i, (prefix, plen, out, arrival) in enumerate(sorted(reqs, key=lambda r: r[3])):
        plen = min(plen, m.max_model_len - out)
        ids = ([prefix] * 48 + [1000 + i] * 200)[:plen]
        rs.append(req(str(i), ids, out, arrival))
        m.submit(rs[-1])
    m.simulate()
    for r in rs:
        assert r.finished and r.emitted == r.max_tokens == len(r.emit_ns)
        assert r.emit_ns == sorted(r.emit_ns)
        assert r.prefill_start_ns >= r.arrival_ns
        assert r.queue_wait_ns == r.prefill_start_ns - r.arrival_ns
        assert r.prefill_end_ns > r.prefill_start_ns
        assert not r.emit_ns or r.emit_ns[0] >= r.prefill_end_ns
        assert r.cached_tokens < max(1, len(r.prompt_ids))
    stats = m.stats()
    assert stats["request_success_total"] == len(rs)
    assert stats["generation_tokens_total"] == sum(r.emitted for r in rs)
    assert stats["num_preemptions_total"] == sum(r.preemptions for r in rs)
    assert stats["kv_cache_usage_perc"] == 0 and m.pool.num_free == blocks
