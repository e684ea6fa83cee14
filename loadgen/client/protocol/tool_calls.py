"""The tool calls of one streamed answer, captured as they arrive, for the next turn to send back.

Only when the request offered tools (``StreamState.capture_tool_calls``): the engine then
sends the assistant message with these calls and one ``role: tool`` message per call
(``workload.session.Conversation``), and the record counts them (``tool_calls``).

Chat (``choices[0].delta.tool_calls``): each entry belongs to the call its ``index`` names
(parallel calls have indexes 0, 1, ...); the first entry of a call carries its ``id``,
``type`` and ``function.name`` (vLLM, llama.cpp: with ``arguments: ""``; SGLang repeats
``id: null`` and ``name: null`` on every fragment), and later entries append
``function.arguments`` fragments. An entry without an integer index (a server that sends
each whole call in one delta) is a new call when it brings a new id, else the latest one's.
Responses API: ``response.output_item.added`` of a ``function_call`` item opens a call
(its ``call_id`` and ``name``), ``response.function_call_arguments.delta`` appends to the
call of its ``output_index`` (or ``item_id``), and ``response.output_item.done`` gives the
whole arguments where no fragment came.

What the endpoint sent is untrusted, and goes back to it: an id and a name are
``clean_text``'d (a call without an id gets ``call_<n>``, so its tool message still pairs
with it); the argument text is kept as sent, never parsed (the simulator's are plain words,
not JSON), except that lone surrogates (a leniently read ``"\\ud800"``) become ``?`` so it
can be encoded again (as in the kept text), and it is bounded: ``MAX_CALLS`` calls, ``MAX_ARGUMENT_CHARS`` per
call. Each bound hit is one line of the tally's ``problems``.
"""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.client.protocol.usage import Problems
from loadgen.untrusted import clean_text
from loadgen.workload.session import ToolCall

__all__ = ["CallCapture", "MAX_CALLS", "MAX_ARGUMENT_CHARS", "MAX_ID_CHARS"]

MAX_CALLS = 64  # calls kept per answer
MAX_ARGUMENT_CHARS = 1 << 16  # argument text kept per call
MAX_ID_CHARS = 128  # an id or a function name, as kept


class _Call:
    __slots__ = ("id", "name", "parts", "size")

    def __init__(self, call_id: str) -> None:
        self.id = call_id
        self.name = ""
        self.parts: list[str] = []
        self.size = 0


class CallCapture:
    """The calls of one answer so far; ``calls()`` gives them as ``ToolCall``s, in order."""

    __slots__ = ("_calls", "_by_key", "_problems")

    def __init__(self, problems: Problems) -> None:
        self._calls: list[_Call] = []
        self._by_key: dict[object, _Call] = {}  # a chat index, or a Responses output index or item id
        self._problems = problems

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(_whole(c, i) for i, c in enumerate(self._calls))

    def __len__(self) -> int:
        return len(self._calls)

    # -- chat ---------------------------------------------------------------------
    def chat(self, entries: Any) -> None:
        """The ``tool_calls`` entries of one chat delta."""
        if type(entries) is not list:
            return
        for entry in entries:
            if type(entry) is not dict:
                continue
            index, call_id = entry.get("index"), entry.get("id")
            if type(index) is int:
                key: object = ("index", index)
                call = self._by_key.get(key) or self._open(key, call_id)
            elif self._calls and not (call_id and call_id != self._calls[-1].id):
                call = self._calls[-1]
            else:
                call = self._open(None, call_id)
            if call is None:
                continue
            if call_id and not call.id:
                call.id = _clean(call_id)
            fn = entry.get("function")
            if type(fn) is dict:
                self._name(call, fn.get("name"))
                self._add(call, fn.get("arguments"))

    # -- Responses API --------------------------------------------------------------
    def added(self, obj: dict[str, Any], item: dict[str, Any]) -> None:
        """``response.output_item.added`` of a function call: a call opens."""
        call = self._open(_key(obj, item.get("id")), item.get("call_id") or item.get("id"))
        if call is not None:
            self._by_key.setdefault(("item", item.get("id")), call)
            self._name(call, item.get("name"))
            self._add(call, item.get("arguments"))

    def delta(self, obj: dict[str, Any], text: str) -> None:
        """``response.function_call_arguments.delta``: a fragment of its call's arguments."""
        call = self._by_key.get(_key(obj, obj.get("item_id"))) or self._by_key.get(("item", obj.get("item_id")))
        if call is None:  # no item was announced: a call of its own
            call = self._open(_key(obj, obj.get("item_id")), obj.get("item_id"))
        if call is not None:
            self._add(call, text)

    def done(self, obj: dict[str, Any], item: dict[str, Any]) -> None:
        """``response.output_item.done`` of a function call: its whole arguments, if none came before."""
        call = self._by_key.get(_key(obj, item.get("id"))) or self._by_key.get(("item", item.get("id")))
        if call is None:
            self.added(obj, item)
        elif not call.size:
            self._add(call, item.get("arguments"))

    # -- shared ---------------------------------------------------------------------
    def _open(self, key: object, call_id: object) -> _Call | None:
        if len(self._calls) >= MAX_CALLS:
            self._problems.flag("tool_calls", f"more than {MAX_CALLS} tool calls in one answer: the rest not kept")
            return None
        call = _Call(_clean(call_id) if call_id else "")
        self._calls.append(call)
        if key is not None:
            self._by_key[key] = call
        return call

    def _name(self, call: _Call, name: object) -> None:
        if name and type(name) is str and not call.name:
            call.name = _clean(name)

    def _add(self, call: _Call, args: object) -> None:
        if not args:
            return
        if type(args) is not str:  # an object, from some servers: its JSON text
            try:
                args = orjson.dumps(args).decode()
            except TypeError:
                return
        assert isinstance(args, str)
        room = MAX_ARGUMENT_CHARS - call.size
        if len(args) > room:
            self._problems.flag(
                "tool_arguments", f"tool-call arguments over {MAX_ARGUMENT_CHARS:,} characters: cut there"
            )
            args = args[:room]
        if args:
            call.parts.append(args)
            call.size += len(args)


def _key(obj: dict[str, Any], item_id: object) -> object:
    """A Responses call's key: its output index, else its item id."""
    index = obj.get("output_index")
    return ("output", index) if type(index) is int else ("item", item_id)


def _clean(value: object) -> str:
    return clean_text(value, MAX_ID_CHARS) if type(value) is str else ""


def _whole(c: _Call, i: int) -> ToolCall:
    """A captured call as sent back: an id it can be answered by, its text encodable."""
    args = "".join(c.parts)
    if not args.isascii():  # a lone surrogate cannot be encoded, so not sent again
        args = args.encode("utf-8", "replace").decode()
    return ToolCall(c.id or f"call_{i}", c.name, args)
