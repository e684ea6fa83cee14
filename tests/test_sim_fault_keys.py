"""Which request meets which simulated fault follows its number in the run (``X-Loadgen-Seq``),
not the order requests happen to arrive in: two workers interleaving, or two arrivals close
together swapping places, meet the same faults."""

from __future__ import annotations

import asyncio

import aiohttp

from loadgen.sim.answer import SimConfig
from loadgen.sim.faults import parse_faults, plan_for
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer

FAULTS = "http500=0.5,seed=3"
BODY = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}


def statuses(order: list[int]) -> dict[int, int]:
    """The HTTP status each request got, sent one after another in ``order``."""

    async def go() -> dict[int, int]:
        server = SimServer(
            FixedModel(ttft_s=0.001, itl_s=0.001), SimConfig(model_name="sim", faults=parse_faults(FAULTS))
        )
        url = await server.start()
        got = {}
        try:
            async with aiohttp.ClientSession() as s:
                for seq in order:
                    headers = {"X-Loadgen-Seq": str(seq), "X-Loadgen-Run": "r"}
                    async with s.post(f"{url}/chat/completions", json=BODY, headers=headers) as resp:
                        await resp.read()
                        got[seq] = resp.status
        finally:
            await server.stop()
        return got

    return asyncio.run(go())


def test_a_requests_fault_follows_its_number_not_its_place_in_the_arrivals() -> None:
    forward = statuses(list(range(12)))
    backward = statuses(list(reversed(range(12))))
    assert forward == backward
    spec = parse_faults(FAULTS)
    assert forward == {seq: plan_for(spec, seq, 2).status for seq in range(12)}
    assert set(forward.values()) == {200, 500}  # not vacuous: some met the fault, some did not
