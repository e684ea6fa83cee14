"""Interpretation of one streamed Responses API answer (``POST /v1/responses``), as its bytes arrive.

The Responses API streams typed events, each an SSE event whose ``data`` is a JSON object
with a ``type`` (the ``event:`` line repeats it; the SSE parser ignores that line, and so
does this tally): ``response.created`` and ``response.in_progress`` first, then per output
item ``response.output_item.added`` and its deltas, and one terminal event,
``response.completed``, ``response.incomplete`` or ``response.failed``. There is no
``data: [DONE]``: the terminal event is the stream's end (``done``).

Which events carry output, by the same contract as chat (DESIGN.md, TTFT/ITL): a non-empty
``delta`` of ``response.output_text.delta`` or ``response.refusal.delta`` (visible content:
``t_first_content``), of ``response.reasoning_text.delta`` or
``response.reasoning_summary_text.delta`` (reasoning: output, not visible), or of
``response.function_call_arguments.delta`` (a tool call's arguments: output, not visible).
``response.output_item.added`` of a function call names the call (its name, empty
arguments): like a chat tool call's header, it carries nothing and starts nothing; when the
request offered tools (``capture_tool_calls``) it opens a captured call, which the argument
deltas and ``response.output_item.done`` fill (tool_calls.py). Every
other event (lifecycle, content parts, ``*.done`` events repeating the whole text) carries
nothing.

Counts: each output event is one token until ``reconcile`` spreads the final
``usage.output_tokens`` over them (``token_counts.reconcile``), or, with a tokenizer,
counts each event's text (chunk_texts.py), exactly as ``StreamTally`` does; there is no
running usage in the Responses API. The usage of the terminal event maps onto the chat
names the records use: ``input_tokens`` -> ``prompt_tokens``, ``output_tokens`` ->
``completion_tokens``, ``input_tokens_details.cached_tokens``,
``output_tokens_details.reasoning_tokens``; each range-checked
(``loadgen.untrusted.token_count``), an impossible one a line of ``problems``.

How it ends (``end``, records.STREAM_ENDS): ``"done"`` once a terminal event was seen
(``response.completed``: finish reason ``"stop"``, or ``"tool_calls"`` when the answer
was a function call; ``response.incomplete``: its ``incomplete_details.reason``, with
``max_output_tokens`` said as ``"length"``, the chat word for it); ``"eof"`` when the body
closed before one. ``"finish"`` cannot happen: the terminal event is the framing.
``response.failed`` and an ``error`` event raise ``StreamError`` with the server's message
and code, cleaned (chunk_errors.py). Events after the terminal one are not part of the
answer. The same bounds and lenient decoding as ``StreamTally`` apply.

The engine uses this where it uses ``StreamTally``: the same ``feed``, ``close``,
``reconcile`` and read-outs (``StreamState``). No byte template: an event of this API
carries a changing ``sequence_number`` before its text, so every event is decoded, which
costs a few microseconds per token (a Responses stream is not the hot path the chat tally's
templates are for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from loadgen.client.protocol.chunk_errors import check_error, loads_leniently, not_json, shape_error
from loadgen.client.protocol.sse import BadStream, SSEParser
from loadgen.client.protocol.stream_state import StreamState

if TYPE_CHECKING:
    from loadgen.workload.tokenizer import Tokenizer

__all__ = ["API", "ResponsesTally"]

API = "responses"

# The delta events that carry output, and whether theirs is visible content.
_OUTPUT: dict[str, bool] = {
    "response.output_text.delta": True,
    "response.refusal.delta": True,
    "response.reasoning_text.delta": False,
    "response.reasoning_summary_text.delta": False,
    "response.function_call_arguments.delta": False,
}
_COMPLETED, _INCOMPLETE, _FAILED = "response.completed", "response.incomplete", "response.failed"
_ADDED, _ITEM_DONE = "response.output_item.added", "response.output_item.done"
_ARGUMENTS = "response.function_call_arguments.delta"
# incomplete_details.reason as the records' finish_reason says it (the chat word where there is one)
_REASONS = {"max_output_tokens": "length"}
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


class ResponsesTally(StreamState):
    """Running tally of one streamed Responses API answer: output event times, counts, usage.

    ``feed(data, t_ns)`` per read, ``close()`` at end of body, then ``reconcile()``, as for
    ``StreamTally``; raises ``BadStream`` (``StreamError`` for ``response.failed`` or an
    ``error`` event) as soon as the stream stops making sense. ``api`` is accepted for the
    engine's one way of making a tally, and must be ``"responses"``.
    """

    __slots__ = ("_parser", "_called")

    def __init__(
        self,
        api: str = API,
        keep_text: bool = False,
        max_event_bytes: int = 1 << 20,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        if api != API:
            raise ValueError(f"a ResponsesTally reads api {API!r}, not {api!r}")
        # StreamState checks its api against the chat and completions names; it is given
        # "chat" and told the truth after (its chat flag only steers StreamTally's decoding).
        super().__init__("chat", keep_text, tokenizer)
        self.api = API
        self._chat = False
        self._parser = SSEParser(max_event_bytes)
        self._called = False  # the answer holds a function call: completed means "tool_calls"

    def feed(self, data: bytes, t_ns: int) -> None:
        """Interpret one read; every event it completes is stamped ``t_ns``."""
        self.t_read = t_ns
        if data:
            self._fed = True
        payloads = self._parser.feed(data)
        if payloads:
            self._take(payloads, t_ns)

    def close(self, t_ns: int | None = None) -> None:
        """End of body: interpret a final event that had no closing blank line (stamped
        ``t_ns``, else the last output event's time, or 0)."""
        payloads = self._parser.close()
        if payloads:
            if t_ns is None:
                t_ns = self._ns[-1] if self._ns else 0
            self._take(payloads, t_ns)

    def _take(self, payloads: list[bytes], t_ns: int) -> None:
        self.events += len(payloads)
        for payload in payloads:
            if self.done:
                return  # after the terminal event: not part of the answer
            obj = self._decode(payload)
            if obj is None:
                continue
            try:
                self._event(obj, t_ns)
            except (AttributeError, TypeError):
                raise BadStream(shape_error(obj, payload)) from None

    def _decode(self, payload: bytes) -> dict[str, Any] | None:
        """An event's object; None for one that carries nothing to decode (empty, ``[DONE]``)."""
        try:
            obj = _loads(payload)
        except _JSONDecodeError as e:
            stripped = payload.strip()
            if not stripped or stripped == b"[DONE]":  # not this API's, and nothing to fail over
                return None
            got = loads_leniently(payload, str(e))
            if got is None:
                raise not_json(payload) from None
            self._lenient = True
            for kind, message in got.problems:
                self._problems.flag(kind, message)
            obj = got.obj
        if type(obj) is not dict:
            raise BadStream(shape_error(obj, payload))
        return obj

    def _event(self, obj: dict[str, Any], t_ns: int) -> None:
        """Record what one event says (a non-dict where a dict belongs raises AttributeError)."""
        kind = obj.get("type")
        visible = _OUTPUT.get(kind) if type(kind) is str else None
        if visible is not None:
            delta = obj.get("delta")
            self._delta(delta, visible, t_ns)
            if kind == _ARGUMENTS and self._calls is not None and delta and type(delta) is str:
                self._calls.delta(obj, delta)
        elif kind == _ADDED or kind == _ITEM_DONE:
            item = obj.get("item")
            if item and item.get("type") == "function_call":
                self._called = True
                if self._calls is not None:
                    (self._calls.added if kind == _ADDED else self._calls.done)(obj, item)
        elif kind == _COMPLETED or kind == _INCOMPLETE:
            self._terminal(obj.get("response"), kind == _COMPLETED)
        elif kind == _FAILED:
            response = obj.get("response")
            err = response.get("error") if response else None
            check_error({"error": err or {"message": "response.failed without an error object"}})
        elif kind == "error":
            check_error({"error": obj})
        elif kind is None:
            if "error" in obj:  # a chat-style error object (a proxy's, say)
                check_error(obj)
            self._problems.flag("type", "an event without a type ignored")

    def _delta(self, delta: object, visible: bool, t_ns: int) -> None:
        if type(delta) is not str:
            if delta is not None:
                self._problems.flag("delta", f"a delta that is not a string ({type(delta).__name__}) ignored")
            return
        if not delta:
            return
        self._ns.append(t_ns)  # its count: 1 (StreamState)
        if visible and self.t_first_content is None:
            self.t_first_content = t_ns
        if self._collect:
            self._kept(delta)

    def _terminal(self, response: Any, completed: bool) -> None:
        """``response.completed`` or ``response.incomplete``: the usage, the finish reason, the end."""
        self.done = True
        response = response if type(response) is dict else {}
        usage = response.get("usage")
        if usage is not None:
            self._take_usage(usage)
        if completed:
            self._finish_reason("tool_calls" if self._called else "stop")
            return
        details = response.get("incomplete_details")
        reason = details.get("reason") if type(details) is dict else None
        self._finish_reason(_REASONS.get(reason, reason) if type(reason) is str else "incomplete")

    def _take_usage(self, usage: Any) -> None:
        if type(usage) is not dict:
            self._problems.flag("usage", "usage is not an object: ignored")
            return
        count, u = self._problems.count, self._usage
        n = count(usage.get("input_tokens"), "usage.input_tokens")
        if n is not None:
            u.prompt_tokens = n
        n = count(usage.get("output_tokens"), "usage.output_tokens")
        if n is not None:
            u.completion_tokens = n
        details = usage.get("input_tokens_details")
        if type(details) is dict and (n := count(details.get("cached_tokens"), "usage.cached_tokens")) is not None:
            u.cached_tokens = n
        details = usage.get("output_tokens_details")
        if (
            type(details) is dict
            and (n := count(details.get("reasoning_tokens"), "usage.reasoning_tokens")) is not None
        ):
            u.reasoning_tokens = n
