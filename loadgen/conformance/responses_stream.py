"""What the check reads off a streamed Responses API answer: its typed events, as the audit needs them.

A ``ResponsesStream`` is a ``Stream`` (exchange.py) of the Responses API, so the verdicts
on token counts and timing (check_tokens, check_items.real_streaming) read it as they read
a chat stream: its ``tally`` is the engine's own ``ResponsesTally`` (output events, text,
usage, how it ended), fed the timed reads leniently; fed strictly first, its error is the
framing verdict's ``strict_error``. Beside that, the events are read field by field here,
because the audit needs what the engine's SSE parser ignores: each event's ``event:``
line, next to its ``data``'s ``type`` and ``sequence_number``.

What it keeps, for the verdicts (check_responses.py): every event's time, ``event:`` name
and object (``events``); the terminal events (``response.completed``, ``.incomplete``,
``.failed``) by index; the events after the first of them (a ``data: [DONE]`` there
counted apart: not this API's, and harmless to the official client); the output deltas
of each text part and function call, and the whole text or arguments their ``.done``
events and ``response.output_item.done`` repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from loadgen.client.protocol.responses import ResponsesTally
from loadgen.client.protocol.sse import BadStream
from loadgen.conformance.exchange import Stream, Wire
from loadgen.untrusted import token_count

__all__ = ["Event", "ResponsesStream", "TERMINAL", "OUTPUT_DELTAS", "read_responses"]

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
# The delta events that carry generated output (the tally's rule: responses.py).
OUTPUT_DELTAS = (
    "response.output_text.delta",
    "response.refusal.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
)
_TEXT_DELTA, _TEXT_DONE = "response.output_text.delta", "response.output_text.done"
_ARGS_DELTA, _ARGS_DONE = "response.function_call_arguments.delta", "response.function_call_arguments.done"
_ITEM_DONE = "response.output_item.done"


@dataclass
class Event:
    """One SSE event: when it was read, its ``event:`` field (None without one), its data decoded."""

    t: int
    name: str | None
    obj: Any


@dataclass
class ResponsesStream(Stream):
    """A streamed Responses answer (see the module). ``usage`` is the terminal event's
    ``response.usage``; ``texts`` / ``args``: the deltas joined per text part / function
    call, keyed by (item_id or output_index, content_index); ``text_done`` / ``args_done``:
    what the ``.done`` events said of each; ``items_done``: the items of
    ``response.output_item.done``, by item key."""

    events: list[Event] = field(default_factory=list)
    terminal: list[int] = field(default_factory=list)
    done_markers: int = 0
    texts: dict[tuple[object, object], str] = field(default_factory=dict)
    args: dict[tuple[object, object], str] = field(default_factory=dict)
    text_done: dict[tuple[object, object], object] = field(default_factory=dict)
    args_done: dict[tuple[object, object], object] = field(default_factory=dict)
    items_done: dict[object, Any] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int | None:
        """usage.output_tokens, when it is a possible token count."""
        return token_count((self.usage or {}).get("output_tokens"), "usage.output_tokens")[0]

    @property
    def prompt_tokens(self) -> int | None:
        return token_count((self.usage or {}).get("input_tokens"), "usage.input_tokens")[0]

    @property
    def after_terminal(self) -> list[Event]:
        """The events after the first terminal one (``[DONE]`` markers not among them)."""
        return self.events[self.terminal[0] + 1 :] if self.terminal else []

    @property
    def final(self) -> dict[str, Any] | None:
        """The first terminal event's object, if any."""
        obj = self.events[self.terminal[0]].obj if self.terminal else None
        return obj if isinstance(obj, dict) else None

    def brief(self) -> str:
        if not self.ok():
            return self.wire.brief()
        final = self.final
        end = final.get("type") if final else "no terminal event"
        return f"{len(self.chunk_ns)} output deltas, usage output_tokens={self.completion_tokens}, ended {end!r}"


def read_responses(wire: Wire) -> ResponsesStream:
    """The answer ``wire`` read: strictly by the tally for framing, leniently for the rest."""
    s = ResponsesStream(wire, "responses")
    strict = ResponsesTally()
    lenient = ResponsesTally(keep_text=True)
    s.tally = lenient
    try:
        for t, data in wire.reads:
            strict.feed(data, t)
        strict.close(wire.t_done)
    except BadStream as e:
        s.strict_error = wire.text(e)
    fields = _Fields()
    for t, data in wire.reads:
        for name, payload in fields.feed(data):
            s_event(s, t, name, payload, lenient)
    for name, payload in fields.close():
        s_event(s, wire.t_done, name, payload, lenient)
    return s


def s_event(s: ResponsesStream, t: int, name: str | None, payload: bytes, lenient: ResponsesTally) -> None:
    """Take one event of ``s``: decode it, note what the audit needs, feed the lenient tally."""
    if payload.strip() == b"[DONE]":
        s.done_markers += 1
        return
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        s.bad_events.append(payload[:80])
        return
    s.objects.append(obj)
    s.events.append(Event(t, name, obj))
    kind = obj.get("type") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or not isinstance(kind, str):
        return
    if kind in TERMINAL:
        s.terminal.append(len(s.events) - 1)
        response = obj.get("response")
        if len(s.terminal) == 1 and isinstance(response, dict) and isinstance(response.get("usage"), dict):
            s.usage = response["usage"]
    elif kind in OUTPUT_DELTAS:
        delta = obj.get("delta")
        if isinstance(delta, str):
            s.gen_ns.append(t)
            if kind == _TEXT_DELTA:
                s.texts[_key(obj)] = s.texts.get(_key(obj), "") + delta
            elif kind == _ARGS_DELTA:
                s.args[_key(obj)] = s.args.get(_key(obj), "") + delta
    elif kind == _TEXT_DONE:
        s.text_done[_key(obj)] = obj.get("text")
    elif kind == _ARGS_DONE:
        s.args_done[_key(obj)] = obj.get("arguments")
    elif kind == _ITEM_DONE:
        item = obj.get("item")
        if isinstance(item, dict):
            s.items_done[item.get("id", obj.get("output_index"))] = item
    if s.interp_error is None:  # the tally itself reads nothing after the terminal event
        try:
            lenient.feed(b"data: " + payload + b"\n\n", t)
        except BadStream as e:
            s.interp_error = s.wire.text(e)


def _key(obj: dict[str, Any]) -> tuple[object, object]:
    """The part an event belongs to: its item (by id, else output index) and content index."""
    item = obj.get("item_id", obj.get("output_index"))
    return (item if isinstance(item, str | int) else None, obj.get("content_index"))


class _Fields:
    """SSE events field by field (WHATWG: LF, CRLF or CR line ends, ``:`` comments, ``data``
    lines joined with LF, a space after the colon dropped): (``event`` or None, ``data``) per
    event that has data. Reads only what the check already read, up to its cap."""

    def __init__(self) -> None:
        self._buf = b""
        self._name: str | None = None
        self._data: list[bytes] = []
        self._started = False
        self._skip_lf = False  # the last read ended in a CR: an LF first in the next is its CRLF's

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        if self._skip_lf and data.startswith(b"\n"):
            data = data[1:]
        if data:
            self._skip_lf = data.endswith(b"\r")
        buf = self._buf + data
        if not self._started and len(buf) >= 3:
            self._started = True
            buf = buf[3:] if buf.startswith(b"\xef\xbb\xbf") else buf
        lines = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._buf = lines.pop()
        out: list[tuple[str | None, bytes]] = []
        for line in lines:
            self._line(line, out)
        return out

    def close(self) -> list[tuple[str | None, bytes]]:
        out: list[tuple[str | None, bytes]] = []
        rest, self._buf = self._buf, b""
        if rest:
            self._line(rest, out)
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[tuple[str | None, bytes]]) -> None:
        if not line:
            if self._data:
                out.append((self._name, b"\n".join(self._data)))
            self._name, self._data = None, []
            return
        if line.startswith(b":"):
            return
        key, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if key == b"data":
            self._data.append(value)
        elif key == b"event":
            self._name = value.decode("utf-8", "replace")
