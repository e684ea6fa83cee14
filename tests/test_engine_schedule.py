"""The engine's scheduling on virtual time, through a scripted transport: no sockets, no real waiting.

Every time here is exact up to the virtual loop's tick (1 us per busy turn of the loop), so
the tolerances are a few ticks, or a period of the engine's own (its 10 ms loop probe).
Timeouts are in test_timeouts.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_wire import MS, Answer, FakeTransport, Read, at, conversation, plan, run, sse, tail

from loadgen.client.config import Plan
from loadgen.client.engine import LEAD_NS, Engine
from loadgen.client.holds import HoldQueue
from loadgen.client.loop_probe import PERIOD_NS
from loadgen.client.transport import Exchange
from loadgen.clock import VirtualClock
from loadgen.workload.base import SyntheticChat

TICKS = 50_000  # 50 us: a request's hold and write take a few dozen turns of the loop


def _by_sched(rec: dict[str, list[Any]]) -> dict[str, np.ndarray]:
    order = np.argsort(rec["t_sched"])
    cols = ("t_sched", "t_sent", "t_first", "t_done", "request")
    return {k: np.asarray(rec[k], dtype=np.float64)[order] for k in cols}


def test_each_request_is_prepared_early_and_written_at_its_instant(tmp_path: Path) -> None:
    rec, wire, engine = run(tmp_path, lambda c: FakeTransport(c, Answer.tokens(3)), plan([0, 10, 20, 50, 100]))
    assert set(rec["status"]) == {"ok"} and engine.fast_path.ok
    for w in wire.wrote:
        assert w.at - LEAD_NS <= w.prepared < w.at - LEAD_NS + TICKS  # started a lead ahead ...
        assert w.at <= w.t < w.at + TICKS  # ... and its bytes held to its instant, never before
    assert sorted(rec["t_sent"]) == sorted(w.t for w in wire.wrote)
    r = _by_sched(rec)
    assert np.diff(r["t_sched"]).tolist() == [10 * MS, 10 * MS, 30 * MS, 50 * MS]  # the plan, untouched


def test_a_client_stall_is_in_the_ttft_from_the_intended_time_and_not_in_t_sched(tmp_path: Path) -> None:
    """The loop is frozen from 190 to 590 ms: every request due meanwhile goes out when it ends,
    and its lateness counts in TTFT from its intended instant; TTFT from the send stays the
    endpoint's 50 ms. (Answers that arrived during the stall are stamped when it ends: the
    client could not read them sooner, and that too is in their TTFT.)"""
    stall_from, stall_ms = 190 * MS, 400

    def stall(engine: Engine, clock: VirtualClock, start: int) -> None:
        at(start + stall_from, lambda: clock.advance(stall_ms * MS))

    rec, wire, engine = run(
        tmp_path, lambda c: FakeTransport(c, Answer.tokens(4)), plan([i * 20.0 for i in range(40)]), during=stall
    )
    assert set(rec["status"]) == {"ok"}
    r = _by_sched(rec)
    start = r["t_sched"][0]
    stall_end = start + stall_from + stall_ms * MS
    hit = (r["t_sched"] > start + stall_from) & (r["t_sched"] < stall_end)
    assert hit.sum() == 20  # due at 200, 220, ... 580 ms
    assert (r["t_sent"][hit] >= stall_end).all() and (r["t_sent"][hit] < stall_end + 1 * MS).all()
    ttft = r["t_first"] - r["t_sched"]
    ttft_sent = r["t_first"] - r["t_sent"]
    assert np.allclose(ttft[hit], stall_end - r["t_sched"][hit] + 50 * MS, atol=1 * MS)  # the stall is in it ...
    assert np.allclose(ttft_sent[hit], 50 * MS, atol=TICKS)  # ... not in what the endpoint took
    assert (r["t_sent"][~hit] - r["t_sched"][~hit] < TICKS).all()  # the rest on time, 600 ms included
    assert set(np.diff(r["t_sched"]).tolist()) == {20 * MS}
    # the probe's timer (every PERIOD_NS) was due during the stall: it saw it, nearly whole
    assert stall_ms - PERIOD_NS / MS <= engine.live.loop_lag_max_ms == engine.probe.lag_max_ms <= stall_ms


def test_a_request_due_during_a_burst_of_reads_is_sent_from_the_read_after_its_instant(tmp_path: Path) -> None:
    """A decode step's tokens for many streams arrive at once, and reading them keeps the loop
    busy: here 40 reads of 1 ms each from 60 to 100 ms, during which no timer can run. Requests
    held for 70 and 80 ms (prepared at 45 and 55) go out from the first read at or after their instants."""
    burst = [Read(0.0, sse(i), busy_ms=1.0) for i in range(40)]
    long = Answer(head_ms=50.0, reads=[Read(0.0, sse(0)), Read(10.0, sse(1)), *burst, Read(0.0, tail(42))])

    def answer(ex: Exchange) -> Answer:
        return long if ex.seq == 0 else Answer.tokens(2)

    rec, wire, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0, 70, 80]))
    assert set(rec["status"]) == {"ok"}
    for seq in (1, 2):
        w = wire.written(seq)
        assert w.at <= w.t < w.at + 1 * MS, (w.t - w.at) / MS  # from a read: within one read's work
    assert wire.written(0).t + 100 * MS > wire.written(2).t  # the burst was still going on then


def test_on_a_busy_loop_every_session_due_is_started_in_the_same_turn(tmp_path: Path) -> None:
    """Every turn of the loop here lasts 5 ms (one stream's reads keep it busy from 50 to 800 ms),
    and 100 sessions fall due 0.5 ms apart from 200 ms: started one or two a turn, the last ones
    would be prepared after their instants (by 360 ms for 250); started together, each is
    prepared a lead ahead and written within a turn of its instant."""
    busy = Answer(head_ms=50.0, reads=[*(Read(0.001, sse(i), busy_ms=5.0) for i in range(150)), Read(0.0, tail(150))])

    def answer(ex: Exchange) -> Answer:
        return busy if ex.seq == 0 else Answer.tokens(1)

    rec, wire, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0, *(200.0 + k / 2 for k in range(100))]))
    assert set(rec["status"]) == {"ok"} and len(wire.wrote) == 101
    late_ms = [(w.t - w.at) / MS for w in wire.wrote]
    assert 0 <= min(late_ms) and max(late_ms) <= 5.0 + 0.1, max(late_ms)


def test_a_stop_gives_requests_in_flight_the_grace_and_sends_nothing_new(tmp_path: Path) -> None:
    short, long = Answer.tokens(5, itl_ms=100.0), Answer.tokens(20, itl_ms=100.0)

    def stop_at_500(engine: Engine, clock: VirtualClock, start: int) -> None:
        at(start + 500 * MS, engine.stop)

    rec, wire, _ = run(
        tmp_path,
        lambda c: FakeTransport(c, lambda ex: short if ex.seq == 0 else long),
        plan([300, 400, 800]),
        grace_s=0.5,
        during=stop_at_500,
    )
    assert rec["request"] == [0, 1, 2]  # one record each, the 800 ms session's too
    assert [w.seq for w in wire.wrote] == [0, 1]  # ... which was never sent
    assert rec["status"] == ["ok", "cancelled", "not_sent"]  # ended inside the grace; cut off at its end
    assert rec["error"][1:] == [
        "cancelled before the answer ended: run stopped (interrupted), drain of 0.5 s over",
        "not sent: run stopped (interrupted)",
    ]
    assert rec["t_sent"][2] is None and rec["t_done"][2] is None
    start = rec["t_sched"][0] - 300 * MS
    assert rec["t_sched"][2] == start + 800 * MS  # its planned instant, kept
    assert start + 1000 * MS <= rec["t_done"][1] < start + 1000 * MS + TICKS
    assert len(rec["chunk_ns"][1]) == 6  # its tokens at 450, 550, ... 950 ms are kept


def test_a_request_held_when_the_run_is_stopped_never_goes_out(tmp_path: Path) -> None:
    def stop_while_held(engine: Engine, clock: VirtualClock, start: int) -> None:
        at(start + 90 * MS, engine.stop)  # the first prepared at 75 ms, due at 100

    rec, wire, _ = run(
        tmp_path, lambda c: FakeTransport(c, Answer.tokens(3)), plan([100, 5000]), grace_s=0.0, during=stop_while_held
    )
    assert wire.wrote == [] and wire.dropped == [0]
    assert rec["status"] == ["not_sent", "not_sent"] and rec["t_sent"] == [None, None]
    assert rec["error"] == ["not sent: run stopped (interrupted)"] * 2


def test_a_stop_drops_what_is_held_before_a_read_could_send_it() -> None:
    """aiohttp holds a request in its own writing task, which the session's cancellation
    reaches only later: a read in between (``send_due``) must not send it after the stop."""

    async def main() -> tuple[list[str], list[str]]:
        now = [0]
        queue = HoldQueue(lambda: now[0])
        sent: list[str] = []
        held = [_Recorded(name, sent) for name in ("held", "late")]
        writer = asyncio.ensure_future(queue.hold(Exchange(0, b"", {}, 100 * MS), held[0]))
        await asyncio.sleep(0)
        queue.close()  # the stop, in the same callback as the cancellations it orders
        now[0] = 200 * MS
        queue.send_due(now[0])  # a read of another stream, before the writer's cancellation lands
        late = asyncio.ensure_future(queue.hold(Exchange(1, b"", {}, 300 * MS), held[1]))
        await asyncio.sleep(0)
        for task in (writer, late):
            task.cancel()
        await asyncio.gather(writer, late, return_exceptions=True)
        return sent, [h.name for h in held if h.sent]

    sent, dropped = asyncio.run(main())
    assert sent == [] and dropped == ["held", "late"]


class _Recorded:
    def __init__(self, name: str, sent: list[str]) -> None:
        self.name, self.log, self.sent = name, sent, False

    def send(self) -> None:
        if not self.sent:
            self.sent = True
            self.log.append(self.name)

    def drop(self) -> None:
        self.sent = True


def test_without_the_fast_path_requests_are_prepared_at_their_instant(tmp_path: Path) -> None:
    rec, wire, engine = run(tmp_path, lambda c: FakeTransport(c, Answer.tokens(3), fast=False), plan([0, 40]))
    assert not engine.fast_path.ok and engine.fast_path.why == "fake: the slow path"
    for w in wire.wrote:  # no lead, no hold: the client's own work shows as schedule lag
        assert w.at <= w.prepared < w.at + TICKS
        assert w.at + 0.3 * MS <= w.t < w.at + 0.3 * MS + TICKS
    assert set(rec["status"]) == {"ok"}


@pytest.mark.parametrize(
    "answer,status,error",
    [
        (Answer(status=429, error=b'{"error": "slow down"}', retry_after="2"), "http_error", "HTTP 429: "),
        (Answer(end="disconnect", reads=[Read(0.0, sse(0))]), "disconnected", "ServerDisconnectedError"),
        (Answer(reads=[Read(0.0, sse(0))]), "disconnected", "stream ended without [DONE]"),
        (Answer(reads=[Read(0.0, b"hello\n\n")]), "bad_stream", "no SSE events"),
        (Answer(reads=[Read(0.0, b'data: {"error": {"message": "boom"}}\n\n')]), "http_error", "boom"),
        (Answer(reads=[Read(0.0, b"data: {not json\n\n")]), "bad_stream", ""),
    ],
)
def test_what_goes_wrong_on_the_wire_becomes_a_record(tmp_path: Path, answer: Answer, status: str, error: str) -> None:
    rec, _, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0, 10]))
    assert rec["status"] == [status] * 2
    assert all(error in e for e in rec["error"]) and all(rec["error"])
    if answer.status == 429:
        assert rec["http_status"] == [429, 429] and all("(Retry-After: 2)" in e for e in rec["error"])


def test_closed_loop_users_send_when_their_previous_answer_ends(tmp_path: Path) -> None:
    wl = SyntheticChat(input_tokens=4, output_tokens=3)
    rec, wire, _ = run(tmp_path, lambda c: FakeTransport(c, Answer.tokens(3)), Plan(wl.session, concurrency=2, count=6))
    assert rec["status"] == ["ok"] * 6 and sorted(rec["request"]) == list(range(6))
    assert wire.connections == 2 and wire.most_open == 2
    done = sorted(rec["t_done"])
    for t_sched in sorted(rec["t_sched"])[2:]:  # each later request starts as an earlier one ends
        assert min(abs(t_sched - d) for d in done) < TICKS
    # nothing to hold: each is written once the client's own work for it is done
    assert all(0.3 * MS <= s - t < 0.3 * MS + TICKS for s, t in zip(rec["t_sent"], rec["t_sched"], strict=True))


def test_reaching_max_inflight_delays_sends_and_is_counted(tmp_path: Path) -> None:
    rec, wire, engine = run(tmp_path, lambda c: FakeTransport(c, Answer.tokens(6)), plan([0.0] * 5), max_inflight=2)
    assert set(rec["status"]) == {"ok"}
    assert wire.connections == 2 and wire.most_open == 2 and engine.live.capped == 3
    lag = np.sort(np.asarray(rec["t_sent"]) - np.asarray(rec["t_sched"]))
    assert (lag[:2] < TICKS).all() and (lag[2:] >= 100 * MS).all()  # the capped waited for an answer: lag


def test_each_later_turn_is_scheduled_after_the_previous_answer_and_its_think_time(tmp_path: Path) -> None:
    rec, wire, _ = run(tmp_path, lambda c: FakeTransport(c, Answer.tokens(3)), conversation(3, think_ms=200.0))
    assert rec["status"] == ["ok"] * 3 and rec["turn"] == [0, 1, 2]
    for k in (1, 2):
        assert rec["t_sched"][k] == rec["t_done"][k - 1] + 200 * MS
    for w in wire.wrote:  # later turns too are started early and held to their instant
        assert w.at - LEAD_NS <= w.prepared < w.at - LEAD_NS + TICKS and w.at <= w.t < w.at + TICKS
