"""`loadgen check` judges a stream's end by the rule `loadgen run` records (docs/metrics.md): a
finish_reason without [DONE] is a WARN (``--strict`` fails it), neither is a FAIL; and a tool-call
stream's header (a name, no arguments) is no token, so usage equal to the argument chunks passes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from loadgen.conformance.check_items import framing, item_case, verdict
from loadgen.conformance.check_tokens import usage_matches
from loadgen.conformance.exchange import Stream, Wire


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _stream(chunks: list[dict[str, Any]], *, done: bool = True) -> Stream:
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + (b"data: [DONE]\n\n" if done else b"")
    reads = [(10 * (i + 1), body[i * 64 : (i + 1) * 64]) for i in range(len(body) // 64 + 1)]
    w = Wire(status=200, content_type="text/event-stream", t_sent=0, t_done=10 * len(reads) + 1, reads=reads)
    return Stream.read(w, "chat")


ANSWER = [_choice({"role": "assistant", "content": ""})] + [_choice({"content": " w"})] * 4
FINISH = [_choice({}, "length"), {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}]


@pytest.mark.parametrize(
    ("chunks", "done", "status", "says"),
    [
        (ANSWER + FINISH, True, "pass", "then [DONE]"),
        (ANSWER + FINISH, False, "warn", "finish_reason 'length', but the body ended without data: [DONE]"),
        (ANSWER, False, "fail", "ended without data: [DONE] or a finish_reason after 5 chunks"),
    ],
)
def test_a_stream_end_is_judged_as_run_records_it(
    chunks: list[dict[str, Any]], done: bool, status: str, says: str
) -> None:
    got, evidence = framing(_stream(chunks, done=done))
    assert got == status and says in evidence, evidence
    case = item_case("chat-stream-framing", got, evidence)  # a fail-level item keeps its own warn
    assert case.status == status


def test_a_missing_done_passes_the_check_and_fails_it_when_strict() -> None:
    got, evidence = framing(_stream(ANSWER + FINISH, done=False))
    cases = [item_case("chat-stream-framing", got, evidence), item_case("models-list", "pass", "ok")]
    assert verdict(cases, strict=False) == ("warn", 0)
    assert verdict(cases, strict=True) == ("fail", 1)


# Tool-call streams: the call's header (id, name, arguments "") then argument fragments, one token
# each, and usage counting exactly those. vLLM puts the header in the role chunk; SGLang and
# llama.cpp send the role first and the header on its own; parallel calls each have a header.
HEADER = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
SECOND = {**HEADER, "index": 1, "id": "call_2"}
FRAGMENTS = ['{"ci', 'ty": ', '"Par', 'is"}']


def _fragment(text: str, index: int = 0) -> dict[str, Any]:
    return _choice({"tool_calls": [{"index": index, "function": {"arguments": text}}]})


SHAPES = {
    "vllm": [_choice({"role": "assistant", "tool_calls": [HEADER]})] + [_fragment(f) for f in FRAGMENTS],
    "sglang": [_choice({"role": "assistant", "content": ""}), _choice({"tool_calls": [HEADER]})]
    + [_fragment(f) for f in FRAGMENTS],
    "parallel": [_choice({"role": "assistant", "tool_calls": [HEADER]})]
    + [_fragment(f) for f in FRAGMENTS[:2]]
    + [_choice({"tool_calls": [SECOND]})]
    + [_fragment(f, 1) for f in FRAGMENTS[2:]],
}


def _tool_stream(shape: str, usage_tokens: int) -> Stream:
    chunks = SHAPES[shape] + [_choice({}, "tool_calls")]
    chunks += [{"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": usage_tokens}}]
    return _stream(chunks)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_tool_call_header_is_no_generated_token(shape: str) -> None:
    s = _tool_stream(shape, 4)
    assert len(s.gen_ns) == len(s.chunk_ns) == len(FRAGMENTS)  # headers named calls; arguments were generated


@pytest.mark.parametrize("shape", SHAPES)
def test_usage_equal_to_the_argument_chunks_is_not_under_reporting(shape: str) -> None:
    """The endpoint is not blamed for a header chunk that carries no token."""
    status, evidence = usage_matches([_tool_stream(shape, 4)], None)
    assert status == "pass", evidence
    status, evidence = usage_matches([_tool_stream(shape, 3)], None)  # one short of the fragments: under-reports
    assert status == "fail" and "under-reports" in evidence, evidence
