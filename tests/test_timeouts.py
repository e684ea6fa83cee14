"""Each request's timeouts, down to 50 ms: what ends each, and that each fires at its time.

First-byte runs until the first output-carrying event (SSE comments, keep-alives, a role chunk
and a tool call's header do not end it); idle runs from the body's last read of any bytes
(comments count); total bounds the request. Each request has a timer of its own, so on virtual
time a limit fires within a few loop ticks of its instant, however many requests are in flight.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from fake_wire import COMMENT, MS, Answer, FakeTransport, Read, plan, run, sse, tail

from loadgen.client.config import EngineConfig, Timeouts
from loadgen.client.engine import Engine
from loadgen.records import RecordWriter, read_stream

TICKS = 50_000  # 50 us of virtual time: a few dozen turns of the loop
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOOL_HEADER = (
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",'
    b'"function":{"name":"get_weather","arguments":""}}]}}]}\n\n'
)


def _every(ms: float, data: bytes, n: int = 1000) -> list[Read]:
    return [Read(ms, data) for _ in range(n)]


NOTHING = Answer(head_ms=60_000.0)
KEEPALIVES = Answer(head_ms=5.0, reads=_every(10.0, COMMENT))
HEADERS_ONLY = Answer(head_ms=5.0, reads=[Read(0.0, ROLE), Read(10.0, TOOL_HEADER), *_every(10.0, COMMENT)])
ONE_TOKEN_THEN_SILENCE = Answer(head_ms=5.0, reads=[Read(0.0, sse(0)), Read(60_000.0, sse(1))])
STEADY = Answer(head_ms=5.0, reads=[Read(0.0 if i == 0 else 10.0, sse(i)) for i in range(1000)])


@pytest.mark.parametrize(
    "answer,timeouts,why,cut_ms",
    [
        (NOTHING, Timeouts(first_byte=0.05), "no output before the first-byte timeout", 50),
        (KEEPALIVES, Timeouts(first_byte=0.05), "no output before the first-byte timeout", 50),
        (HEADERS_ONLY, Timeouts(first_byte=0.05), "no output before the first-byte timeout", 50),
        (ONE_TOKEN_THEN_SILENCE, Timeouts(idle=0.05), "idle timeout between reads", 5 + 50),
        (STEADY, Timeouts(total=0.05), "total timeout", 50),
    ],
    ids=["nothing", "keep-alives", "role-and-tool-header", "idle", "total"],
)
def test_each_limit_cuts_the_request_off_at_its_time(
    tmp_path: Path, answer: Answer, timeouts: Timeouts, why: str, cut_ms: int
) -> None:
    rec, _, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0.0]), timeouts=timeouts)
    assert rec["status"] == ["timeout"] and rec["error"] == [why]
    took = rec["t_done"][0] - rec["t_sched"][0]
    assert cut_ms * MS <= took <= cut_ms * MS + TICKS
    assert rec["t_first"] == [rec["chunk_ns"][0][0] if rec["chunk_ns"][0] else None]  # what came before is kept


def test_comments_keep_a_slow_answer_from_the_idle_timeout(tmp_path: Path) -> None:
    """A token, then 300 ms of keep-alive comments 20 ms apart, then the rest: never 50 ms without a read."""
    reads = [Read(0.0, sse(0)), *_every(20.0, COMMENT, 15), Read(20.0, sse(1)), Read(0.0, tail(2))]
    rec, _, _ = run(
        tmp_path,
        lambda c: FakeTransport(c, Answer(head_ms=5.0, reads=reads)),
        plan([0.0]),
        timeouts=Timeouts(idle=0.05),
    )
    assert rec["status"] == ["ok"] and rec["output_tokens"] == [2]
    assert abs(rec["t_last"][0] - rec["t_first"][0] - 320 * MS) < TICKS


def test_the_first_byte_timeout_ends_with_the_first_token_however_late_the_headers(tmp_path: Path) -> None:
    """Role chunk and comments for 40 ms, the first token at 45 ms: in time for a 50 ms limit."""
    reads = [Read(0.0, ROLE), *_every(10.0, COMMENT, 4), Read(5.0, sse(0)), Read(30.0, sse(1)), Read(0.0, tail(2))]
    answer = Answer(head_ms=0.0, reads=reads)
    rec, _, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0.0]), timeouts=Timeouts(first_byte=0.05))
    assert rec["status"] == ["ok"] and abs(rec["t_first"][0] - rec["t_sent"][0] - 45 * MS) < TICKS


def test_every_request_in_flight_is_cut_off_at_its_own_time(tmp_path: Path) -> None:
    """60 requests 1 ms apart, none answered: each cut 50 ms after its own instant, to the tick."""
    rec, _, _ = run(
        tmp_path,
        lambda c: FakeTransport(c, NOTHING),
        plan([float(i) for i in range(60)]),
        timeouts=Timeouts(first_byte=0.05),
    )
    assert set(rec["status"]) == {"timeout"} and len(rec["status"]) == 60
    took = np.asarray(rec["t_done"]) - np.asarray(rec["t_sched"])
    assert (took >= 50 * MS).all() and (took <= 50 * MS + TICKS).all()


def test_the_limits_run_from_the_intended_instant_not_from_the_early_preparation(tmp_path: Path) -> None:
    """Requests are prepared a lead (25 ms) ahead and held: a 50 ms limit still runs from the instant."""
    rec, wire, _ = run(
        tmp_path, lambda c: FakeTransport(c, NOTHING), plan([0.0, 100.0]), timeouts=Timeouts(first_byte=0.05)
    )
    assert all(w.prepared < w.at for w in wire.wrote)
    took = np.asarray(rec["t_done"]) - np.asarray(rec["t_sched"])
    assert (took >= 50 * MS).all() and (took <= 50 * MS + TICKS).all()


class _KeepAlives(asyncio.Protocol):
    """Answers any request with a 200 stream head, then an SSE comment every 10 ms, never a token."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]  # a TCP server's transport
        self.task: asyncio.Task[None] | None = None

    def data_received(self, data: bytes) -> None:
        if self.task is None and b"\r\n\r\n" in data:
            self.task = asyncio.get_running_loop().create_task(self.comments())

    async def comments(self) -> None:
        self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not self.t.is_closing():
            self.t.write(b"%x\r\n%s\r\n" % (len(COMMENT), COMMENT))
            await asyncio.sleep(0.01)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.task.cancel()


@pytest.mark.timing
def test_a_real_endpoint_sending_only_keep_alives_is_cut_off_at_the_first_byte_timeout(tmp_path: Path) -> None:
    """Over loopback, on real time: a 50 ms first-byte limit ends the request at 50 ms, give or
    take what a loaded box delays a timer (the bound: 100 ms late), not at the request timeout."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_KeepAlives, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        async with server:
            with RecordWriter(tmp_path / "r.arrows") as w:
                cfg = EngineConfig(url=url, model="m", run_id="t", timeouts=Timeouts(first_byte=0.05, total=5.0))
                await Engine(cfg, w).run(plan([0.0]), time.perf_counter_ns() + 10 * MS, grace_s=5)

    asyncio.run(go())
    rec = read_stream(tmp_path / "r.arrows").to_pydict()
    assert rec["status"] == ["timeout"] and rec["error"] == ["no output before the first-byte timeout"]
    took_ms = (rec["t_done"][0] - rec["t_sched"][0]) / MS
    assert 50 <= took_ms < 150, took_ms
