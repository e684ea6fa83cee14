"""Sessions in virtual time: multi-turn agents run to their end, and a cut leaves one record per turn."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.schedule import Arrival
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.virtual import simulate, simulate_point
from loadgen.workload.load import load_workload
from loadgen.workload.session import Session, Turn


def test_an_agent_at_light_load_runs_every_turn_to_its_end_at_the_unloaded_ttft():
    """One user, agentic sessions of tens of turns and a drain long enough for all of them: every turn
    ends ``ok`` (a turn whose answer the loop never saw would stall its session until the cut cancels
    it), and a turn's TTFT is its prompt's unloaded prefill (a subagent's turns may share a step)."""
    eng = RooflineModel("h100", "llama-3.1-8b", block_size=64)
    vr = simulate_point(
        load_workload("agentic", seed=4), Arrival("closed", concurrency=1), eng, run_id="a", seed=4,
        duration_s=120, drain_s=3600,
    )  # fmt: skip
    rows = vr.records.to_pylist()
    assert len(rows) > 20 and max(r["turn"] for r in rows) > 10
    assert Counter(r["status"] for r in rows) == {"ok": len(rows)}
    ratio = [
        (r["t_first"] - r["t_sched"]) / (eng.prefill_time_s(r["prompt_tokens_reported"], r["cached_tokens"]) * 1e9)
        for r in rows
    ]
    assert statistics.median(ratio) < 1.01 and max(ratio) < 3.5


@dataclass(frozen=True)
class WithSubagents:
    """A session whose second turn first waits on two subagents of two turns each."""

    name: str = "with-subagents"
    size: int | None = None

    def session(self, i: int) -> Session:
        kids = tuple(
            Session(100 + k, (Turn(text=" the of", max_tokens=400), Turn(text=" and", max_tokens=8))) for k in range(2)
        )
        turns = (
            Turn(text=" the", max_tokens=4),
            Turn(text=" of", max_tokens=4, children=kids),
            Turn(text=" a", max_tokens=4),
        )
        return Session(i, turns)

    def offsets_ns(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


def test_a_cut_while_a_session_waits_on_its_subagents_leaves_one_record_per_turn():
    vr = simulate(
        WithSubagents(), np.array([0], np.int64), RooflineModel("h100", "llama-3.1-8b"), run_id="r",
        duration_ns=1, drain_ns=500_000_000,
    )  # fmt: skip
    got = Counter((r["session"], r["turn"], r["status"]) for r in vr.records.to_pylist())
    assert got == {
        (0, 0, "ok"): 1,
        (0, 1, "not_sent"): 1,  # waiting on its subagents at the cut
        (0, 2, "not_sent"): 1,
        (100, 0, "cancelled"): 1,
        (100, 1, "not_sent"): 1,
        (101, 0, "cancelled"): 1,
        (101, 1, "not_sent"): 1,
    }
