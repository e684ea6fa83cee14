"""``loadgen check --api responses``: the battery for the Responses API (``POST /v1/responses``).

The same discipline as the chat battery (check.py, which runs this one in its place when
``CheckOptions.api`` is ``"responses"``): small requests, each item pass / warn / fail /
skip with evidence, levels in ``check_items.LEVELS``, everything the endpoint sends
untrusted and without the check's secrets. The items are ``check_items.RESPONSES_ITEMS``:

- the request is loadgen's own (``workload.responses_body``): ``input`` items,
  ``max_output_tokens``, ``stream: true``; an endpoint that refuses it fails the framing;
- the answer's events (responses_items.py): well-formed, typed, named by their ``event:``
  line, numbered from 0, one terminal event last; usage on that event, honest against the
  output deltas (check_tokens, by chunks or ``--tokenizer``) and within
  ``max_output_tokens``; the ``.done`` texts and arguments equal to the deltas joined
  (the arguments from a second request that asks for a function call with
  ``tool_choice: "required"``);
- the official client's own reading of a stream (openai_client.py);
- real streaming, measured alone and once more short of pass, as for chat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from loadgen.client.endpoint import endpoint_path
from loadgen.client.endpoint_options import EndpointOptions
from loadgen.conformance.check_items import RESPONSES_ITEMS, UNKNOWN_MODEL, error_shape, item_case, real_streaming
from loadgen.conformance.check_tokens import max_tokens, usage_matches
from loadgen.conformance.ci_outputs import Case
from loadgen.conformance.exchange import Stream, Wire
from loadgen.conformance.openai_client import openai_responses_item
from loadgen.conformance.responses_items import (
    event_shape,
    function_call,
    responses_framing,
    responses_usage,
    text_done,
)
from loadgen.conformance.responses_stream import ResponsesStream, read_responses
from loadgen.redaction import Secrets
from loadgen.workload.responses_body import build_responses_body
from loadgen.workload.tokenizer import Tokenizer

S = TypeVar("S", bound=Stream)


class _Options(Protocol):
    """What the battery reads of ``check.CheckOptions``."""

    @property
    def url(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def tokenizer(self) -> Tokenizer | None: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def http(self) -> EndpointOptions: ...


class Battery(Protocol):
    """What the battery uses of ``check.Checker`` (named so, as check.py imports this module)."""

    model: str | None
    secrets: Secrets

    @property
    def o(self) -> _Options: ...
    async def request(self, method: str, url: str, body: bytes | None = None, *, cap: int = ...) -> Wire: ...
    async def watched(self, *streams: Awaitable[S]) -> list[S]: ...
    async def timed(self, name: str, fn: Callable[[], Awaitable[Case]]) -> Case: ...
    async def _timing(
        self, name: str, first: tuple[str, str], again: Callable[[], Awaitable[tuple[str, str]]]
    ) -> Case: ...
    def case(self, name: str, status: str, message: str) -> Case: ...


__all__ = ["TOOL", "Battery", "responses_battery", "responses_body", "skipped"]

_MAX_STREAM = 16 << 20  # as the chat battery's: a streamed answer of a few dozen tokens is a few KiB
# A realistic function the tool-call request offers (chat shape: the body builder flattens it).
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TOOL_PROMPT = "What is the weather in Lisbon right now? Use the tool."


def responses_body(model: str | None, prompt: str, max_output_tokens: int, **extra: Any) -> bytes:
    """The request ``loadgen run --api responses`` sends (without ``ignore_eos``), at temperature 0."""
    messages = [{"role": "user", "content": prompt}]
    return build_responses_body(
        model or "", messages, max_output_tokens, ignore_eos=False, extra={"temperature": 0, **extra}
    )


async def responses_stream(c: Battery, prompt: str, **extra: Any) -> ResponsesStream:
    body = responses_body(c.model, prompt, c.o.max_tokens, **extra)
    wire = await c.request("POST", endpoint_path(c.o.url, "/responses"), body, cap=_MAX_STREAM)
    return read_responses(wire)


async def responses_battery(c: Battery, prompt: str) -> list[Case]:
    """The Responses items after models-list (``c.model`` known), in ``RESPONSES_ITEMS`` order."""
    (a,) = await c.watched(responses_stream(c, prompt))  # alone, so its timing is undisturbed
    tool_stream = responses_stream(c, TOOL_PROMPT, tools=[TOOL], tool_choice="required")
    f, client = await asyncio.gather(tool_stream, c.timed("responses-openai-client", lambda: _openai(c, prompt)))
    tok, limit = c.o.tokenizer, c.o.max_tokens
    cases = [
        c.case("responses-stream-framing", *responses_framing(a)),
        c.case("responses-event-shape", *event_shape(a)),
        c.case("responses-usage-present", *responses_usage(a)),
        c.case("responses-usage-matches-stream", *usage_matches([a], tok)),
        c.case("responses-max-output-tokens", *max_tokens(a, limit, tok, "max_output_tokens")),
        c.case("responses-text-done", *text_done(a)),
        c.case("responses-function-call", *_function_call(f)),
        client,
    ]

    async def again() -> tuple[str, str]:
        (s,) = await c.watched(responses_stream(c, prompt))
        return real_streaming(s)

    cases.append(
        await c.timed(
            "responses-real-streaming", lambda: c._timing("responses-real-streaming", real_streaming(a), again)
        )
    )
    cases += await _errors(c)
    order = list(RESPONSES_ITEMS)
    return sorted(cases, key=lambda k: order.index(k.name))


async def _errors(c: Battery) -> list[Case]:
    """The error shapes of ``/responses``: an unknown model, a body that is not JSON (the openai
    client raises its typed errors from the same ``{"error": {...}}`` object as for chat)."""
    url = endpoint_path(c.o.url, "/responses")
    unknown = responses_body(UNKNOWN_MODEL, "Hello.", 1)
    cut = responses_body(c.model, "hi", 1)[:-2]  # the same body, its closing brackets cut off
    bad_model, malformed = await asyncio.gather(c.request("POST", url, unknown), c.request("POST", url, cut))
    return [
        c.case("responses-error-unknown-model", *error_shape(bad_model)),
        c.case("responses-error-malformed-body", *error_shape(malformed)),
    ]


def _function_call(f: ResponsesStream) -> tuple[str, str]:
    """The tool-call request's verdict; its own framing first (a broken stream says so here too)."""
    framed = responses_framing(f)
    if framed[0] == "fail":
        return "fail", f"the tool-call request: {framed[1]}"
    return function_call(f)


async def _openai(c: Battery, prompt: str) -> Case:
    assert c.model is not None  # the battery asks nothing of a model it does not know
    o = c.o
    return await openai_responses_item(
        "responses-openai-client", o.url, o.api_key, c.model, o.timeout_s, prompt, secrets=c.secrets, options=o.http
    )


def skipped(why: str) -> list[Case]:
    """Every Responses item after models-list, skipped for ``why``."""
    return [item_case(k, "skip", why) for k in RESPONSES_ITEMS if k != "models-list"]
