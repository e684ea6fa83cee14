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

Everything here that becomes text (``brief``, parse errors) is the endpoint's and may
echo the run's secrets: it passes through the run's ``Secrets`` and ``clean_text``.
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
from loadgen.client.protocol.tallies import Tally
from loadgen.client.protocol.tally import StreamTally
from loadgen.redaction import Secrets
from loadgen.untrusted import clean_text, token_count

__all__ = ["Wire", "Stream", "LoopWatch"]


@dataclass
class Wire:
    """One HTTP exchange as read off the socket: every read with its perf_counter_ns time.

    ``looks``: instants (perf_counter_ns) at which the client's event loop was free
    during the exchange, from a ``LoopWatch``; empty when it was not watched.
    ``content_encoding``: the answer's Content-Encoding (the check asks ``identity``).
    ``secrets``: the run's, removed from every text made of what the endpoint sent.
    """

    status: int | None = None
    content_type: str = ""
    t_sent: int = 0
    t_done: int = 0
    reads: list[tuple[int, bytes]] = field(default_factory=list)
    error: str | None = None
    looks: list[int] = field(default_factory=list)
    content_encoding: str = ""
    secrets: Secrets = field(default_factory=Secrets)

    def text(self, value: object, limit: int = 160) -> str:
        """``value`` (endpoint text) with the run's secrets removed, as one clean line of ``limit``."""
        return clean_text(self.secrets.redact(str(value)), limit)

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
        return f"HTTP {self.status}: {self.excerpt()}"

    def excerpt(self, limit: int = 160) -> str:
        """The start of the body, as clean text without secrets."""
        return self.text(self.body[: 8 * limit].decode("utf-8", "replace"), limit)


@dataclass
class Stream:
    """A streamed answer: strict framing verdict plus a lenient reading of its JSON events.

    ``chunk_ns``: when each chunk carrying visible output was read (the engine's rule);
    ``gen_ns``: when each chunk that generated was read, visible or not: a choice with
    content (even ``""``), reasoning, tool-call argument fragments or text, other than the
    role chunk, a finish-only chunk and a tool call's header (its id and name alone). A
    server can stream tokens whose text is empty (vLLM with random weights does), which
    usage counts: ``token_ns`` judges timing by them then.
    """

    wire: Wire
    api: str
    strict_error: str | None = None
    done: bool = False
    after_done: int = 0
    bad_events: list[bytes] = field(default_factory=list)
    objects: list[Any] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    tally: Tally | None = None  # a ResponsesTally for a Responses stream (responses_stream.py)
    interp_error: str | None = None
    gen_ns: list[int] = field(default_factory=list)

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
            s.strict_error = wire.text(e)
        events: list[tuple[int, bytes]] = []
        try:
            for t, data in wire.reads:
                events += [(t, p) for p in parser.feed(data)]
            events += [(wire.t_done, p) for p in parser.close()]
        except BadStream as e:
            s.strict_error = s.strict_error or wire.text(e)
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
        if _generated(obj, self.api):
            self.gen_ns.append(t)
        if self.interp_error is None:
            try:
                lenient.feed(b"data: " + payload + b"\n\n", t)
            except BadStream as e:
                self.interp_error = self.wire.text(e)

    @property
    def text(self) -> str:
        return self.tally.text if self.tally else ""

    @property
    def chunk_ns(self) -> list[int]:
        return self.tally.chunk_ns if self.tally else []

    @property
    def token_ns(self) -> list[int]:
        """The token arrivals the timing items judge: the visible output chunks, unless usage
        says more tokens were generated than those and chunks without visible text carried
        them (each generated chunk then counts, empty or not)."""
        ct, visible = self.completion_tokens or 0, self.chunk_ns
        if ct > len(visible) and len(self.gen_ns) > len(visible):
            return self.gen_ns
        return visible

    @property
    def finish_reason(self) -> str | None:
        fr = self.tally.finish_reason if self.tally else None
        return None if fr is None else self.wire.text(fr, 40)

    @property
    def completion_tokens(self) -> int | None:
        """usage.completion_tokens, when it is a possible token count."""
        return token_count((self.usage or {}).get("completion_tokens"), "usage.completion_tokens")[0]

    @property
    def prompt_tokens(self) -> int | None:
        return token_count((self.usage or {}).get("prompt_tokens"), "usage.prompt_tokens")[0]

    def ok(self) -> bool:
        return self.wire.error is None and self.wire.status == 200

    def brief(self) -> str:
        if not self.ok():
            return self.wire.brief()
        return (
            f"{len(self.chunk_ns)} output chunks, usage completion_tokens={self.completion_tokens}, "
            f"finish_reason={self.finish_reason!r}"
        )


_TEXTS = ("content", "reasoning_content", "reasoning")


def _generated(obj: Any, api: str) -> bool:
    """Whether a chunk carries a generated token, visible or not (see ``Stream``). A tool call
    generates its argument fragments; a delta that only names one (id, type, function name,
    arguments "") generates nothing, as the engine counts it (docs/metrics.md)."""
    choices = obj.get("choices") if isinstance(obj, dict) else None
    for ch in choices if isinstance(choices, list) else ():
        if not isinstance(ch, dict):
            continue
        if api != "chat":
            if "text" in ch and (ch.get("text") or ch.get("finish_reason") is None):
                return True
            continue
        delta = ch.get("delta")
        if not isinstance(delta, dict):
            continue
        if any(delta.get(k) for k in _TEXTS) or _arguments(delta.get("tool_calls")):
            return True
        # "" or null: a token without visible text, unless this is the role chunk (no token yet)
        # or the finish chunk
        if delta.get("role") is None and ch.get("finish_reason") is None and any(k in delta for k in _TEXTS):
            return True
    return False


def _arguments(calls: Any) -> bool:
    """Some tool call of the delta carries an argument fragment (text, not just a name)."""
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str) and fn["arguments"]:
            return True
    return False


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
