"""The request body of one turn in the Responses API's shape (``POST /v1/responses``).

``{"model", "input": [...], "stream": true, "max_output_tokens": N}``: the conversation so
far as input items, the turn's output budget as ``max_output_tokens`` (the Responses name
for ``max_tokens``; ``--max-tokens-field`` does not apply here), streamed.

What differs from chat (``session.build_body``):

- No ``stream_options``: the Responses API has none, and always puts the usage on its
  terminal event (``response.completed``), so usage needs no asking; and there is no
  running usage (vLLM's ``continuous_usage_stats``), so ``continuous_usage`` does not
  exist here.
- ``ignore_eos`` is not part of the Responses API; it goes in as for chat (on by default
  for synthetic traffic) because vLLM's ``/v1/responses`` takes its sampling extras, and a
  server that does not know it ignores it (or refuses it: then turn it off).
- The messages become input items: a ``{role, content}`` message is one as it is (system,
  user, assistant); an assistant message's ``tool_calls`` become ``function_call`` items and
  a ``role: tool`` message a ``function_call_output`` item, as the Responses API has them;
  ``tools`` given in the chat shape (``{"type": "function", "function": {...}}``) are
  flattened to its shape (``{"type": "function", "name", ...}``), and so is a named
  ``tool_choice``.

``extra`` fields go in last and win, as for chat.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["build_responses_body", "input_items", "responses_tool"]


def build_responses_body(
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """The JSON body of a streaming Responses request for ``messages`` (a
    ``Conversation.messages``), ``max_tokens`` as ``max_output_tokens``."""
    body: dict[str, Any] = {
        "model": model,
        "input": input_items(messages),
        "stream": True,
        "max_output_tokens": max_tokens,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
        tools = extra.get("tools")
        if isinstance(tools, list):
            body["tools"] = [responses_tool(t) for t in tools]
        choice = extra.get("tool_choice")
        if isinstance(choice, dict):
            body["tool_choice"] = responses_tool(choice)
    return orjson.dumps(body)


def input_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items (see the module's note)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id", ""), "output": _text(m)})
            continue
        calls = m.get("tool_calls")
        if m.get("content") or not calls:
            items.append({"role": role, "content": _text(m)})
        for call in calls or ():
            fn = call.get("function") or {}
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id", ""),
                    "name": fn.get("name", ""),
                    "arguments": fn.get("arguments", ""),
                }
            )
    return items


def responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat-shaped function tool (or named ``tool_choice``) flattened to the Responses
    shape; anything else (already flat, or another type) as it is."""
    fn = tool.get("function")
    if tool.get("type") != "function" or not isinstance(fn, dict):
        return tool
    return {"type": "function", **fn}


def _text(m: dict[str, Any]) -> str:
    content = m.get("content")
    return content if isinstance(content, str) else ""
