"""Answers that are tool calls: which requests get one, and the bytes each server shape sends.

A share of chat answers (``SimConfig.tool_calls``, 0..1) are a function call instead of
content. Which ones is a pure function of the request (its prompt, and its
``X-Loadgen-Seq`` number when the client sends one), so a run against the simulator
can be checked request by request. A request's ``tool_choice`` overrides the share:
``"none"`` never calls, ``"required"`` or a named function always does. The function is
the one ``tool_choice`` names, else the request's first tool, else ``lookup``.

The answer's words become the call's ``arguments``, one fragment per chunk (a fragment
is a token, or ``tokens_per_chunk`` tokens, of the answer, not JSON: the simulator says
words, and the count of argument tokens is what usage reports). The header that names
the call (id, type, function name, empty arguments) carries no generated text and costs
no token; it goes out with the role chunk, at receipt, which is the hardest case for a
client's time to first token.

Three shapes, as the servers send them (what each is, and where it comes from, is in
docs/simulator.md, "Tool calls"): ``vllm``, ``sglang`` (every absent field as an explicit
null) and ``llamacpp`` (a role chunk with ``content: null``). ``ToolShape`` holds the
byte pieces around the per-answer parts (the call's id and name, the argument text).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson

__all__ = ["TOOL_SHAPES", "ToolCall", "ToolShape", "SHAPES", "tool_call_for", "finish_reason_of", "header_bytes"]

TOOL_SHAPES = ("vllm", "sglang", "llamacpp")
_DEFAULT_NAME = "lookup"
_NAME_MAX = 64  # OpenAI's limit on a function name


class ToolShape(NamedTuple):
    """One server's tool-call stream, as byte pieces after ``"choices":[{"index":0,``.

    role: the whole first chunk's choice (role, no output); header_pre + id + header_mid +
    name + header_post: the header's choice; frag_pre + text + frag_mid: an argument
    fragment's choice (``frag_mid`` closes the choices array, so usage may follow);
    finish_pre + reason + finish_post: the finish chunk's choice."""

    role: bytes
    header_pre: bytes
    header_mid: bytes
    header_post: bytes
    frag_pre: bytes
    frag_mid: bytes
    finish_pre: bytes
    finish_post: bytes
    id_prefix: str
    id_hex: int  # hex digits of the id after its prefix
    always_tool_calls: bool  # finish "tool_calls" even when max_tokens cut the call (vLLM)


_NULLS = b'"role":null,"content":null,"reasoning_content":null,'
_SG_TAIL = b'},"logprobs":null,"finish_reason":null,"matched_stop":null}]'

SHAPES: dict[str, ToolShape] = {
    "vllm": ToolShape(
        role=b'"delta":{"role":"assistant","content":""},"finish_reason":null}]',
        header_pre=b'"delta":{"tool_calls":[{"id":',
        header_mid=b',"type":"function","index":0,"function":{"name":',
        header_post=b',"arguments":""}}]},"finish_reason":null}]',
        frag_pre=b'"delta":{"tool_calls":[{"index":0,"function":{"arguments":',
        frag_mid=b'}}]},"finish_reason":null}]',
        finish_pre=b'"delta":{},"finish_reason":"',
        finish_post=b'"}]',
        id_prefix="chatcmpl-tool-",
        id_hex=32,
        always_tool_calls=True,
    ),
    "sglang": ToolShape(
        role=b'"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null}'
        b',"logprobs":null,"finish_reason":null,"matched_stop":null}]',
        header_pre=b'"delta":{' + _NULLS + b'"tool_calls":[{"id":',
        header_mid=b',"index":0,"type":"function","function":{"name":',
        header_post=b',"arguments":""}}]' + _SG_TAIL,
        frag_pre=b'"delta":{' + _NULLS + b'"tool_calls":[{"id":null,"index":0,"type":"function",'
        b'"function":{"name":null,"arguments":',
        frag_mid=b"}}]" + _SG_TAIL,
        finish_pre=b'"delta":{' + _NULLS + b'"tool_calls":null},"logprobs":null,"finish_reason":"',
        finish_post=b'","matched_stop":null}]',
        id_prefix="call_",
        id_hex=24,
        always_tool_calls=False,
    ),
    "llamacpp": ToolShape(
        role=b'"delta":{"role":"assistant","content":null},"finish_reason":null}]',
        header_pre=b'"delta":{"tool_calls":[{"index":0,"id":',
        header_mid=b',"type":"function","function":{"name":',
        header_post=b',"arguments":""}}]},"finish_reason":null}]',
        frag_pre=b'"delta":{"tool_calls":[{"index":0,"function":{"arguments":',
        frag_mid=b'}}]},"finish_reason":null}]',
        finish_pre=b'"delta":{},"finish_reason":"',
        finish_post=b'"}]',
        id_prefix="",
        id_hex=32,
        always_tool_calls=False,
    ),
}


class ToolCall(NamedTuple):
    """The call one answer makes: its server shape, id and function name."""

    shape: ToolShape
    id: str
    name: str

    def to_json(self, arguments: str) -> dict[str, Any]:
        """The call in a whole (non-streamed) answer's message."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}}


def tool_call_for(
    body: dict[str, Any], prompt_ids: Sequence[int], seq: int, rid: str, share: float, shape: str
) -> ToolCall | None:
    """The tool call this chat request is answered with, or None (a content answer)."""
    choice = body.get("tool_choice")
    named = _named_choice(choice)
    if choice == "none":
        return None
    if named is None and choice != "required" and not _drawn(prompt_ids, seq, share):
        return None
    name = named or _first_tool(body.get("tools")) or _DEFAULT_NAME
    s = SHAPES[shape]
    digest = "".join(f"{zlib.crc32(f'{rid}/{i}'.encode()):08x}" for i in range((s.id_hex + 7) // 8))
    return ToolCall(s, s.id_prefix + digest[: s.id_hex], name)


def finish_reason_of(call: ToolCall, finish: str, stopped: bool = False) -> str:
    """The finish reason of a tool-call answer whose content answer would end with ``finish``
    ("stop" or "length"): "tool_calls" at the model's own end; at the max_tokens limit "length",
    except in vLLM's shape, which says "tool_calls" whenever a call was streamed; "stop" when a
    stop string cut it (``stopped``)."""
    if stopped:
        return "stop"
    if finish == "length" and not call.shape.always_tool_calls:
        return "length"
    return "tool_calls"


def _drawn(prompt_ids: Sequence[int], seq: int, share: float) -> bool:
    """Whether the share picks this request: a uniform draw seeded by its prompt and sequence number."""
    if share <= 0:
        return False
    if share >= 1:
        return True
    h = zlib.crc32(np.asarray(prompt_ids[-64:], dtype=np.int64).tobytes(), seq & 0xFFFFFFFF)
    return ((h * 2654435761) & 0xFFFFFFFF) / 2**32 < share


def _named_choice(choice: Any) -> str | None:
    """The function a ``tool_choice`` object names (``{"type": "function", "function": {"name": ...}}``)."""
    if isinstance(choice, dict):
        fn = choice.get("function")
        if isinstance(fn, dict):
            return _clean_name(fn.get("name"))
    return None


def _first_tool(tools: Any) -> str | None:
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        fn = tools[0].get("function")
        if isinstance(fn, dict):
            return _clean_name(fn.get("name"))
    return None


def _clean_name(name: Any) -> str | None:
    """A function name the answer may repeat: a short string of name characters, or None."""
    if not isinstance(name, str) or not name or len(name) > _NAME_MAX:
        return None
    return name if all(c.isalnum() or c in "_-." for c in name) and name.isascii() else None


def header_bytes(head: bytes, call: ToolCall, usage: bytes = b"") -> bytes:
    """The SSE event that names the call (no generated text)."""
    s = call.shape
    choice = s.header_pre + orjson.dumps(call.id) + s.header_mid + orjson.dumps(call.name) + s.header_post
    return b"data: " + head + b',"choices":[{"index":0,' + choice + usage + b"}\n\n"
