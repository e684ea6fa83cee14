"""The virtual loop's shortcuts give what stepping the engine one plan at a time gives.

Quiet steps (``BatchScheduler.quiet_steps``: only steady decodes, nobody waiting, nobody ending),
synthetic sessions handed over as one text-less turn and its ids (``loop.SingleTurns``), and the
token log's flattening into per-request instants are each checked against the plain way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from loadgen.schedule import Arrival
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.scheduler import BatchScheduler
from loadgen.sim.virtual import VirtualRun, simulate, simulate_point
from loadgen.sim.virtual.requests import PromptIds, SingleTurns
from loadgen.sim.virtual.tokens import TokenLog
from loadgen.workload.base import SyntheticChat
from loadgen.workload.session import Session


def _fp8(**kw: Any) -> RooflineModel:
    return RooflineModel("h100", "llama-3.1-8b", weight_dtype="fp8", kv_dtype="fp8", **kw)


def _low_load() -> VirtualRun:
    """A few closed-loop users: most steps are quiet."""
    return simulate_point(
        SyntheticChat(300, 200, seed=1), Arrival("closed", concurrency=5), _fp8(), run_id="q", seed=1,
        duration_s=8, drain_s=0.0,
    )  # fmt: skip


def _tight_pool() -> VirtualRun:
    """Four users whose answers outgrow a small pool: nobody is waiting when, a thousand quiet steps
    in, the blocks they cross into run out (the step that preempts is an ordinary one)."""
    return simulate_point(
        SyntheticChat(100, 2000, seed=2), Arrival("closed", concurrency=4), _fp8(num_gpu_blocks_override=300),
        run_id="q", seed=2, duration_s=6, drain_s=1.0,
    )  # fmt: skip


def _open_loop() -> VirtualRun:
    """Arrivals at any instant, one due in the middle of a stretch; the drain's cut in another."""
    return simulate_point(
        SyntheticChat(200, 150, seed=3), Arrival("poisson", rate=3.0), _fp8(), run_id="q", seed=3,
        duration_s=5, drain_s=0.3,
    )  # fmt: skip


CASES: dict[str, Callable[[], VirtualRun]] = {"low_load": _low_load, "tight_pool": _tight_pool, "open_loop": _open_loop}


def _same(a: VirtualRun, b: VirtualRun) -> None:
    assert a.records.equals(b.records) and a.truth.equals(b.truth)
    assert a.stats == b.stats and a.end_ns == b.end_ns


@pytest.mark.parametrize("case", sorted(CASES))
def test_quiet_steps_give_the_records_stepping_each_gives(case: str, monkeypatch: pytest.MonkeyPatch):
    ran: list[int] = []
    quiet = BatchScheduler.quiet_steps

    def counted(self: BatchScheduler, start: int, bound: int) -> int:
        steps = self._c["steps"]
        end = quiet(self, start, bound)
        ran.append(self._c["steps"] - steps)
        return end

    monkeypatch.setattr(BatchScheduler, "quiet_steps", counted)
    fast = CASES[case]()
    assert sum(ran) > 100  # steps run by the shortcut
    monkeypatch.setattr(BatchScheduler, "quiet_steps", lambda self, start, bound: start)
    _same(fast, CASES[case]())


def test_in_a_tight_pool_quiet_steps_stop_where_the_blocks_run_out():
    """The case above: quiet steps take every free block, and the next crossing preempts."""
    vr = _tight_pool()
    assert vr.stats["num_preemptions_total"] > 0 and vr.stats["steps_total"] > 1000


@dataclass(frozen=True)
class TextOnly:
    """A workload's sessions and nothing else: each prompt's text is tokenized."""

    inner: SyntheticChat
    name: str = "text-only"
    size: int | None = None

    def session(self, i: int) -> Session:
        return self.inner.session(i)

    def offsets_ns(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


@dataclass(frozen=True)
class IdsToo(TextOnly):
    """... and the first prompt's ids (``PromptIds``), kept in the session's context."""

    def prompt_ids(self, i: int) -> list[int]:
        return self.inner.prompt_ids(i)


@pytest.mark.parametrize("salt", ["", "pt"])
def test_a_synthetic_session_given_as_its_turn_and_ids_runs_as_its_text_does(salt: str):
    wl = SyntheticChat(120, 30, seed=4, salt=salt)
    assert isinstance(wl, SingleTurns) and not isinstance(IdsToo(wl), SingleTurns)
    assert isinstance(IdsToo(wl), PromptIds) and not isinstance(TextOnly(wl), PromptIds)
    args: dict[str, Any] = {"run_id": "s", "concurrency": 6, "duration_ns": 2_000_000_000}
    bare = simulate(wl, None, _fp8(), **args)
    assert bare.records.num_rows > 30
    _same(bare, simulate(IdsToo(wl), None, _fp8(), **args))
    _same(bare, simulate(TextOnly(wl), None, _fp8(), **args))


def test_a_synthetic_turn_shape_is_its_session_s_turn_but_for_the_text():
    wl = SyntheticChat(64, 9, seed=1, salt="x")
    for i in (0, 5, 1234):
        s = wl.session(i)
        assert len(s.turns) == 1 and not s.system and not s.extra
        assert wl.turn_shape(i) == replace(s.turns[0], text="")


@pytest.mark.parametrize("salt", ["", "pt"])
@pytest.mark.parametrize("n", [0, 1, 64, 700])
def test_a_synthetic_prompt_s_view_holds_its_ids_and_slices_as_they_do(salt: str, n: int):
    """``prompt_view`` (what a virtual run reads) is ``prompt_ids`` without the list: the same ints,
    and its slices the same (the prefix cache's blocks, natural_length's last 64), read-only."""
    wl = SyntheticChat(n, 9, seed=3, salt=salt)
    for i in (0, 7, 99_999):
        ids, view = wl.prompt_ids(i), wl.prompt_view(i)
        assert len(view) == len(ids) and list(view) == ids
        assert list(view[-64:]) == ids[-64:] and list(view[16:32]) == ids[16:32]
    if n and not salt:
        with pytest.raises(TypeError):
            wl.prompt_view(0)[0] = 1  # type: ignore[index]  # (a memoryview: mypy sees a Sequence)


def test_flattened_spans_are_each_request_s_instants_in_the_order_they_were_emitted():
    log = TokenLog()
    a_ends, b_ends = [10, 20, 30, 40, 50], [15, 25, 35]
    log.emit(1, 5, 1)
    log.span(2, a_ends, 0, 3)
    log.emit(3, 7, 2)  # two tokens at once
    log.span(1, b_ends, 1, 3)
    log.span(3, a_ends, 4, 5)
    log.emit(2, 60, 1)
    log.span(4, b_ends, 0, 1)  # a request left out
    want = {1: [5, 25, 35], 2: [10, 20, 30, 60], 3: [7, 7, 50]}
    order = np.array([3, 1, 2], np.int64)
    offsets, instants = log.flatten(order)
    got = {int(r): instants[offsets[i] : offsets[i + 1]].tolist() for i, r in enumerate(order)}
    assert got == want and offsets.tolist() == [0, 3, 6, 10]
    none, nothing = TokenLog().flatten(order)
    assert none.tolist() == [0, 0, 0, 0] and len(nothing) == 0
