"""The Responses API tally on byte literals: which events carry output, usage, how a stream ends."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from loadgen.client.protocol.chunk_errors import StreamError
from loadgen.client.protocol.responses import ResponsesTally
from loadgen.client.protocol.sse import BadStream
from loadgen.workload.tokenizer import BUILTIN


def ev(obj: dict[str, Any]) -> bytes:
    """One event as OpenAI sends it: its ``event:`` line, then its data."""
    return b"event: " + str(obj["type"]).encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def delta(kind: str, text: str) -> bytes:
    return ev({"type": f"response.{kind}.delta", "item_id": "i", "output_index": 0, "delta": text})


USAGE = {
    "input_tokens": 12,
    "input_tokens_details": {"cached_tokens": 4},
    "output_tokens": 9,
    "output_tokens_details": {"reasoning_tokens": 3},
    "total_tokens": 21,
}
CREATED = ev({"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}})
MESSAGE = ev({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "content": []}})
CALL = ev(
    {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {"type": "function_call", "call_id": "c", "name": "lookup", "arguments": ""},
    }
)


def completed(usage: object = USAGE) -> bytes:
    return ev({"type": "response.completed", "response": {"id": "r", "status": "completed", "usage": usage}})


def fed(*reads: bytes, keep_text: bool = True, **kw: object) -> ResponsesTally:
    tally = ResponsesTally(keep_text=keep_text, **kw)  # type: ignore[arg-type]  # (keyword options of the tally)
    for t, data in enumerate(reads, start=1):
        tally.feed(data, t * 100)
    tally.close(10_000)
    return tally


def test_text_reasoning_and_argument_deltas_are_output_and_only_text_is_visible() -> None:
    tally = fed(
        CREATED,  # t=100: carries nothing
        delta("reasoning_text", "hmm"),  # 200: output, not visible
        delta("reasoning_summary_text", " so"),  # 300
        MESSAGE,  # 400: nothing
        delta("output_text", "Hello"),  # 500: the first visible content
        delta("output_text", ""),  # 600: an empty delta carries nothing
        CALL,  # 700: a call's header: nothing
        delta("function_call_arguments", '{"q":1}'),  # 800
        completed(),  # 900
    )
    assert tally.chunk_ns == [200, 300, 500, 800]
    assert tally.t_output == 200
    assert tally.t_first_content == 500
    assert tally.text == 'hmm soHello{"q":1}'
    assert (tally.end, tally.done, tally.finish_reason) == ("done", True, "tool_calls")
    assert (tally.prompt_tokens, tally.completion_tokens, tally.cached_tokens, tally.reasoning_tokens) == (12, 9, 4, 3)
    counts, total, source = tally.reconcile()
    assert (counts, total, source) == ([2, 2, 2, 3], 9, "usage")  # 9 tokens spread over 4 events (token_counts.spread)
    assert tally.problems == []


def test_a_function_call_header_alone_starts_nothing() -> None:
    tally = fed(CREATED, CALL)
    assert tally.t_output is None and tally.chunk_ns == []
    assert tally.end == "eof"  # no terminal event: the body closed mid-answer


def test_completed_is_stop_and_events_split_anywhere_count_the_same() -> None:
    body = CREATED + MESSAGE + delta("output_text", "a") + delta("output_text", "b") + completed()
    whole = fed(body)
    assert (whole.chunk_ns, whole.finish_reason, whole.end) == ([100, 100], "stop", "done")
    for cut in range(1, len(body)):
        split = fed(body[:cut], body[cut:])
        assert len(split.chunk_ns) == 2 and split.text == "ab" and split.end == "done"


def test_incomplete_ends_the_stream_with_its_reason() -> None:
    def incomplete(reason: object) -> bytes:
        response = {"status": "incomplete", "incomplete_details": {"reason": reason}, "usage": USAGE}
        return ev({"type": "response.incomplete", "response": response})

    tally = fed(delta("output_text", "a"), incomplete("max_output_tokens"))
    assert (tally.end, tally.finish_reason, tally.completion_tokens) == ("done", "length", 9)
    assert fed(incomplete("content_filter")).finish_reason == "content_filter"
    assert fed(ev({"type": "response.incomplete", "response": {}})).finish_reason == "incomplete"


def test_nothing_after_the_terminal_event_counts() -> None:
    tally = fed(delta("output_text", "a"), completed(), delta("output_text", "late"), b"data: [DONE]\n\n")
    assert tally.chunk_ns == [100] and tally.text == "a"


def test_failed_and_error_events_are_stream_errors_with_the_servers_words() -> None:
    failed = ev(
        {
            "type": "response.failed",
            "response": {"status": "failed", "error": {"code": "server_error", "message": "boom\x1b[31m"}},
        }
    )
    with pytest.raises(StreamError) as e:
        fed(delta("output_text", "a"), failed)
    assert (e.value.message, e.value.code) == ("boom", "server_error")
    with pytest.raises(StreamError) as e:
        fed(ev({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": None}))
    assert (e.value.message, e.value.code) == ("slow down", "rate_limit_exceeded")
    with pytest.raises(StreamError):
        fed(b'data: {"error": {"message": "proxy says no"}}\n\n')


@pytest.mark.parametrize(
    ("usage", "problem"),
    [
        ({"input_tokens": 3_000_000_000, "output_tokens": 2}, "usage.input_tokens"),
        ({"input_tokens": 1, "output_tokens": -5}, "usage.output_tokens"),
        ({"output_tokens": 2, "output_tokens_details": {"reasoning_tokens": "7"}}, "usage.reasoning_tokens"),
        ({"output_tokens": 2, "input_tokens_details": {"cached_tokens": 2.5}}, "usage.cached_tokens"),
    ],
)
def test_impossible_usage_is_dropped_and_said(usage: dict[str, Any], problem: str) -> None:
    tally = fed(delta("output_text", "a"), completed(usage))
    assert len(tally.problems) == 1 and tally.problems[0].startswith(problem)
    counts, total, _ = tally.reconcile()
    assert total <= 100_000_000 and all(c >= 1 for c in counts)


def test_odd_events_are_read_past_or_fail_in_one_line() -> None:
    tally = fed(b'data: {"delta": "x"}\n\n', delta("output_text", "a"), completed({"output_tokens": 1}))
    assert tally.problems == ["an event without a type ignored"] and tally.chunk_ns == [200]
    lenient = fed(b'data: {"type":"response.output_text.delta","delta":"a","logprob":NaN}\n\n')
    assert lenient.chunk_ns == [100] and "non-standard JSON" in lenient.problems[0]
    with pytest.raises(BadStream, match="non-JSON"):
        fed(b"data: {not json\n\n")
    with pytest.raises(BadStream, match="not an object"):
        fed(b"data: [1, 2]\n\n")


def test_a_tokenizer_counts_each_events_text() -> None:
    words = [" alpha", " beta gamma", " delta"]
    body = b"".join(delta("output_text", w) for w in words) + completed({"output_tokens": 4})
    tally = fed(body, keep_text=False, tokenizer=BUILTIN)
    counts, total, source = tally.reconcile()
    assert (counts, total, source) == ([1, 2, 1], 4, "tokenizer")


def test_only_the_responses_api_is_read() -> None:
    with pytest.raises(ValueError, match="responses"):
        ResponsesTally("chat")
