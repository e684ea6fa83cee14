"""Every scheduled request ends as exactly one record, whatever happens (issue 13), and the drain
waits for whole sessions (issue 14): on virtual time, through the scripted transport.

A request never written to the wire is ``not_sent``, with why: the run was stopped first, its
session could not go on, or the drain ended while it waited (a think time, a ``--max-inflight``
slot). The drain runs until ``grace_s`` after the last turn sent; a second stop ends it at once.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest
from fake_wire import MS, Answer, FakeTransport, Read, at, last_message, plan, run, sessions, sse, turns_in
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.client.config import Plan, Timeouts
from loadgen.client.engine import Engine
from loadgen.client.transport import Exchange
from loadgen.clock import VirtualClock
from loadgen.records import STATUSES
from loadgen.workload.base import SyntheticChat
from loadgen.workload.session import Session, Turn

S = 1_000 * MS
LONG = Answer.tokens(20, itl_ms=100.0)  # ~2 s
HANG = Answer(reads=[Read(0.0, sse(0))], end="hang")


def _session(
    j: int, turns: int, think_ms: float = 0.0, children: dict[int, tuple[Session, ...]] | None = None
) -> Session:
    kids = children or {}
    return Session(
        session=j,
        turns=tuple(Turn(f"s{j} t{k}", 3, think_ns=int(think_ms * MS), children=kids.get(k, ())) for k in range(turns)),
    )


def _stop_at(*times_s: float, reason: str = "SIGINT") -> Any:
    def during(engine: Engine, clock: VirtualClock, start: int) -> None:
        for t in times_s:
            at(start + int(t * S), lambda: engine.stop(reason))

    return during


# -- the invariant --------------------------------------------------------------------------
_ANSWERS = [
    Answer.tokens(3),
    LONG,
    Answer(status=500, error=b"boom"),
    Answer(end="disconnect", reads=[Read(0.0, sse(0))]),
    HANG,
]


@st.composite
def _plans(draw: st.DrawFn) -> tuple[list[Session], list[float]]:
    out = []
    for j in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 4))
        kids: dict[int, tuple[Session, ...]] = {}
        if n > 1 and draw(st.booleans()):
            kids[draw(st.integers(1, n - 1))] = tuple(
                _session(j, draw(st.integers(1, 2)), 300.0) for _ in range(draw(st.integers(1, 2)))
            )
        out.append(_session(j, n, draw(st.sampled_from([0.0, 500.0, 2500.0])), kids))
    offsets = sorted(draw(st.lists(st.floats(0, 3000), min_size=len(out), max_size=len(out))))
    return out, offsets


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    the_plan=_plans(),
    seed=st.integers(0, 1000),
    max_inflight=st.integers(1, 4),
    stops=st.lists(st.floats(0.1, 8.0), max_size=2).map(sorted),
    grace_s=st.sampled_from([0.0, 1.0, 3.0]),
)
def test_every_scheduled_request_ends_as_exactly_one_record(
    tmp_path: Path,
    the_plan: tuple[list[Session], list[float]],
    seed: int,
    max_inflight: int,
    stops: list[float],
    grace_s: float,
) -> None:
    """Whatever the answers (ok, long, 500, disconnect, hang), the cap, the stops and the drain:
    one record per turn (subagents' included), each request id once, ``not_sent`` exactly for
    those never written to the wire."""
    planned, offsets = the_plan

    def answer(ex: Exchange) -> Answer:
        return _ANSWERS[(zlib.crc32(last_message(ex).encode()) + seed) % len(_ANSWERS)]

    rec, wire, engine = run(
        tmp_path,
        lambda c: FakeTransport(c, answer),
        sessions(planned, offsets),
        grace_s=grace_s,
        during=_stop_at(*stops),
        max_inflight=max_inflight,
        timeouts=Timeouts(first_byte=2.0, total=10.0),
    )
    n = sum(turns_in(s) for s in planned)
    assert len(rec["request"]) == n == engine.live.done
    assert sorted(rec["request"]) == list(range(n))
    assert set(rec["status"]) <= set(STATUSES)
    for status, t_sent, error in zip(rec["status"], rec["t_sent"], rec["error"], strict=True):
        assert (status == "not_sent") == (t_sent is None)
        assert status == "ok" or error
    assert len(wire.wrote) == n - rec["status"].count("not_sent") == n - engine.live.not_sent


# -- --max-inflight ---------------------------------------------------------------------------
def test_requests_waiting_for_a_slot_when_the_run_is_stopped_are_not_sent(tmp_path: Path) -> None:
    rec, wire, engine = run(
        tmp_path, lambda c: FakeTransport(c, LONG), plan([0.0] * 5), max_inflight=2, during=_stop_at(0.5)
    )
    assert sorted(rec["status"]) == ["not_sent"] * 3 + ["ok"] * 2  # those on the wire had the drain
    assert [e for e in rec["error"] if e] == ["not sent: run stopped (SIGINT)"] * 3
    assert len(wire.wrote) == 2 and engine.stop_reason == "SIGINT" and not engine.drain_cut


def test_requests_still_waiting_for_a_slot_when_the_drain_ends_are_not_sent(tmp_path: Path) -> None:
    """One slot, four requests due at once, answers of 2 s, a drain of 3 s: the second is on the
    wire when the drain ends (cancelled), the last two never got a slot."""
    rec, _, engine = run(tmp_path, lambda c: FakeTransport(c, LONG), plan([0.0] * 4), grace_s=3.0, max_inflight=1)
    assert rec["status"] == ["ok", "cancelled", "not_sent", "not_sent"]
    assert engine.stop_reason is None and not engine.drain_cut
    assert rec["error"][1:] == [
        "cancelled before the answer ended: drain of 3 s after the last send over",
        "not sent: drain of 3 s after the last send over",
        "not sent: drain of 3 s after the last send over",
    ]
    start = rec["t_sched"][0]
    assert start + 3 * S <= rec["t_done"][1] < start + 3 * S + MS


# -- whole sessions -----------------------------------------------------------------------------
def test_an_agentic_run_records_every_turn_and_the_drain_waits_for_its_sessions(tmp_path: Path) -> None:
    """Like ``--rate 0.5 --requests 8 --drain 30`` with an agentic workload: 8 sessions 2 s apart,
    34 turns each, 3 s of think time after each ~1 s answer. Every turn is sent and answered,
    long after the last session's first turn plus the drain."""
    planned = [_session(j, 34, think_ms=3000.0) for j in range(8)]
    answer = Answer.tokens(20, itl_ms=50.0)
    rec, _, engine = run(
        tmp_path, lambda c: FakeTransport(c, answer), sessions(planned, [j * 2000.0 for j in range(8)])
    )
    assert len(rec["status"]) == 8 * 34 and set(rec["status"]) == {"ok"}
    start = min(rec["t_sched"])
    assert max(rec["t_done"]) > start + 14 * S + 30 * S  # sessions ran on well past the last first send + drain
    assert engine.live.not_sent == 0


def test_the_drain_ends_grace_after_the_last_turn_sent_and_the_turns_left_are_not_sent(tmp_path: Path) -> None:
    """Think time of 40 s, a drain of 30 s: turn 1 would come after the drain's end."""
    rec, wire, _ = run(
        tmp_path, lambda c: FakeTransport(c, Answer.tokens(3)), sessions([_session(0, 3, 40_000.0)], [0])
    )
    assert rec["status"] == ["ok", "not_sent", "not_sent"] and len(wire.wrote) == 1
    assert rec["error"][1:] == ["not sent: drain of 30 s after the last send over"] * 2
    assert rec["t_sched"][1] == rec["t_done"][0] + 40 * S  # the instant it was due, kept


def test_a_session_cannot_go_on_after_a_failed_turn(tmp_path: Path) -> None:
    def answer(ex: Exchange) -> Answer:
        return Answer(status=500, error=b"boom") if last_message(ex) == "s0 t1" else Answer.tokens(3)

    rec, wire, _ = run(tmp_path, lambda c: FakeTransport(c, answer), sessions([_session(0, 4, 100.0)], [0]))
    assert rec["status"] == ["ok", "http_error", "not_sent", "not_sent"] and rec["turn"] == [0, 1, 2, 3]
    assert rec["error"][2:] == ["not sent: turn 1 of its session ended http_error"] * 2
    assert len(wire.wrote) == 2


def test_a_stop_while_subagents_think_records_every_turn_of_parent_and_children(tmp_path: Path) -> None:
    kids = (_session(0, 3, 1000.0), _session(0, 2, 1000.0))
    parent = _session(0, 3, 100.0, children={1: kids})
    rec, wire, _ = run(
        tmp_path, lambda c: FakeTransport(c, Answer.tokens(3)), sessions([parent], [0]), during=_stop_at(0.6)
    )
    assert len(rec["status"]) == turns_in(parent) == 8
    assert rec["status"].count("ok") == len(wire.wrote) == 3  # the parent's first turn, each child's first
    assert rec["status"].count("not_sent") == 5


def test_sessions_the_run_was_stopped_before_are_recorded_with_their_instants(tmp_path: Path) -> None:
    """300 sessions of 2 turns, 100 ms apart (more than are built ahead), stopped at 1.05 s:
    sessions 0-10 were sent; each turn of the 289 others is ``not_sent`` at its session's instant."""
    planned = [_session(j, 2, 100.0) for j in range(300)]
    rec, _, engine = run(
        tmp_path,
        lambda c: FakeTransport(c, Answer.tokens(3)),
        sessions(planned, [j * 100.0 for j in range(300)]),
        during=_stop_at(1.05),
    )
    assert len(rec["status"]) == 600 and engine.live.not_sent == rec["status"].count("not_sent")
    start = min(rec["t_sched"])
    never = [
        (j, k, t - start)
        for j, k, t, e in zip(rec["session"], rec["turn"], rec["t_sched"], rec["error"], strict=True)
        if j > 10
    ]
    assert sorted(never) == [(j, k, j * 100 * MS) for j in range(11, 300) for k in (0, 1)]
    assert {e for j, e in zip(rec["session"], rec["error"], strict=True) if j > 10} == {
        "not sent: run stopped (SIGINT)"
    }


def test_a_closed_loop_stopped_records_the_rest_of_its_count(tmp_path: Path) -> None:
    wl = SyntheticChat(input_tokens=4, output_tokens=3)
    rec, _, _ = run(
        tmp_path, lambda c: FakeTransport(c, LONG), Plan(wl.session, concurrency=2, count=10), during=_stop_at(3.0)
    )
    assert sorted(rec["session"]) == list(range(10))
    assert rec["status"].count("ok") == 4 and rec["status"].count("not_sent") == 6


# -- the stop API ----------------------------------------------------------------------------------
def test_a_second_stop_ends_the_drain_at_once(tmp_path: Path) -> None:
    rec, _, engine = run(
        tmp_path, lambda c: FakeTransport(c, HANG), plan([0, 0, 0, 10_000]), grace_s=60.0, during=_stop_at(1.0, 2.0)
    )
    assert rec["status"] == ["cancelled"] * 3 + ["not_sent"]
    assert set(rec["error"][:3]) == {"cancelled before the answer ended: drain cut short (SIGINT)"}
    start = rec["t_sched"][0]
    assert all(start + 2 * S <= t < start + 2 * S + MS for t in rec["t_done"][:3])
    assert engine.stop_reason == "SIGINT" and engine.drain_cut


@pytest.mark.parametrize("reason,kept", [("SIGTERM", "SIGTERM"), ("\x1b[31mred\u202e", "red"), ("", "interrupted")])
def test_the_stop_reason_is_kept_clean(tmp_path: Path, reason: str, kept: str) -> None:
    rec, _, engine = run(
        tmp_path, lambda c: FakeTransport(c, Answer.tokens(3)), plan([0, 5000]), during=_stop_at(1.0, reason=reason)
    )
    assert engine.stop_reason == kept and rec["error"][1] == f"not sent: run stopped ({kept})"
