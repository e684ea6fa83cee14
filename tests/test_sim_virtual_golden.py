"""A virtual run's records are a pure function of its inputs, and speed-ups of the simulator keep them.

Each case below is a small virtual run touching one part of the model (the benchmark's shape with
its drain cut, preemption and recompute with shared prefixes and tool calls, multi-token chunks
and natural answer lengths, speculative decoding, disaggregated pools, the reserving admission).
Its digest covers every field of every record, the ground truth and the engine's counters; the
pinned values were computed with the simulator as it was before its hot paths were rewritten
(commit 6e96f23), so a change that moves any figure of any record fails here and must say why.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest

from loadgen.schedule import Arrival
from loadgen.sim.answer import SimConfig
from loadgen.sim.disaggregated import DisaggregatedModel
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.virtual import VirtualRun, simulate, simulate_point
from loadgen.workload.base import SyntheticChat
from loadgen.workload.load import load_workload


def _fp8(**kw: Any) -> RooflineModel:
    return RooflineModel("h100", "llama-3.1-8b", weight_dtype="fp8", kv_dtype="fp8", **kw)


def _bench_shape() -> VirtualRun:
    """The benchmark's point (512 in, 256 out, closed loop, no drain) at 150 users for 6 s."""
    return simulate_point(
        SyntheticChat(512, 256, seed=7), Arrival("closed", concurrency=150), _fp8(max_num_seqs=1024),
        run_id="g", seed=7, duration_s=6, point=3, drain_s=0.0,
    )  # fmt: skip


def _agentic() -> VirtualRun:
    """Agents: long shared contexts (prefix-cache hits), tool calls, a cut leaving turns unsent."""
    return simulate_point(
        load_workload("agentic", seed=4), Arrival("closed", concurrency=6),
        _fp8(block_size=64, num_gpu_blocks_override=700, max_num_seqs=64),
        run_id="g", seed=4, duration_s=20, drain_s=2.0,
        sim=SimConfig(model_name="m", tool_calls=0.3),
    )  # fmt: skip


def _preempted() -> VirtualRun:
    """A KV pool far too small for its users: preemption and recompute, then the drain's cut."""
    return simulate_point(
        SyntheticChat(200, 300, seed=1, salt="p"), Arrival("closed", concurrency=40), _fp8(num_gpu_blocks_override=500),
        run_id="g", seed=1, duration_s=5, drain_s=1.0,
    )  # fmt: skip


def _chunks_and_natural_lengths() -> VirtualRun:
    """Open-loop chat with answers ending at EOS and 2-5 tokens an event."""
    return simulate_point(
        load_workload("chat", seed=9), Arrival("poisson", rate=30.0), _fp8(max_num_seqs=32),
        run_id="g", seed=9, duration_s=4, ignore_eos=False,
        sim=SimConfig(model_name="m", tokens_per_chunk=2, tokens_per_chunk_max=5),
    )  # fmt: skip


def _speculative() -> VirtualRun:
    """Speculative decoding: drafts drawn per request, so no bulk decode."""
    eng = _fp8(spec_tokens=3, spec_acceptance=0.7, spec_draft_cost=0.05)
    offs = np.arange(0, 3_000_000_000, 50_000_000, dtype=np.int64)
    return simulate(SyntheticChat(300, 64, seed=2, salt="s"), offs, eng, run_id="g", seed=2)


def _disaggregated() -> VirtualRun:
    eng = DisaggregatedModel(
        "h100", "llama-3.1-8b", prefill={"weight_dtype": "fp8"}, decode={"weight_dtype": "fp8", "max_num_seqs": 64},
        prefills=2, decodes=2,
    )  # fmt: skip
    return simulate_point(
        load_workload("chat-multiturn", seed=5), Arrival("constant", rate=4.0), eng,
        run_id="g", seed=5, duration_s=3, drain_s=20.0,
    )  # fmt: skip


def _reserve() -> VirtualRun:
    """TensorRT-LLM's admission: the whole sequence's blocks held from the start."""
    return simulate_point(
        SyntheticChat(700, 300, seed=3), Arrival("closed", concurrency=40),
        _fp8(admission="reserve", num_gpu_blocks_override=900),
        run_id="g", seed=3, duration_s=5, drain_s=1.0,
    )  # fmt: skip


CASES: dict[str, Callable[[], VirtualRun]] = {
    "bench_shape": _bench_shape,
    "agentic": _agentic,
    "preempted": _preempted,
    "chunks_and_natural_lengths": _chunks_and_natural_lengths,
    "speculative": _speculative,
    "disaggregated": _disaggregated,
    "reserve": _reserve,
}

# sha256 of every record, the truth and the counters, from the simulator at commit 6e96f23
PINNED: dict[str, str] = {
    "agentic": "eee3daf7250fcccddbcf0803a9df227b1bbb4a6a6e861248e948cdee94491e45",  # 134 records
    "bench_shape": "51aabe209fd73a0cb89c1ca7912984bffbe7a49be5232c91e262fe0987829046",  # 378 records
    "chunks_and_natural_lengths": "be261d4c1bb735758ff586440663e49c6fa5f56c10bb4a6d6dec95fd37c3f45a",  # 112 records
    "disaggregated": "e97f072cf10ea000f3697d7523e0e0f5154bc52ed2b9ac9c025e524550ff4dca",  # 74 records
    "preempted": "9bbda0d23db96ab8f0cc58568037e71a78a971c1fd65391778f4b2fbbc36f2d3",  # 123 records
    "reserve": "8f5c54b314e3c5a4ed35bf830f06f317e05b6ac732d710f95e3429978298b9ff",  # 82 records
    "speculative": "2022d75ad6ba47ce27382c6a0005119050fe96a4e4d0102e73f20ac27c001c74",  # 60 records
}


# the records' columns when the digests were pinned (a column added later is left out of them)
COLUMNS = (
    "run_id point shard request session turn endpoint model api t_sched t_sent t_headers t_first "
    "t_first_content t_last t_done chunk_ns chunk_tokens prompt_tokens_requested prompt_tokens_reported "
    "cached_tokens output_tokens_requested output_tokens_reported output_tokens output_tokens_source "
    "reasoning_tokens stream_end finish_reason tool_calls inputs stage status http_status error output_text"
).split()


def digest(vr: VirtualRun) -> str:
    """Every field of every record and of the truth, and every counter, as one hash."""
    body = {
        "records": vr.records.select(COLUMNS).to_pylist(),
        "truth": vr.truth.to_pylist(),
        "stats": sorted(vr.stats.items()),
        "end_ns": vr.end_ns,
    }
    return hashlib.sha256(orjson.dumps(body)).hexdigest()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_seed_gives_the_same_records_as_before_the_simulator_was_sped_up(case: str):
    vr = CASES[case]()
    assert vr.records.num_rows > 10
    assert digest(vr) == PINNED[case]


if __name__ == "__main__":  # print the digests of whichever loadgen is on the path
    for name in sorted(CASES):
        run = CASES[name]()
        print(f'    "{name}": "{digest(run)}",  # {run.records.num_rows} records')
