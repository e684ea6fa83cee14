"""The simulator's streaming writer alone, against a fake transport (no socket, no clock): the bytes
each way of writing a token sends, fault points, chunking, and handing a stream back to its handler."""

from __future__ import annotations

import asyncio

import pytest

from loadgen.sim.answer import SimConfig, SseFrames
from loadgen.sim.faults import FaultPlan, FaultSpec
from loadgen.sim.model import COALESCE_NS, SimRequest
from loadgen.sim.stream_writer import CUT, STALL, StreamWriter


class FakeTransport:
    """What the writer uses of an asyncio transport: writes kept, a write buffer of a chosen size."""

    def __init__(self, buffered: int = 0) -> None:
        self.writes: list[bytes] = []
        self.buffered = buffered
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes) -> None:
        self.writes.append(data)


def _writer(n: int, plan: FaultPlan | None = None, **config: object) -> StreamWriter:
    req = SimRequest("r", [7] * 5, n, arrival_ns=0)
    cfg = SimConfig(**config)  # type: ignore[arg-type]
    return StreamWriter(req, SseFrames("r", "sim", chat=True), cfg, plan or FaultPlan(), [], None, chunked=True)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def test_prepared_and_direct_writes_carry_the_frames_take_makes():
    """The model's three ways of writing one token (prepared and fired at the step's end, written in
    the step by ``on_emit``, coalesced when far behind) all send what ``take`` would, one HTTP chunk a
    token, each counted once; the last token hands the stream back to its handler."""
    n = 5
    reference = _writer(n)
    reference.req.emit(n, 0)
    frames = [f + b"\n\n" for f in reference.take().split(b"\n\n")[:-1]]
    expected = [_chunk(f) for f in frames]

    async def main() -> tuple[StreamWriter, FakeTransport, list[int]]:
        w, t = _writer(n), FakeTransport()
        req = w.req
        w.go_direct(t)
        assert req.sink == w.on_emit and req.prepare == w.prepare
        writes_after = []
        fire = req.prepare()  # token 0, prepared before its step's end...
        assert fire is not None and t.writes == []
        fire()  # ...written first thing at the end...
        req.emit(1, 10, model_ns=10)  # ...and only counted in the step's bookkeeping
        writes_after.append(len(t.writes))
        req.emit(1, 20, model_ns=20)  # token 1: written by on_emit, inside the step
        writes_after.append(len(t.writes))
        late = 60 + COALESCE_NS  # tokens 2 to 4 emitted far behind their instants: held for one write
        req.emit(1, late, model_ns=30)
        req.emit(1, late, model_ns=40)
        writes_after.append(len(t.writes))
        await asyncio.sleep(0)
        writes_after.append(len(t.writes))
        req.emit(1, late, model_ns=50)  # the last token, still behind: flushed at the next turn...
        await asyncio.sleep(0)
        writes_after.append(len(t.writes))
        return w, t, writes_after  # ...and, the answer complete, the handler takes over

    w, t, writes_after = asyncio.run(main())
    assert writes_after == [1, 2, 2, 3, 4]
    assert t.writes[:2] == expected[:2]
    assert t.writes[2] == _chunk(frames[2] + frames[3])
    assert t.writes[3] == expected[4]
    assert w.sent == n and len(w.req.written_ns) == n and w.complete()
    assert not w.direct and w.req.sink is None


def test_a_backed_up_or_closed_socket_is_left_to_the_handler():
    async def main() -> list[bool]:
        went = []
        for t in (FakeTransport(buffered=1 << 20), FakeTransport(), None):
            if t is not None and not t.buffered:
                t.closing = True
            w = _writer(3)
            w.go_direct(t)
            went.append(w.direct or w.req.sink is not None)
        return went

    assert asyncio.run(main()) == [False, False, False]


@pytest.mark.parametrize(
    ("plan", "action", "before"),
    [
        (FaultPlan(stall_at=2), STALL, 2),
        (FaultPlan(disconnect_at=2), CUT, 2),
        (FaultPlan(malformed_at=2), 0, 5),
    ],
)
def test_take_stops_at_a_fault_point_for_the_handler(plan, action, before):
    w = _writer(5, plan)
    w.req.emit(5, 0)
    data = w.take()
    assert (w.action, w.sent) == (action, before)
    assert data.count(b"chat.completion.chunk") == before
    assert (b"data: {not json\n\n" in data) == (plan.malformed_at >= 0)
    assert w.take() == b""  # nothing more until the handler acted
    if action == STALL:
        w.action, w.stalled = 0, True  # the handler waited out the stall
        assert w.take().count(b"chat.completion.chunk") == 3 and w.complete()


def test_take_chunks_tokens_and_the_buffered_fault_holds_them_to_the_end():
    w = _writer(7, tokens_per_chunk=3)
    w.req.emit(4, 0)
    assert w.take().count(b"chat.completion.chunk") == 1 and w.sent == 3  # one full chunk; one token waits
    w.req.emit(3, 0)
    assert w.take().count(b"chat.completion.chunk") == 2 and w.sent == 7  # a chunk of 3, the last of 1
    held = _writer(4, faults=FaultSpec(buffered=True))
    held.req.emit(3, 0)
    assert held.take() == b"" and held.sent == 3
    held.req.emit(1, 0)
    assert held.take().count(b"chat.completion.chunk") == 4 and held.complete()
