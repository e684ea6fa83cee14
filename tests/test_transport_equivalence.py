"""The same seeded traffic through both transports (the lean wire and aiohttp's) to the built-in
simulator gives the same records: every field but the times (and the run's start, which moves
every instant) is equal, request by request.

The traffic: multi-turn chat sessions (answers sent back, so connections are reused between
turns), text kept, and runs where every request meets a fault of the simulator's (an error
status with Retry-After, a cut stream, a malformed event), so failure records are compared too.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadgen.client.config import EngineConfig, Plan
from loadgen.client.engine import Engine
from loadgen.records import RecordWriter, read_stream
from loadgen.schedule import Arrival, offsets_ns
from loadgen.sim.answer import SimConfig
from loadgen.sim.faults import parse_faults
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer
from loadgen.workload.load import load_workload

# besides every t_* field: the chunks' arrivals, and the sequence number, given in the order of
# sending (a later turn's place in it depends on when the turn before it ended)
TIMES = ("chunk_ns", "request")
WIRE_FAILURES = ("disconnected", "timeout", "client_error")  # WireError's statuses (bad_stream: the tally's)


def _run(tmp_path: Path, transport: str, faults: str, n: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    async def go() -> tuple[list[dict[str, Any]], dict[str, str]]:
        cfg = SimConfig(model_name="sim", faults=parse_faults(faults)) if faults else SimConfig(model_name="sim")
        # (with a fault, tokens 2 ms apart: each its own read, so where a stream breaks off is
        # the same on any run; a read of several events cut by a bad one keeps those before it)
        server = SimServer(FixedModel(ttft_s=0.004, itl_s=0.002 if faults else 0.0005), cfg)
        url = await server.start()
        try:
            # The simulator keys a request's fault by its sequence number, given in the order of
            # sending, which for later turns is timing's: with faults, one turn each, 50 ms apart
            # (an answer takes ~30 ms), so each request's number, and its fault, is the schedule's.
            turns, arrival = (1, Arrival("constant", rate=20.0)) if faults else (3, Arrival("poisson", rate=200.0))
            wl = load_workload(
                "chat-multiturn", seed=11, overrides={"turns": turns, "think": 0.01, "output_tokens": 12}
            )
            offs = offsets_ns(arrival, 5, count=n)
            engine_cfg = EngineConfig(url=url, model="sim", run_id="eq", keep_text=True, transport=transport)
            path = tmp_path / f"{transport}.arrows"
            with RecordWriter(path) as w:
                engine = Engine(engine_cfg, w)
                await engine.run(Plan(wl.session, offs, np.arange(n)), time.perf_counter_ns() + 20_000_000, 10.0)
        finally:
            await server.stop()
        assert engine.wire is not None
        rows = sorted(read_stream(path).to_pylist(), key=lambda r: (r["session"], r["turn"]))
        return rows, {"transport": engine.wire.name, "fallback": engine.wire.fallback}

    return asyncio.run(go())


def _timeless(row: dict[str, Any]) -> dict[str, Any]:
    """The record without its times; a wire failure's error by its kind (``ClientPayloadError``),
    as each HTTP client words the rest its own way (an HTTP error's text is the endpoint's: whole)."""
    out = {k: v for k, v in row.items() if not k.startswith("t_") and k not in TIMES}
    if row["status"] in WIRE_FAILURES:
        out["error"] = str(row["error"]).partition(":")[0]
    return out


@pytest.mark.parametrize("faults", ["", "http429=1:2", "disconnect=1", "malformed=1"])
def test_both_transports_record_the_same_traffic_the_same_way(tmp_path: Path, faults: str) -> None:
    n = 12 if not faults else 4
    lean, lean_wire = _run(tmp_path, "lean", faults, n)
    aio, aio_wire = _run(tmp_path, "aiohttp", faults, n)
    assert lean_wire == {"transport": "lean", "fallback": ""} and aio_wire == {"transport": "aiohttp", "fallback": ""}
    assert len(lean) == len(aio) >= n
    if not faults:  # vacuous unless the answers came, several turns each
        assert {r["status"] for r in lean} == {"ok"} and max(r["turn"] for r in lean) == 2
        assert all(r["output_text"] and r["output_tokens"] == len(r["chunk_ns"]) for r in lean)
    else:
        assert {r["status"] for r in lean} != {"ok"}
    for a, b in zip(lean, aio, strict=True):
        assert _timeless(a) == _timeless(b)
        assert (a["t_first"] is None) == (b["t_first"] is None) and len(a["chunk_ns"]) == len(b["chunk_ns"])
