"""The engine against real loopback HTTP: timing, open loop, no hidden caps, records."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from loadgen.client.config import EngineConfig, Plan
from loadgen.client.engine import Engine
from loadgen.records import RecordWriter, read_stream
from loadgen.sim.answer import SimConfig
from loadgen.sim.model import FixedModel
from loadgen.sim.process import start_sim
from loadgen.sim.server import SimServer
from loadgen.workload.base import SyntheticChat


def _plan(offsets_ms: list[float], workload: SyntheticChat) -> Plan:
    offs = (np.asarray(offsets_ms) * 1e6).astype(np.int64)
    return Plan(session=workload.session, offsets_ns=offs, indices=np.arange(len(offs)))


def _send(url: str, plan: Plan, path: Path, *, api: str = "chat", stall: tuple[float, float] | None = None):
    """Run the engine in this process; optionally block the event loop (a client stall)."""

    async def go() -> None:
        cfg = EngineConfig(url=url, model="sim", api=api, run_id="t", endpoint_label=url)
        with RecordWriter(path) as w:
            engine = Engine(cfg, w)
            start = time.perf_counter_ns() + 20_000_000
            if stall:
                at, seconds = stall
                asyncio.get_running_loop().call_at(asyncio.get_running_loop().time() + 0.02 + at, time.sleep, seconds)
            await engine.run(plan, start, grace_s=30)

    asyncio.run(go())
    return read_stream(path).to_pydict()


def _ms(a: list[int | None], b: list[int | None]) -> np.ndarray:
    return (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) / 1e6


def test_medians_match_the_simulated_ttft_and_itl(fixed_sim, tmp_path):
    wl = SyntheticChat(input_tokens=32, output_tokens=20)
    rec = _send(fixed_sim.url, _plan([i * 40.0 for i in range(25)], wl), tmp_path / "r.arrows")
    assert set(rec["status"]) == {"ok"}
    ttft_sent = np.median(_ms(rec["t_first"], rec["t_sent"]))
    ttft = np.median(_ms(rec["t_first"], rec["t_sched"]))
    itl = np.median(np.concatenate([np.diff(c) for c in rec["chunk_ns"]]) / 1e6)
    assert abs(ttft_sent - 50) < 4, ttft_sent
    assert abs(ttft - 50) < 5, ttft
    assert abs(itl - 10) < 1, itl
    assert rec["output_tokens"] == [20] * 25
    assert set(rec["output_tokens_source"]) == {"usage"}
    assert set(rec["prompt_tokens_reported"]) == {32}


def test_completions_api_is_timed_the_same_way(fixed_sim, tmp_path):
    wl = SyntheticChat(input_tokens=16, output_tokens=5)
    rec = _send(fixed_sim.url, _plan([0, 30, 60], wl), tmp_path / "r.arrows", api="completions")
    assert rec["status"] == ["ok"] * 3
    assert rec["output_tokens"] == [5] * 3
    assert all(len(c) == 5 for c in rec["chunk_ns"])


def test_open_loop_a_client_stall_shows_in_ttft_from_the_intended_time(fixed_sim, tmp_path):
    """Requests due while the client is frozen are sent late; the lateness must count."""
    wl = SyntheticChat(input_tokens=16, output_tokens=4)
    offsets = [i * 20.0 for i in range(40)]  # 0..780 ms
    rec = _send(fixed_sim.url, _plan(offsets, wl), tmp_path / "r.arrows", stall=(0.2, 0.4))
    sched = np.asarray(rec["t_sched"])
    late = _ms(rec["t_sent"], rec["t_sched"])
    ttft = _ms(rec["t_first"], rec["t_sched"])
    ttft_sent = _ms(rec["t_first"], rec["t_sent"])
    hit = late > 100  # due during the 400 ms stall
    assert hit.sum() >= 8
    assert ttft[hit].min() > 150 and np.median(ttft[hit]) > 200  # the stall is in the open-loop TTFT ...
    assert np.median(ttft_sent[hit]) < 120  # ... while the server answered in its usual ~50 ms
    # t_sched is the planned instant itself, untouched by the stall
    assert set(np.diff(np.sort(sched)).tolist()) == {20_000_000}


def test_500_concurrent_streams_all_complete_without_a_pool_cap(tmp_path):
    """A hidden connection cap (aiohttp's default is 100) would hold sends back until
    earlier answers end; here every answer takes 3 s, so all 500 must be on the wire
    together."""
    with start_sim(["--ttft-ms", "3000", "--itl-ms", "50"]) as sim:
        wl = SyntheticChat(input_tokens=8, output_tokens=3)
        rec = _send(sim.url, _plan([0.0] * 500, wl), tmp_path / "r.arrows")
    assert len(rec["status"]) == 500
    assert set(rec["status"]) == {"ok"}
    assert max(rec["t_sent"]) < min(rec["t_done"])


def test_every_request_gets_one_record_even_when_the_run_is_stopped(tmp_path):
    async def go() -> dict:
        server = SimServer(FixedModel(ttft_s=0.01, itl_s=0.5), SimConfig(model_name="sim"))
        url = await server.start()
        try:
            cfg = EngineConfig(url=url, model="sim", run_id="t")
            wl = SyntheticChat(input_tokens=8, output_tokens=20)
            offs = (np.arange(10) * 10e6).astype(np.int64)
            with RecordWriter(tmp_path / "r.arrows") as w:
                engine = Engine(cfg, w)
                asyncio.get_running_loop().call_later(0.5, engine.stop)
                await engine.run(Plan(wl.session, offs, np.arange(10)), time.perf_counter_ns(), grace_s=0.2)
        finally:
            await server.stop()
        return read_stream(tmp_path / "r.arrows").to_pydict()

    rec = asyncio.run(go())
    assert len(rec["status"]) == 10
    assert set(rec["status"]) == {"cancelled"}
    assert all(len(c) >= 1 for c in rec["chunk_ns"])  # what streamed before the stop is kept


@pytest.mark.parametrize(
    "faults,status",
    [
        ("http500=1", "http_error"),
        ("http429=1:2", "http_error"),
        ("disconnect=1", "disconnected"),
        ("malformed=1", "bad_stream"),
    ],
)
def test_endpoint_faults_become_records_not_crashes(tmp_path, faults, status):
    from loadgen.sim.faults import parse_faults

    async def go() -> dict:
        server = SimServer(
            FixedModel(ttft_s=0.01, itl_s=0.002), SimConfig(model_name="sim", faults=parse_faults(faults))
        )
        url = await server.start()
        try:
            cfg = EngineConfig(url=url, model="sim", run_id="t")
            wl = SyntheticChat(input_tokens=8, output_tokens=10)
            offs = (np.arange(4) * 5e6).astype(np.int64)
            with RecordWriter(tmp_path / "r.arrows") as w:
                await Engine(cfg, w).run(Plan(wl.session, offs, np.arange(4)), time.perf_counter_ns(), 10)
        finally:
            await server.stop()
        return read_stream(tmp_path / "r.arrows").to_pydict()

    rec = asyncio.run(go())
    assert rec["status"] == [status] * 4
    assert all(e for e in rec["error"])
    if faults.startswith("http429"):
        assert all("Retry-After: 2" in e for e in rec["error"])
        assert rec["http_status"] == [429] * 4
