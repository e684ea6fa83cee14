"""A scripted transport for the engine, on virtual time: the engine's scheduling without sockets.

``FakeTransport`` answers each exchange with an ``Answer`` (a head after some time, then reads
at scripted times, then an end) on the ``VirtualLoop``'s clock, and notes when each request
was prepared and when its bytes were written. Like the real transport, it writes a request
prepared before its instant into a ``Held`` for the engine's hold queue, and calls the queue's
``send_due`` from each read at or after its ``next_due``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadgen.client.config import EngineConfig, Plan
from loadgen.client.engine import Engine
from loadgen.client.transport import Exchange, FastPath, Holds, OnRead, WireError
from loadgen.clock import Clock, VirtualClock, run_virtual
from loadgen.records import RecordWriter, read_stream
from loadgen.workload.base import SyntheticChat
from loadgen.workload.session import Session, Turn

MS = 1_000_000


def sse(i: int) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"w%d "}}]}\n\n' % i


COMMENT = b": keep-alive\n\n"  # an SSE comment: bytes on the wire, no event


def tail(n: int) -> bytes:
    return b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % n


@dataclass
class Read:
    after_ms: float  # after the previous read (or the head); 0: in the same turn of the loop
    data: bytes
    busy_ms: float = 0.0  # the client is then busy this long without yielding (a burst of other reads)


@dataclass
class Answer:
    """What the fake endpoint does with one request."""

    head_ms: float = 50.0  # from the request's write to its answer's head
    reads: list[Read] = field(default_factory=list)
    status: int = 200
    end: str = "eof"  # "eof", "disconnect" (a WireError after the reads) or "hang" (never ends)
    error: bytes = b""
    retry_after: str | None = None
    cleanup_ms: float = 0.0  # after the last read, the HTTP client's own work (releasing the connection, an error)

    @staticmethod
    def tokens(n: int, ttft_ms: float = 50.0, itl_ms: float = 10.0) -> Answer:
        """n tokens, the first ``ttft_ms`` after the write, then one each ``itl_ms``, then usage."""
        reads = [Read(0.0 if i == 0 else itl_ms, sse(i)) for i in range(n)]
        return Answer(head_ms=ttft_ms, reads=[*reads, Read(0.0, tail(n))])


@dataclass
class Wrote:
    seq: int
    at: int  # the request's instant
    prepared: int  # when the engine handed it to the transport
    t: int  # when its bytes went out


class _Held:
    def __init__(self, wire: FakeTransport, ex: Exchange, prepared: int) -> None:
        self.wire, self.ex, self.prepared = wire, ex, prepared
        self.sent = False
        self.dropped = False

    def send(self) -> None:
        if not self.sent:
            self.sent = True
            self.wire.wrote.append(Wrote(self.ex.seq, self.ex.at, self.prepared, self.wire.clock()))

    def drop(self) -> None:
        self.sent = self.dropped = True
        self.wire.dropped.append(self.ex.seq)


class FakeTransport:
    """Answers every request by ``answer(exchange)``; ``prepare_ms`` is the client's own work
    before a write (taking a connection, the HTTP client's bookkeeping), awaited, not busy."""

    def __init__(
        self,
        clock: VirtualClock,
        answer: Callable[[Exchange], Answer] | Answer,
        *,
        fast: bool = True,
        prepare_ms: float = 0.3,
    ) -> None:
        self.clock = clock
        self.answer = answer if callable(answer) else (lambda ex: answer)
        self.fast = fast
        self.prepare_ms = prepare_ms
        self.wrote: list[Wrote] = []
        self.dropped: list[int] = []
        self.connections: int | None = None
        self.open_now = 0
        self.most_open = 0
        self._holds: Holds | None = None

    @asynccontextmanager
    async def open(self, clock: Clock, holds: Holds, connections: int) -> AsyncIterator[FastPath]:
        self.connections, self._holds = connections, holds
        yield FastPath(True) if self.fast else FastPath(False, "fake: the slow path")

    async def exchange(self, ex: Exchange, on_read: OnRead) -> None:
        assert self._holds is not None
        holds, clock = self._holds, self.clock
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            prepared = clock()
            await asyncio.sleep(self.prepare_ms / 1e3)
            if self.fast and ex.at > clock():
                await holds.hold(ex, _Held(self, ex, prepared))
            else:
                ex.t_sent = clock()
                self.wrote.append(Wrote(ex.seq, ex.at, prepared, ex.t_sent))
            answer = self.answer(ex)
            assert ex.t_sent is not None  # written: by now, or from a read before the hold returned
            await asyncio.sleep(max(ex.t_sent + int(answer.head_ms * MS) - clock(), 0) / 1e9)
            ex.t_headers, ex.status, ex.content_type = clock(), answer.status, "text/event-stream"
            if answer.status != 200:
                ex.error, ex.retry_after = answer.error, answer.retry_after
                return
            for read in answer.reads:
                if read.after_ms:
                    await asyncio.sleep(read.after_ms / 1e3)
                t = clock()
                on_read(read.data, t)
                if t >= holds.next_due:
                    holds.send_due(t)
                clock.advance(int(read.busy_ms * MS))
            clock.advance(int(answer.cleanup_ms * MS))
            if answer.end == "disconnect":
                raise WireError("disconnected", "ServerDisconnectedError: the fake closed mid-body")
            if answer.end == "hang":
                await asyncio.Event().wait()
        finally:
            self.open_now -= 1

    def written(self, seq: int) -> Wrote:
        (w,) = [w for w in self.wrote if w.seq == seq]
        return w


def plan(offsets_ms: list[float], output_tokens: int = 3) -> Plan:
    """Single-turn sessions at these offsets from the start."""
    offs = (np.asarray(offsets_ms, dtype=np.float64) * MS).astype(np.int64)
    wl = SyntheticChat(input_tokens=4, output_tokens=output_tokens)
    return Plan(session=wl.session, offsets_ns=offs, indices=np.arange(len(offs)))


def conversation(turns: int, think_ms: float, output_tokens: int = 3) -> Plan:
    """One session of ``turns`` turns, each sent ``think_ms`` after the previous answer ended."""
    session = Session(
        session=0,
        turns=tuple(Turn(f"question {k}", output_tokens, think_ns=int(think_ms * MS)) for k in range(turns)),
    )
    return Plan(session=lambda i: session, offsets_ns=np.zeros(1, dtype=np.int64), indices=np.arange(1))


def run(
    tmp_path: Path,
    transport: Callable[[VirtualClock], FakeTransport],
    the_plan: Plan,
    *,
    grace_s: float = 30.0,
    during: Callable[[Engine, VirtualClock, int], None] | None = None,
    writer: Callable[[Path], RecordWriter] = RecordWriter,
    api_key: str | None = None,
    url: str = "http://fake/v1",
    **config: Any,
) -> tuple[dict[str, list[Any]], FakeTransport, Engine]:
    """Run an engine over a fake transport on virtual time, from ``start`` = 1 s on the clock;
    ``during(engine, clock, start)`` may arrange stalls or a stop. Returns the records by column."""
    clock = VirtualClock()
    wire = transport(clock)
    path = tmp_path / "r.arrows"

    async def go() -> Engine:
        with writer(path) as w:
            cfg = EngineConfig(url=url, model="m", run_id="t", **config)
            engine = Engine(cfg, w, api_key=api_key, clock=clock, transport=wire)
            start = clock() + 1_000 * MS
            if during:
                during(engine, clock, start)
            await engine.run(the_plan, start, grace_s=grace_s)
        return engine

    engine = run_virtual(go(), clock)
    return read_stream(path).to_pydict(), wire, engine


def at(t_ns: int, fn: Callable[[], object]) -> None:
    """Call ``fn`` when the (virtual) loop's clock reaches ``t_ns``."""
    asyncio.get_running_loop().call_at(t_ns / 1e9, fn)


def sessions(sessions: list[Session], offsets_ms: list[float]) -> Plan:
    """These sessions, session i starting at ``offsets_ms[i]``."""
    offs = (np.asarray(offsets_ms, dtype=np.float64) * MS).astype(np.int64)
    return Plan(session=lambda i: sessions[i], offsets_ns=offs, indices=np.arange(len(offs)))


def turns_in(session: Session) -> int:
    """How many requests a session makes: its turns and its subagents' turns."""
    return sum(1 + sum(turns_in(c) for c in t.children) for t in session.turns)


def last_message(ex: Exchange) -> str:
    """The text of the turn a request sends (its last message)."""
    return str(orjson.loads(ex.body)["messages"][-1]["content"])
