"""What the engine sends: sessions of turns, and the request body of each turn.

Every workload (single-shot chat, multi-turn chat, RAG, agentic, trace replay)
becomes a sequence of ``Session``s; a plain request is a session of one turn.
Within a session turns are closed-loop (turn k+1 is sent ``think_ns`` after
turn k's answer ended, with that answer appended to the context); across
sessions arrival is open-loop, from the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["Turn", "Session", "build_body", "Conversation"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session.

    ``text`` is what this turn appends to the context (a user message, or a tool
    result when ``role == "tool"``). ``prompt_tokens`` is the requested size of
    the whole prompt the endpoint will see for this turn, in the workload's
    tokenizer (for records: requested vs reported).
    """

    text: str
    max_tokens: int
    prompt_tokens: int = 0
    think_ns: int = 0
    role: str = "user"
    children: tuple[Session, ...] = ()  # subagent sessions run (concurrently) before this turn


@dataclass(frozen=True, slots=True)
class Session:
    session: int
    turns: tuple[Turn, ...]
    system: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # extra request-body fields
    # The run's salt at the very start of this session's context (its system prompt, else its
    # first turn): the engine leaves it out of the run's salt-free traffic fingerprint.
    salt: str = ""


class Conversation:
    """The growing context of one session: system prompt, turns and answers."""

    __slots__ = ("messages",)

    def __init__(self, system: str | None) -> None:
        self.messages: list[dict[str, str]] = []
        if system:
            self.messages.append({"role": "system", "content": system})

    def add_turn(self, turn: Turn) -> None:
        # A tool result is sent as a user message: not every server accepts a bare
        # "tool" role without a matching tool_call id, and the prefix is the same.
        self.messages.append({"role": "user", "content": turn.text})

    def add_answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def prompt_text(self) -> str:
        return "".join(m["content"] for m in self.messages)


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
    ``max_completion_tokens`` (newer OpenAI-style servers) or ``both``."""
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
    return orjson.dumps(body)
