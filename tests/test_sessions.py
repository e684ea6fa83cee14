"""Sessions are whole: per-session turns, durations (censored when a session did not complete),
turn latency, and the load of a multi-turn workload in sessions/s. Hand-built records throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hand_runs import written

from loadgen.analysis.sessions import load_unit, per_session, session_summary
from loadgen.analysis.window import Window
from loadgen.records import Record
from loadgen.workload.load import load_workload

BASE = 10**12
MS = 1_000_000


def ns(ms: float) -> int:
    return BASE + round(ms * MS)


def turn(session: int, k: int, sched: float, done: float | None, status: str = "ok", sent: bool = True) -> Record:
    """Turn ``k`` of ``session`` scheduled at ``sched`` ms, one token at ``sched + 5``, ended at ``done``."""
    got = status == "ok" or (done is not None and status == "cancelled")
    first = ns(sched + 5) if got and done is not None else None
    return Record(
        session=session,
        turn=k,
        t_sched=ns(sched),
        t_sent=ns(sched) if sent and status != "not_sent" else None,
        t_first=first,
        t_last=first,
        t_done=None if done is None else ns(done),
        chunk_ns=[first] if first else [],
        chunk_tokens=[1] if first else [],
        output_tokens=1 if first else 0,
        status=status,
    )


WHOLE = Window(BASE - 10**12, BASE + 10**12, BASE)


@pytest.fixture
def three(tmp_path: Path) -> pa.Table:
    """Session 0 completes (3 turns, 0-900 ms); session 1's turn 1 times out at 700 ms, so its
    turn 2 is never due; session 2 is cut by the drain in its think time (turn 1 never sent); the
    latest instant any record holds is session 0's end, 900 ms."""
    return written(
        tmp_path,
        turn(0, 0, 0, 100),
        turn(0, 1, 300, 500),
        turn(0, 2, 700, 900),
        turn(1, 0, 100, 200),
        turn(1, 1, 400, 700, status="timeout"),
        turn(1, 2, 700, None, status="not_sent"),
        turn(2, 0, 200, 250),
        turn(2, 1, 600, None, status="not_sent"),
    )


def test_each_session_is_counted_whole_and_an_unfinished_one_is_censored(three: pa.Table) -> None:
    s, of = per_session(three)
    assert list(s.session) == [0, 1, 2] and list(of) == [0, 0, 0, 1, 1, 1, 2, 2]
    assert list(s.turns) == [3, 3, 2]
    assert list(s.turns_ok) == [3, 1, 1]
    assert list(s.turns_not_sent) == [0, 1, 1]
    assert list(s.complete) == [True, False, False]
    # complete: first t_sched to last t_done, exact
    assert s.duration_ms[0] == pytest.approx(900.0)
    # cut by a timeout: at least to the end of the turn that broke it (the unsent turn was never due)
    assert s.duration_ms[1] == pytest.approx(700.0 - 100.0)
    # cut in a think time: its unsent turn counts to the end of observation (900 ms)
    assert s.duration_ms[2] == pytest.approx(900.0 - 200.0)
    assert s.rows()[1] == {
        "point": 0,
        "session": 1,
        "turns": 3,
        "turns_ok": 1,
        "turns_not_sent": 1,
        "complete": False,
        "duration_ms": pytest.approx(600.0),
        "duration_censored": True,
    }


def test_the_summary_says_which_duration_percentiles_are_lower_bounds(three: pa.Table) -> None:
    m = session_summary(three, WHOLE)
    assert (m.sessions, m.started, m.completed) == (3, 3, 1)
    assert (m.turns, m.turns_ok, m.turns_not_sent) == (8, 5, 2)
    assert m.multi_turn and m.unit == "sessions/s"
    # durations 600 (censored), 700 (censored), 900 (exact): the p50 reaches a censored session
    assert m.duration.n == 3 and m.duration.censored == 2
    assert m.duration.pct(50)[0] == pytest.approx(700.0) and m.duration.lower_bound(50)
    assert m.duration.lower_bound(99)  # every rank at or above a censored sample
    # turn E2E: ok turns exact; the timeout and the think-time unsent turn censored; the never-due one out
    assert m.turn_e2e.n == 7 and m.turn_e2e.censored == 2
    assert m.turns_per_session.pct(50)[0] == 3


def test_the_json_has_units_in_its_keys_and_no_infinity(three: pa.Table) -> None:
    doc = session_summary(three, WHOLE).to_json()
    text = json.dumps(doc, allow_nan=False)  # strict JSON: no NaN, no Infinity
    assert '"inf"' not in text
    assert doc["sessions_completed"] == 1 and doc["sessions_not_completed"] == 2
    assert doc["load_unit"] == "sessions/s"
    p50 = doc["session_duration_ms"]["percentiles"]["p50"]
    assert p50["lower_bound"] is True and p50["value"] == pytest.approx(700.0)
    p99 = doc["session_duration_ms"]["percentiles"]["p99"]
    assert p99["hi"] is None and p99["hi_unbounded"] is True  # null plus its flag, never "inf"
    assert set(doc["session_duration_ms"]["percentiles"]) == {"p50", "p90", "p99"}
    assert {"offered_sessions_per_s", "produced_requests_per_s", "turn_e2e_ms"} <= set(doc)


def test_a_session_counts_in_the_window_its_first_turn_was_scheduled_in(three: pa.Table) -> None:
    """Session 0 starts at 0 ms, before a window from 50 ms: its later turns inside do not bring it in."""
    w = Window(ns(50), ns(1000), BASE)
    m = session_summary(three, w)
    assert m.sessions == 2 and m.completed == 0
    # sessions 1 and 2 start 100 ms apart: two starts over their span plus one mean gap (200 ms)
    assert m.offered_sessions_per_s == pytest.approx(2 / 0.2)
    # the req/s the sessions produced: every turn sent inside the window (session 0's later turns too)
    assert m.produced_requests_per_s == pytest.approx(5 / 0.95)


def test_subagent_turns_belong_to_their_parent_session(tmp_path: Path) -> None:
    """A subagent's records carry its parent's session id (turns from 0 again): one session, whole."""
    t = written(
        tmp_path,
        turn(5, 0, 0, 100),
        turn(5, 0, 120, 300),  # the subagent's turn 0
        turn(5, 1, 310, 400),  # the subagent's turn 1
        turn(5, 1, 450, 600),  # the parent's turn 1, after its subagent
    )
    s, _ = per_session(t)
    assert s.n == 1 and s.turns[0] == 4 and s.complete[0] and s.duration_ms[0] == pytest.approx(600.0)


def test_single_turn_requests_are_sessions_of_one(tmp_path: Path) -> None:
    t = written(tmp_path, turn(0, 0, 0, 50), turn(1, 0, 10, 70), turn(2, 0, 20, None, status="not_sent"))
    m = session_summary(t, WHOLE)
    assert not m.multi_turn and m.unit == "req/s"
    assert (m.sessions, m.completed, m.turns_not_sent) == (3, 2, 1)
    assert m.duration.censored == 1 and m.duration.pct(50)[0] == pytest.approx(50.0)


def test_no_records_no_figures(tmp_path: Path) -> None:
    doc = session_summary(written(tmp_path), WHOLE).to_json()
    assert doc["sessions"] == 0 and doc["session_duration_ms"]["n"] == 0
    assert doc["session_duration_ms"]["percentiles"]["p50"]["value"] is None
    json.dumps(doc, allow_nan=False)


@pytest.mark.parametrize(
    "name, unit",
    [("chat", "req/s"), ("rag", "req/s"), ("chat-multiturn", "sessions/s"), ("agentic", "sessions/s")],
)
def test_the_load_of_a_multi_turn_workload_is_sessions_per_second(name: str, unit: str) -> None:
    assert load_unit(load_workload(name).describe()) == unit


def test_a_one_turn_spec_of_a_multi_turn_kind_is_req_per_s() -> None:
    assert load_unit(load_workload("chat-multiturn", overrides={"turns": 1}).describe()) == "req/s"
    assert load_unit(load_workload("agentic", overrides={"turns": 1, "subagents": None}).describe()) == "req/s"


def test_trace_loads(tmp_path: Path) -> None:
    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]))
    assert load_unit(load_workload("sharegpt", overrides={"path": str(sg)}).describe()) == "req/s"
    two = [{"from": h, "value": "x"} for h in ("human", "gpt", "human", "gpt")]
    sg.write_text(json.dumps([{"conversations": two}]))
    assert load_unit(load_workload("sharegpt", overrides={"path": str(sg)}).describe()) == "sessions/s"
    assert load_unit({"format": "azure", "speed": 1.0}) == "req/s"


def test_the_words_show_a_lower_bound_where_a_session_did_not_complete(three: pa.Table) -> None:
    two_seconds = Window(BASE, BASE + 2 * 10**9, BASE)
    sessions, duration, turns = session_summary(three, two_seconds).lines()
    assert (
        sessions
        == "sessions: 3 in the window (10.00 sessions/s offered, producing 3.00 req/s); 1 completed, 2 not completed"
    )
    assert (
        duration == "session duration: p50 >= 0.7 s, p90 >= 0.9 s, p99 >= 0.9 s (2 not completed: at least this long)"
    )
    assert turns.startswith("turns per session: p50 3.0, p90 3.0, p99 3.0; 8 scheduled, 5 ok, 2 not sent; turn E2E p50")
