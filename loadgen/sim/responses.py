"""The simulator's Responses API (``POST /v1/responses``): what a request says, and the events of its answer.

The same answer as chat (server.py: the same timing model, length, words, stop strings,
faults and tool-call draw), in the Responses shapes as OpenAI documents them: streamed,
``response.created`` and ``response.in_progress`` at receipt, then the output item
(``response.output_item.added``, and for a message ``response.content_part.added``), one
``response.output_text.delta`` per chunk of tokens (for a tool call,
``response.function_call_arguments.delta``), then the item's ``*.done`` events and the
terminal event with the usage: ``response.completed``, or ``response.incomplete`` with
``incomplete_details.reason = "max_output_tokens"`` when the budget cut the answer. Every
event has its ``event:`` line and a ``sequence_number`` counting from 0; there is no
``[DONE]``. Unstreamed, the whole ``response`` object. No ``stream_options``, so no
continuous usage.

A tool call is a ``function_call`` output item: its header (name, empty arguments) goes
out with ``response.output_item.added``, at receipt, and the answer's words are its
argument deltas, as in chat.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from loadgen.sim.answer import SseFrames
from loadgen.sim.tool_calls import ToolCall

__all__ = ["ResponsesFrames", "chat_view", "prompt_text", "response_object", "usage_of"]


def prompt_text(body: dict[str, Any]) -> str:
    """The text of a request's ``instructions`` and ``input`` (a string, or a list of
    messages, each with a string content or a list of parts with ``text``, and of
    function-call items); KeyError, TypeError or AttributeError when it is not well-formed."""
    given = body["input"]
    parts = [str(body.get("instructions") or "")]
    if isinstance(given, str):
        parts.append(given)
    else:
        for item in given:
            content = item.get("content", item.get("output", item.get("arguments", "")))
            if isinstance(content, str):
                parts.append(content)
            else:
                parts.extend(str(p.get("text") or "") for p in content)
    return "".join(parts)


def chat_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request's ``tools`` and ``tool_choice`` in the chat shape that
    ``tool_calls.tool_call_for`` reads (a Responses function tool is flat: ``{"type", "name"}``)."""

    def nested(t: Any) -> Any:
        if isinstance(t, dict) and t.get("type") == "function" and "name" in t and "function" not in t:
            return {"type": "function", "function": {"name": t["name"]}}
        return t

    tools = body.get("tools")
    return {
        "tools": [nested(t) for t in tools] if isinstance(tools, list) else tools,
        "tool_choice": nested(body.get("tool_choice")),
    }


def usage_of(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """The Responses usage for the chat usage the server computed (``Replies.usage``)."""
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


class ResponsesFrames(SseFrames):
    """The events of one streamed Responses answer, for ``StreamWriter`` (which asks for each
    chunk's event with ``token``) and for the handler (``opening``, ``closing``).

    Each event carries the next ``sequence_number``, so a token's event is not fixed bytes
    around its text: the writer's fast path, which writes ``pre + text + mid`` itself, must
    be off for these frames (the handler sets ``StreamWriter.fast = False``)."""

    __slots__ = ("seq", "rid", "item_id", "call", "created", "model_name", "d_pre", "d_mid", "d_post")

    def __init__(self, rid: str, model: str, call: ToolCall | None) -> None:
        super().__init__(rid, model, chat=True, tool=None)
        self.seq = 0
        self.rid, self.call, self.model_name = f"resp_{rid}", call, model
        self.created = int(time.time())
        kind = "function_call_arguments" if call is not None else "output_text"
        self.item_id = f"fc_{rid}" if call is not None else f"msg_{rid}"
        self.d_pre = b'event: response.%b.delta\ndata: {"type":"response.%b.delta","sequence_number":' % (
            kind.encode(),
            kind.encode(),
        )
        part = b"" if call is not None else b'"content_index":0,'
        self.d_mid = b',"item_id":' + orjson.dumps(self.item_id) + b',"output_index":0,' + part + b'"delta":'
        self.d_post = b"}\n\n" if call is not None else b',"logprobs":[]}\n\n'

    def token(self, text_json: bytes, usage: bytes = b"") -> bytes:
        """One chunk's delta event (``usage`` is never given: no continuous usage here)."""
        self.seq += 1
        return b"%b%d%b%b%b" % (self.d_pre, self.seq - 1, self.d_mid, text_json, self.d_post)

    def event(self, obj: dict[str, Any]) -> bytes:
        """One event: its ``event:`` line and its data, with the next sequence number."""
        obj["sequence_number"] = self.seq
        self.seq += 1
        return b"event: " + str(obj["type"]).encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"

    def item(self, text: str, status: str) -> dict[str, Any]:
        """The output item, as it stands: a function call with its arguments, or a message."""
        if self.call is not None:
            return {
                "type": "function_call",
                "id": self.item_id,
                "call_id": self.call.id,
                "name": self.call.name,
                "arguments": text,
                "status": status,
            }
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text else []
        return {"type": "message", "id": self.item_id, "role": "assistant", "status": status, "content": content}

    def opening(self) -> bytes:
        """What goes out at receipt: created, in progress, the item added (a call's header), its part."""
        progress = response_object(self, [], "in_progress", None, None)
        out = [
            self.event({"type": "response.created", "response": progress}),
            self.event({"type": "response.in_progress", "response": progress}),
            self.event({"type": "response.output_item.added", "output_index": 0, "item": self.item("", "in_progress")}),
        ]
        if self.call is None:
            out.append(self.event({"type": "response.content_part.added", **self._part("")}))
        return b"".join(out)

    def closing(self, text: str, length: bool, usage: dict[str, Any]) -> bytes:
        """The item's done events and the terminal event (incomplete when the budget cut it)."""
        status = "incomplete" if length else "completed"
        where = {"item_id": self.item_id, "output_index": 0}
        if self.call is not None:
            out = [self.event({"type": "response.function_call_arguments.done", **where, "arguments": text})]
        else:
            out = [
                self.event(
                    {"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []}
                ),
                self.event({"type": "response.content_part.done", **self._part(text)}),
            ]
        item = self.item(text, status)
        out.append(self.event({"type": "response.output_item.done", "output_index": 0, "item": item}))
        final = response_object(self, [item], status, usage, "max_output_tokens" if length else None)
        out.append(self.event({"type": f"response.{status}", "response": final}))
        return b"".join(out)

    def _part(self, text: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0, "part": part}


def response_object(
    frames: ResponsesFrames, output: list[dict[str, Any]], status: str, usage: dict[str, Any] | None, cut: str | None
) -> dict[str, Any]:
    """The ``response`` object: in the created and terminal events, and as a whole answer."""
    return {
        "id": frames.rid,
        "object": "response",
        "created_at": frames.created,
        "model": frames.model_name,
        "status": status,
        "output": output,
        "usage": usage,
        "incomplete_details": {"reason": cut} if cut else None,
        "error": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
