"""The virtual run agrees with the real-time simulator where the real-time one is on time.

The same requests (same seed, same prompts) go to the real-time server over loopback at a light
load, each arriving when the engine is idle or nearly, and then into a virtual run at the instants
the server stamped their arrival. The comparison is on the server's ground truth (``--truth``: each
token's modelled instant), not on client-side wall times, so a loaded machine moves neither side:
TTFT and E2E per request agree within one engine step, and the token counts exactly.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
import orjson
import pytest

from loadgen.sim.answer import SimConfig
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.server import SimServer
from loadgen.sim.virtual import simulate
from loadgen.sim.virtual.run import ORIGIN_NS
from loadgen.workload.base import SyntheticChat
from loadgen.workload.session import Conversation, build_body

_N, _GAP_NS, _OUT = 8, 150_000_000, 24
_STEP_NS = 12_000_000  # more than one decode step of this engine at this load (~7 ms)


async def _send_all(url: str, wl: SyntheticChat) -> None:
    async with aiohttp.ClientSession() as http:
        t0 = time.perf_counter_ns()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, (t0 + i * _GAP_NS - time.perf_counter_ns()) / 1e9))
            conv = Conversation(None)
            conv.add_turn(wl.session(i).turns[0])
            body = build_body("chat", "llama-3.1-8b", conv, _OUT)
            headers = {"X-Loadgen-Run": "rt", "X-Loadgen-Seq": str(i + 1), "Content-Type": "application/json"}
            async with http.post(f"{url}/chat/completions", data=body, headers=headers) as resp:
                await resp.read()

        await asyncio.gather(*(one(i) for i in range(_N)))


@pytest.mark.timing
def test_virtual_ttft_and_e2e_match_the_real_time_simulator_s_truth(tmp_path):
    wl = SyntheticChat(400, _OUT, seed=11)
    truth_path = tmp_path / "truth.jsonl"

    async def serve() -> None:
        server = SimServer(
            RooflineModel("h100", "llama-3.1-8b"), SimConfig(model_name="llama-3.1-8b", truth_path=str(truth_path))
        )
        url = await server.start()
        try:
            await _send_all(url, wl)
        finally:
            await server.stop()

    asyncio.run(serve())
    truth = sorted(map(orjson.loads, truth_path.read_bytes().splitlines()), key=lambda t: int(t["rid"].split("-")[1]))
    assert len(truth) == _N
    arrivals = np.array([t["arrival_ns"] for t in truth], np.int64)
    vr = simulate(wl, arrivals - arrivals[0], RooflineModel("h100", "llama-3.1-8b"), run_id="v")
    virtual = sorted(vr.records.to_pylist(), key=lambda r: r["session"])
    for t, v, a in zip(truth, virtual, arrivals, strict=True):
        assert v["output_tokens"] == len(t["model_ns"]) == _OUT
        real_ttft, real_e2e = t["model_ns"][0] - a, t["model_ns"][-1] - a
        v_ttft, v_e2e = v["t_first"] - v["t_sched"], v["t_done"] - v["t_sched"]
        assert abs(v_ttft - real_ttft) <= _STEP_NS, (t["rid"], v_ttft, real_ttft)
        assert abs(v_e2e - real_e2e) <= _STEP_NS + 0.05 * real_e2e, (t["rid"], v_e2e, real_e2e)
    assert vr.records.column("t_sched").to_pylist()[0] == ORIGIN_NS
    real_tps = _N * _OUT / ((max(t["model_ns"][-1] for t in truth) - arrivals[0]) / 1e9)
    v_tps = _N * _OUT / ((vr.end_ns - ORIGIN_NS) / 1e9)
    assert v_tps == pytest.approx(real_tps, rel=0.05)
