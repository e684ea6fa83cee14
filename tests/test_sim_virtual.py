"""The simulated engine in virtual time: its event loop, and its agreement with the engine's own stepping."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from loadgen.records import SCHEMA
from loadgen.schedule import Arrival
from loadgen.sim.model import SimRequest
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.virtual import simulate, simulate_point
from loadgen.sim.virtual.context import encode
from loadgen.workload.base import SyntheticChat
from loadgen.workload.session import Session, Turn
from loadgen.workload.tokenizer import BUILTIN


def _engine(**kw: Any) -> RooflineModel:
    return RooflineModel("h100", "llama-3.1-8b", **kw)


@dataclass(frozen=True)
class TwoTurns:
    """Sessions of two turns, the second due ``think_ns`` after the first's answer."""

    think_ns: int = 200_000_000
    name: str = "two-turns"
    size: int | None = None

    def session(self, i: int) -> Session:
        first = Turn(text=f" the {BUILTIN.decode([i % 50] * 40)}", max_tokens=8, prompt_tokens=41)
        return Session(i, (first, Turn(text=" and then", max_tokens=4, think_ns=self.think_ns)))

    def offsets_ns(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r["t_sched"], r["turn"]))


def test_records_are_the_ordinary_schema_with_the_virtual_endpoint():
    vr = simulate_point(
        SyntheticChat(64, 16, seed=3), Arrival("constant", rate=10.0), _engine(), run_id="r", seed=3, duration_s=2
    )
    assert vr.records.schema.equals(SCHEMA)
    rows = vr.records.to_pylist()
    assert len(rows) == 20 and {r["endpoint"] for r in rows} == {"sim-virtual"}
    for r in rows:
        assert r["status"] == "ok" and r["t_sent"] == r["t_sched"] and r["output_tokens"] == 16
        assert r["chunk_tokens"] == [1] * 16 and r["chunk_ns"] == sorted(r["chunk_ns"])
        assert r["t_first"] == r["chunk_ns"][0] > r["t_sched"] and r["t_done"] == r["chunk_ns"][-1]


def test_a_session_s_next_turn_is_due_its_think_time_after_the_answer_ended():
    vr = simulate(TwoTurns(), np.array([0, 50_000_000], np.int64), _engine(), run_id="r")
    rows = vr.records.to_pylist()
    by = {(r["session"], r["turn"]): r for r in rows}
    for s in (0, 1):
        assert by[(s, 1)]["t_sched"] == by[(s, 0)]["t_done"] + 200_000_000
        # the second turn's prompt is the first's, its answer and the new text; the first prompt's
        # full blocks (2 of 16 tokens) are in the prefix cache (generated tokens never are)
        assert by[(s, 1)]["prompt_tokens_reported"] == 41 + 8 + 2
        assert by[(s, 1)]["cached_tokens"] == 32
    assert sorted(r["request"] for r in rows) == [1, 2, 3, 4]  # numbered in the order sent


def test_the_loop_adds_nothing_to_the_engine_s_own_stepping():
    """Requests all known up front: the virtual run's token instants are the scheduler's own."""
    wl = SyntheticChat(300, 40, seed=5)
    offs = np.arange(0, 30 * 20_000_000, 20_000_000, dtype=np.int64)
    vr = simulate(wl, offs, _engine(max_num_seqs=8), run_id="r")
    ref = _engine(max_num_seqs=8)
    reqs = []
    for i, o in enumerate(offs):
        r = SimRequest(str(i), BUILTIN.encode(wl.session(i).turns[0].text), 40, int(o) + 1_000_000_000)
        ref.submit(r)
        reqs.append(r)
    ref.simulate()
    got = {r["session"]: r["chunk_ns"] for r in vr.records.to_pylist()}
    assert all(got[i] == r.emit_ns for i, r in enumerate(reqs))


def test_preempted_requests_still_stream_every_token_and_the_counts_agree():
    eng = _engine(num_gpu_blocks_override=60, max_num_seqs=16)  # 960 tokens of KV for 16 x 200
    vr = simulate(SyntheticChat(100, 100, seed=1), np.zeros(16, np.int64), eng, run_id="r")
    rows = vr.records.to_pylist()
    assert vr.stats["num_preemptions_total"] > 0
    assert sum(vr.truth.column("preemptions").to_pylist()) == vr.stats["num_preemptions_total"]
    assert all(r["status"] == "ok" and len(r["chunk_ns"]) == r["output_tokens"] == 100 for r in rows)


def test_a_closed_loop_keeps_its_users_busy_and_no_more():
    vr = simulate(SyntheticChat(32, 8, seed=2), None, _engine(), run_id="r", concurrency=3, duration_ns=2_000_000_000)
    rows = _rows(vr.records)
    events = sorted([(r["t_sched"], 1) for r in rows] + [(r["t_done"], -1) for r in rows], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak == 3 and len(rows) > 30


def test_the_drain_s_end_cancels_what_runs_and_leaves_later_turns_unsent():
    vr = simulate(
        TwoTurns(think_ns=0), np.array([0], np.int64), _engine(), run_id="r", duration_ns=1, drain_ns=1_000_000
    )
    status = {(r["turn"]): r["status"] for r in vr.records.to_pylist()}
    assert status == {0: "cancelled", 1: "not_sent"}


def test_a_prompt_too_long_is_refused_and_its_session_cut():
    wl = TwoTurns()
    vr = simulate(wl, np.array([0], np.int64), _engine(), run_id="r", sim=None, max_requests=1)
    assert {r["status"] for r in vr.records.to_pylist()} == {"ok"}
    from loadgen.sim.answer import SimConfig

    vr = simulate(wl, np.array([0], np.int64), _engine(), run_id="r", sim=SimConfig(max_model_len=45))
    assert [(r["turn"], r["status"]) for r in _rows(vr.records)] == [(0, "http_error"), (1, "not_sent")]


@pytest.mark.parametrize(
    "text",
    [
        " the of and",
        "the,of  and!",
        " café the",
        "",
        " salt_3 the of",
        " x-y\tthe\n(of) ",
        "\u00a0the\u2003of\n",
        "a_1 b_2 the",
    ],
)
def test_the_fast_encoding_is_the_built_in_tokenizer_s(text: str):
    assert encode(text) == BUILTIN.encode(text)


def test_a_virtual_run_folder_is_an_ordinary_one_that_says_first_it_is_virtual(tmp_path):
    from loadgen.analysis.run_summary import summarize_run
    from loadgen.client.settings import RunSettings
    from loadgen.client.virtual_run import execute_virtual
    from loadgen.sim.answer import SimConfig

    out = tmp_path / "run"
    settings = RunSettings(None, None, arrival=Arrival("poisson", rate=5.0), duration_s=2.0)
    execute_virtual(settings, SyntheticChat(64, 16), out, engine=_engine(), sim=SimConfig(), sim_flags=[])
    meta = json.loads((out / "run.json").read_text())
    assert next(iter(meta)) == "virtual" and meta["endpoint"] == "sim-virtual" and meta["state"] == "complete"
    report = summarize_run(out)
    assert report.meta["virtual"]["virtual"] is True


@dataclass(frozen=True)
class GivesIds:
    """A workload that hands over its first prompts as ids (``loop.PromptIds``), counting how often."""

    inner: SyntheticChat
    asked: list[int]
    name: str = "gives-ids"
    size: int | None = None

    def session(self, i: int) -> Session:
        return self.inner.session(i)

    def prompt_ids(self, i: int) -> list[int]:
        self.asked.append(i)
        return BUILTIN.encode(self.inner.session(i).turns[0].text)

    def offsets_ns(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


def test_a_workload_that_gives_its_prompts_as_ids_gets_the_records_its_text_would():
    wl = SyntheticChat(200, 20, seed=6, salt="s")
    asked: list[int] = []
    args: dict[str, Any] = {"run_id": "r", "concurrency": 4, "duration_ns": 2_000_000_000}
    plain = simulate(wl, None, _engine(), **args)
    given = simulate(GivesIds(wl, asked), None, _engine(), **args)
    assert sorted(asked) == list(range(plain.records.num_rows)) and len(asked) > 20
    assert given.records.equals(plain.records) and given.truth.equals(plain.truth)
