"""What the check reads off the socket: one HTTP exchange (``Wire``) and a streamed answer (``Stream``).

Kept apart from the battery (``loadgen.check``) so the verdicts can be tested on
hand-made exchanges without a socket: a ``Stream`` is read from a ``Wire``'s
timed reads by the same SSE parser and stream interpreter the engine uses,
strictly for the framing items and leniently (malformed events dropped) for
the rest, so one fault fails the item it concerns rather than every item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from loadgen.client.protocol.sse import BadStream, SSEParser
from loadgen.client.protocol.tally import StreamTally
from loadgen.conformance.ci_outputs import clip

__all__ = ["Wire", "Stream"]


@dataclass
class Wire:
    """One HTTP exchange as read off the socket: every read with its perf_counter_ns time."""

    status: int | None = None
    content_type: str = ""
    t_sent: int = 0
    t_done: int = 0
    reads: list[tuple[int, bytes]] = field(default_factory=list)
    error: str | None = None

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
