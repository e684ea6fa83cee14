"""What the check reads off the socket: one HTTP exchange (``Wire``), a streamed answer (``Stream``),
and when the client was looking (``LoopWatch``).

Kept apart from the battery (``check``) so the verdicts (``check_items``) can be
tested on hand-made exchanges without a socket: a ``Stream`` is read from a
``Wire``'s timed reads by the same SSE parser and stream interpreter the engine
uses, strictly for the framing items and leniently (malformed events dropped)
for the rest, so one fault fails the item it concerns rather than every item.

A read's time is when the client got round to reading, not when the bytes
arrived: a client whose event loop stalls (a busy machine) finds several chunks
waiting and reads them at once. ``LoopWatch`` notes the instants the loop was
free while the timing items ran, so their verdicts can tell a burst the server
sent from one the client's own stall made.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import orjson

from loadgen.client.protocol.sse import BadStream, SSEParser
from loadgen.client.protocol.tally import StreamTally
from loadgen.conformance.ci_outputs import clip

__all__ = ["Wire", "Stream", "LoopWatch"]


@dataclass
class Wire:
    """One HTTP exchange as read off the socket: every read with its perf_counter_ns time.

    ``looks``: instants (perf_counter_ns) at which the client's event loop was free
    during the exchange, from a ``LoopWatch``; empty when it was not watched.
    """

    status: int | None = None
    content_type: str = ""
    t_sent: int = 0
    t_done: int = 0
    reads: list[tuple[int, bytes]] = field(default_factory=list)
    error: str | None = None
    looks: list[int] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(d for _, d in self.reads)

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None

    def brief(self) -> str:
        if self.error:
            return self.error
        return f"HTTP {self.status}: {clip(self.body.decode('utf-8', 'replace'), 160)}"


@dataclass
class Stream:
    """A streamed answer: strict framing verdict plus a lenient reading of its JSON events."""

    wire: Wire
    api: str
    strict_error: str | None = None
    done: bool = False
    after_done: int = 0
    bad_events: list[bytes] = field(default_factory=list)
    objects: list[Any] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    tally: StreamTally | None = None
    interp_error: str | None = None

    @classmethod
    def read(cls, wire: Wire, api: str) -> Stream:
        s = cls(wire, api)
        strict = StreamTally(api)
        lenient = StreamTally(api, keep_text=True)
        s.tally = lenient
        parser = SSEParser()
        try:
            for t, data in wire.reads:
                strict.feed(data, t)
        except BadStream as e:
            s.strict_error = clip(str(e), 160)
        events: list[tuple[int, bytes]] = []
        try:
            for t, data in wire.reads:
                events += [(t, p) for p in parser.feed(data)]
            events += [(wire.t_done, p) for p in parser.close()]
        except BadStream as e:
            s.strict_error = s.strict_error or clip(str(e), 160)
        for t, payload in events:
            s._event(t, payload, lenient)
        return s

    def _event(self, t: int, payload: bytes, lenient: StreamTally) -> None:
        if self.done:
            self.after_done += 1
            return
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.bad_events.append(payload[:80])
            return
        self.objects.append(obj)
        if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if self.interp_error is None:
            try:
                lenient.feed(b"data: " + payload + b"\n\n", t)
            except BadStream as e:
                self.interp_error = clip(str(e), 160)

    @property
    def text(self) -> str:
        return self.tally.text if self.tally else ""

    @property
    def chunk_ns(self) -> list[int]:
        return self.tally.chunk_ns if self.tally else []

    @property
    def finish_reason(self) -> str | None:
        return self.tally.finish_reason if self.tally else None

    @property
    def completion_tokens(self) -> int | None:
        ct = (self.usage or {}).get("completion_tokens")
        return ct if isinstance(ct, int) and not isinstance(ct, bool) else None

    def ok(self) -> bool:
        return self.wire.error is None and self.wire.status == 200

    def brief(self) -> str:
        if not self.ok():
            return self.wire.brief()
        return (
            f"{len(self.chunk_ns)} output chunks, usage completion_tokens={self.completion_tokens}, "
            f"finish_reason={self.finish_reason!r}"
        )


class LoopWatch:
    """The instants the client's event loop was free, noted by a task that wakes every millisecond.

    Used as ``async with LoopWatch() as watch:`` around the requests whose timing is
    judged; ``looks`` then holds one perf_counter_ns time per wake-up. A gap between
    looks much longer than the period is a stall of the client (the machine was busy,
    or a callback ran long): bytes that arrived during it were read at its end.
    """

    def __init__(self, period_s: float = 0.001) -> None:
        self.period_s = period_s
        self.looks: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopWatch:
        self.looks.append(time.perf_counter_ns())
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.looks.append(time.perf_counter_ns())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            self.looks.append(time.perf_counter_ns())
