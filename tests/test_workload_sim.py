"""Workloads against the simulator: closed-loop turns, think time, and prefix reuse seen as cached tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loadgen.client.run import execute
from loadgen.client.settings import RunSettings
from loadgen.records import read_records
from loadgen.schedule import Arrival
from loadgen.workload.load import load_workload

AGENTIC = """\
kind: agentic
system: 600
first: 300
turns: 4
tool_result: 120
output: 24
think: 0.05
"""

RAG = """\
kind: rag
system: 64
documents:
  count: 4
  tokens: 512
k: 2
zipf_alpha: 1.2
question: 24
output: 8
"""


def _run(tmp_path: Path, spec: str, name: str, rate: float, duration: float) -> tuple[dict, object]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(spec)
    workload = load_workload(str(path), seed=3)
    settings = RunSettings(
        endpoint=None, model=None, arrival=Arrival("poisson", rate=rate), duration_s=duration, drain_s=30
    )
    out = tmp_path / name
    execute(settings, workload, out, sim_flags=["--gpu", "h100", "--model", "llama-3.1-8b"])
    return read_records(out).sort_by([("session", "ascending"), ("turn", "ascending")]).to_pydict(), workload


@pytest.mark.timing
def test_agentic_turns_follow_each_answer_after_the_think_time(tmp_path):
    """Each later turn is scheduled exactly the think time (50 ms) after the answer before it, and sent
    at that instant. How late it really goes out is how busy the client's core is (well under a
    millisecond when quiet, several on a loaded box); a turn that waited a think time too many would be
    50 ms late, so the bound on the typical lag is half a think time."""
    rec, workload = _run(tmp_path, AGENTIC, "agentic", rate=3, duration=1.5)
    assert set(rec["status"]) == {"ok"}
    by_session: dict[int, list[int]] = {}
    for row, s in enumerate(rec["session"]):
        by_session.setdefault(s, []).append(row)
    complete = [rows for rows in by_session.values() if len(rows) == 4]
    assert complete, "no session ran all its turns"
    later = [r for rows in complete for r in rows[1:]]
    assert np.median([(rec["t_sent"][r] - rec["t_sched"][r]) / 1e6 for r in later]) < 25
    for rows in complete:
        assert [rec["turn"][r] for r in rows] == [0, 1, 2, 3]
        spec = workload.session(rec["session"][rows[0]])
        for prev, nxt in zip(rows, rows[1:], strict=False):
            # closed within the session: sent exactly think time after the previous answer ended
            think = spec.turns[rec["turn"][nxt]].think_ns
            assert rec["t_sched"][nxt] - rec["t_done"][prev] == think == 50_000_000
            assert rec["t_sent"][nxt] >= rec["t_sched"][nxt]  # prepared during the think time, held to its instant
        # the context grows by the previous answer and a tool result, and its prefix is reused
        prompts = [rec["prompt_tokens_reported"][r] for r in rows]
        assert prompts == sorted(prompts) and prompts[-1] > prompts[0] + 3 * 120
        assert all(
            rec["cached_tokens"][r] >= 0.8 * rec["prompt_tokens_reported"][rows[i]] for i, r in enumerate(rows[1:])
        )


def test_agentic_requested_prompt_tokens_match_what_the_simulator_counted(tmp_path):
    rec, _ = _run(tmp_path, AGENTIC, "agentic2", rate=3, duration=1.0)
    req = np.asarray(rec["prompt_tokens_requested"], dtype=float)
    rep = np.asarray(rec["prompt_tokens_reported"], dtype=float)
    first = np.asarray(rec["turn"]) == 0
    assert np.array_equal(req[first], rep[first])  # built-in tokenizer on both sides: exact
    later = ~first
    # later turns count earlier answers at max_tokens; the simulator honours ignore_eos, so exact too
    assert np.array_equal(req[later], rep[later])


def test_rag_document_reuse_shows_up_as_cached_prompt_tokens(tmp_path):
    rec, workload = _run(tmp_path, RAG, "rag", rate=20, duration=1.5)
    assert set(rec["status"]) == {"ok"}
    cached = np.asarray(rec["cached_tokens"])
    assert (cached[1:] > 0).mean() > 0.5  # a pool of 4 documents, 2 per request: mostly hits
    assert workload.describe()["reuse"]
