"""What one choice of a streamed chunk carries: output, visible content, its finish reason.

The rules are the TTFT/ITL contract of DESIGN.md: a chat delta carries output when it
has generated text, that is non-empty ``content``, ``reasoning_content`` or
``reasoning``, or a tool call's arguments fragment. A tool call's header (id, type,
name, ``arguments: ""``) is not generated text: several servers send it with the
role, at receipt. Of that output only ``content`` is visible content (what
``t_first_content`` times); reasoning is output but not visible.

Apart from the tally (tally.py), which calls these only off its fastest path (a
content delta when no text is kept is decided inline there), so each rule reads on
its own and is pinned by the stream tests.
"""

from __future__ import annotations

from typing import Any

from loadgen.client.protocol.usage import Problems
from loadgen.untrusted import MAX_TEXT_CHARS, clean_text

__all__ = ["NONE", "OUTPUT", "VISIBLE", "carried", "finish_reason", "tool_text"]

NONE, OUTPUT, VISIBLE = 0, 1, 2  # what a delta carries, ordered: a chunk carries the most of its choices'


def carried(delta: dict[str, Any], parts: list[str] | None) -> int:
    """What a chat delta carries (``NONE``, ``OUTPUT`` or ``VISIBLE``); its text is
    appended to ``parts`` (reasoning, content, tool arguments) unless that is None."""
    content = delta.get("content")
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    tools = delta.get("tool_calls")
    args = tool_text(tools) if tools else None
    if not (content or reasoning or args is not None):
        return NONE
    if parts is not None:
        for piece in (reasoning, content, args):
            if piece and type(piece) is str:
                parts.append(piece)
    return VISIBLE if content else OUTPUT


def tool_text(tools: Any) -> str | None:
    """Argument text of the tool-call deltas in a chunk, or None if none is output.

    Only an arguments fragment is output; a call whose arguments are not a string
    (an object, from some servers) is output without text.
    """
    if type(tools) is not list:
        return None
    text: str | None = None
    for call in tools:
        fn = call.get("function") if type(call) is dict else None
        if type(fn) is not dict:
            continue
        args = fn.get("arguments")
        if args:
            text = (text or "") + (args if type(args) is str else "")
    return text


def finish_reason(fr: object, problems: Problems) -> str:
    """A finish reason as kept: one clean short line, whatever was sent; one that is
    not a string is also a problem. Costs O(MAX_TEXT_CHARS) however long it is."""
    if type(fr) is str:
        # "stop", "length", "tool_calls": an ASCII identifier is its own clean text
        if len(fr) <= MAX_TEXT_CHARS and fr.isascii() and fr.isidentifier():
            return fr
        return clean_text(fr)
    kept = clean_text(fr) if type(fr) in (int, float, bool) else type(fr).__name__
    what = kept if type(fr) in (int, float, bool) else f"a JSON {kept}"
    problems.flag("finish_reason", f"finish_reason is not a string ({what})")
    return kept
