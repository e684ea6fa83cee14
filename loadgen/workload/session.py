"""What the engine sends: sessions of turns, and the request body of each turn.

Every workload (single-shot chat, multi-turn chat, RAG, agentic, trace replay)
becomes a sequence of ``Session``s; a plain request is a session of one turn.
Within a session turns are closed-loop (turn k+1 is sent ``think_ns`` after
turn k's answer ended, with that answer appended to the context); across
sessions arrival is open-loop, from the schedule.

Tool calls: a session whose ``extra`` offers ``tools`` (the agentic workload's) gets
the answer's calls back (``ToolCall``, as the endpoint sent them: arguments are never
parsed). The next turn then appends the assistant message with those calls and one
``role: tool`` message per call (its ``tool_call_id`` the call's id, its content the
turn's tool result), then the turn's own ``follow_up`` text as a user message if it has
one. An answer without calls goes on as without tools: the tool result (and follow-up)
is a user message, since a bare ``tool`` role without a call to answer is refused by
servers that check the pairing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

__all__ = ["Turn", "Session", "ToolCall", "build_body", "Conversation", "right_sized"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session.

    ``text`` is what this turn appends to the context (a user message, or a tool
    result when ``role == "tool"``); ``follow_up`` a user message sent after the tool
    results (agentic specs' ``follow_up``; "" for none). ``prompt_tokens`` is the
    requested size of the whole prompt the endpoint will see for this turn, in the
    workload's tokenizer (for records: requested vs reported).
    """

    text: str
    max_tokens: int
    prompt_tokens: int = 0
    think_ns: int = 0
    role: str = "user"
    children: tuple[Session, ...] = ()  # subagent sessions run (concurrently) before this turn
    follow_up: str = ""
    # A pipeline's stage request (workload.rag_pipeline): its own API ("" = the run's), its stage's
    # name (the engine sends it to that stage's endpoint and model), and its own body fields. A
    # pooled stage (embeddings, rerank) is outside the conversation: it neither adds to the
    # context nor answers into it.
    api: str = ""
    stage: str = ""
    extra: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Session:
    session: int
    turns: tuple[Turn, ...]
    system: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # extra request-body fields
    # The run's salt at the very start of this session's context (its system prompt, else its
    # first turn): the engine leaves it out of the run's salt-free traffic fingerprint.
    salt: str = ""


class ToolCall(NamedTuple):
    """One tool call of an answer, as the endpoint sent it (bounded and cleaned by the tally)."""

    id: str
    name: str
    arguments: str  # the argument text as sent: passed back, never parsed

    def message(self) -> dict[str, Any]:
        """The call as an assistant message's ``tool_calls`` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class Conversation:
    """The growing context of one session: system prompt, turns and answers (see the module's note)."""

    __slots__ = ("messages", "_calls")

    def __init__(self, system: str | None) -> None:
        self.messages: list[dict[str, Any]] = []
        self._calls: tuple[ToolCall, ...] = ()  # the last answer's calls, answered by the next turn
        if system:
            self.messages.append({"role": "system", "content": system})

    def add_turn(self, turn: Turn) -> None:
        calls, self._calls = self._calls, ()
        if not calls:
            self.messages.append({"role": "user", "content": turn.text + turn.follow_up})
            return
        tool = turn.role == "tool"
        result = turn.text if tool else ""  # a user turn after calls: each call answered, empty
        for call in calls:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        own = turn.follow_up if tool else turn.text
        if own:
            self.messages.append({"role": "user", "content": own})

    def add_answer(self, text: str, calls: tuple[ToolCall, ...] = ()) -> None:
        """The answer: its text, or, when it called tools, the calls (content null)."""
        if calls:
            self.messages.append({"role": "assistant", "content": None, "tool_calls": [c.message() for c in calls]})
        else:
            self.messages.append({"role": "assistant", "content": text})
        self._calls = calls

    def prompt_text(self) -> str:
        return "".join(m["content"] or "" for m in self.messages)


def build_body(
    api: str,
    model: str,
    conv: Conversation,
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    extra: dict[str, Any] | None = None,
    continuous_usage: bool = False,
    max_tokens_field: str = "max_tokens",
) -> bytes:
    """The JSON body of a streaming request; usage is always asked for.

    ``stream_options`` is ``{"include_usage": true}``, plus ``"continuous_usage_stats": true``
    when ``continuous_usage`` (running usage on every chunk: vLLM's, which gives each chunk's
    exact token count). ``extra`` fields go in last and win, except that an ``extra``
    ``stream_options`` object is merged into loadgen's rather than replacing it, so setting
    one option there does not silently drop ``include_usage``; a key it names explicitly
    (``"include_usage": false``) still wins, and a ``stream_options`` that is not an object
    replaces loadgen's whole. ``max_tokens_field`` names the length field: ``max_tokens``,
    ``max_completion_tokens`` (newer OpenAI-style servers) or ``both``.

    The body is a ``bytes`` of its own size (``right_sized``): it lives as long as its request."""
    options: dict[str, Any] = {"include_usage": True}
    if continuous_usage:
        options["continuous_usage_stats"] = True
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": options,
    }
    if max_tokens_field != "max_completion_tokens":
        body["max_tokens"] = max_tokens
    if max_tokens_field != "max_tokens":
        body["max_completion_tokens"] = max_tokens
    if api == "chat":
        body["messages"] = conv.messages
    else:
        body["prompt"] = conv.prompt_text()
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
        asked = extra.get("stream_options")
        if isinstance(asked, dict):
            body["stream_options"] = {**options, **asked}
    return right_sized(orjson.dumps(body))


def right_sized(encoded: bytes) -> bytes:
    """``encoded`` in an allocation of its own size. orjson writes into a buffer it grows and
    trims, and the trimmed ``bytes`` keeps the whole buffer (~32 KB for a 2.6 KB body, as
    glibc's ``malloc_usable_size`` shows): held by each in-flight request, that was most of a
    stream's memory. A copy of a few KB costs well under a microsecond."""
    return bytes(memoryview(encoded))
