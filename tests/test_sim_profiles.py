"""The 2026 GPU profiles, FP4 weights with an FP8 KV cache, and decode-specific active parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.sim.profiles import ProfileError, gpu, list_gpus, model
from loadgen.sim.roofline import RooflineModel


def test_2026_parts_load_with_their_sources_and_announced_status() -> None:
    assert {"b300", "gb300", "rubin"} <= set(list_gpus())
    for name in ("b300", "gb300", "rubin"):
        g = gpu(name)
        assert g.sources and g.fp4_tflops and g.tdp_w
        assert (g.fp4_tflops or 0) > (gpu("b200").fp4_tflops or 0)
    assert gpu("rubin").status == "announced" and gpu("b300").status == "shipping"
    assert gpu("vera-rubin").name == "rubin"


def test_fp4_weights_with_fp8_kv_on_blackwell_ultra() -> None:
    m = RooflineModel("b300", "llama-3.1-70b", weight_dtype="fp4", kv_dtype="fp8")
    d = m.describe()
    assert d["weights_gb_per_gpu"] == pytest.approx(70.55 * 0.5625, rel=1e-3)
    assert d["kv_bytes_per_token_per_gpu"] == 2 * 8 * 128 * 1 * 80  # fp8: one byte per element
    bf16 = RooflineModel("b300", "llama-3.1-70b", weight_dtype="fp4", kv_dtype="bf16")
    assert m.kv_capacity_tokens() > 1.9 * bf16.kv_capacity_tokens()


def _split_moe(tmp_path: Path, decode_b: float) -> Path:
    text = (Path(__file__).parents[1] / "loadgen/sim/profiles/models/mixtral-8x7b.yaml").read_text()
    p = tmp_path / "split.yaml"
    p.write_text(text.replace("name: mixtral-8x7b", "name: split") + f"params_active_decode_b: {decode_b}\n")
    return p


def test_decode_tokens_can_go_through_more_experts_than_prefill_tokens(tmp_path: Path) -> None:
    base = model("mixtral-8x7b")
    split = model(str(_split_moe(tmp_path, 18.53)))  # 12.9 + one more 5.63 B expert per decode token
    assert split.experts_per_token_decode == pytest.approx(3.0, abs=0.01)
    a, b = RooflineModel("h100", base, tp=2), RooflineModel("h100", split, tp=2)
    assert b.prefill_time_s(2000) == pytest.approx(a.prefill_time_s(2000))  # prefill unchanged
    assert b.decode_step_s(64, 1000) > a.decode_step_s(64, 1000)  # decode reads and computes more
    with pytest.raises(ProfileError, match="params_active_decode_b"):
        model(str(_split_moe(tmp_path, 50.0)))  # more than the whole model
