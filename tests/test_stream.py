"""StreamTally on stream captures shaped like what real servers send.

Each capture is a byte literal in the shape the server sends (ids, timestamps and
fingerprints shortened); the assertions pin the metric contract: which chunks carry
output (and so start TTFT and count for ITL), their arrival times, and token counts.
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.client.protocol.chunk_errors import StreamError
from loadgen.client.protocol.sse import BadStream, SSEError
from loadgen.client.protocol.tally import StreamTally
from loadgen.client.protocol.token_counts import spread


def sse(*events: bytes | dict) -> list[bytes]:
    """One ``data:`` event per item (dicts are JSON-encoded), as separate reads."""
    return [b"data: " + (orjson.dumps(e) if isinstance(e, dict) else e) + b"\n\n" for e in events]


def tally_of(api: str, reads: list[bytes], keep_text: bool = False, **kw: int) -> StreamTally:
    """Feed each read at t = 1000 * (its index + 1), then close."""
    t = StreamTally(api, keep_text=keep_text, **kw)
    for i, data in enumerate(reads):
        t.feed(data, 1000 * (i + 1))
    t.close()
    return t


OPENAI_CHAT = (
    b'data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000000,'
    b'"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],'
    b'"usage":null}\n\n'
    b'data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000000,'
    b'"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,'
    b'"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000000,'
    b'"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,'
    b'"delta":{"content":" w\xc3\xb6rld"},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000000,'
    b'"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,'
    b'"delta":{"content":"!"},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000000,'
    b'"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,'
    b'"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000000,'
    b'"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[],'
    b'"usage":{"prompt_tokens":12,"completion_tokens":4,"total_tokens":16,"prompt_tokens_details":'
    b'{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,'
    b'"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}\n\n'
    b"data: [DONE]\n\n"
)

LLAMACPP_CHAT = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],'
    b'"created":1718000000,"id":"chatcmpl-Lx","model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"The"}}],"created":1718000000,'
    b'"id":"chatcmpl-Lx","model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" sky"}}],"created":1718000000,'
    b'"id":"chatcmpl-Lx","model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" is"}}],"created":1718000000,'
    b'"id":"chatcmpl-Lx","model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1718000000,'
    b'"id":"chatcmpl-Lx","model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[],"created":1718000000,"id":"chatcmpl-Lx","model":"gpt-3.5-turbo",'
    b'"system_fingerprint":"b5350-1a2b3c","object":"chat.completion.chunk","usage":{"completion_tokens":3,'
    b'"prompt_tokens":9,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4}},"timings":'
    b'{"cache_n":4,"prompt_n":5,"prompt_ms":12.3,"prompt_per_token_ms":2.46,"prompt_per_second":406.5,'
    b'"predicted_n":3,"predicted_ms":30.1,"predicted_per_token_ms":10.03,"predicted_per_second":99.7}}\n\n'
    b"data: [DONE]\n\n"
)

LLAMACPP_COMPLETIONS = (
    b'data: {"choices":[{"text":" Paris","index":0,"logprobs":null,"finish_reason":null}],'
    b'"created":1718000000,"model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"text_completion","id":"chatcmpl-Lc"}\n\n'
    b'data: {"choices":[{"text":".","index":0,"logprobs":null,"finish_reason":null}],'
    b'"created":1718000000,"model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"text_completion","id":"chatcmpl-Lc"}\n\n'
    b'data: {"choices":[{"text":" It","index":0,"logprobs":null,"finish_reason":null}],'
    b'"created":1718000000,"model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"text_completion","id":"chatcmpl-Lc"}\n\n'
    b'data: {"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],'
    b'"created":1718000000,"model":"gpt-3.5-turbo","system_fingerprint":"b5350-1a2b3c",'
    b'"object":"text_completion","id":"chatcmpl-Lc","usage":{"completion_tokens":3,"prompt_tokens":6,'
    b'"total_tokens":9},"timings":{"prompt_n":6,"prompt_ms":8.1,"predicted_n":3,"predicted_ms":29.7}}\n\n'
    b"data: [DONE]\n\n"
)


def vllm_chunk(delta: dict, completion_tokens: int | None, finish: str | None = None) -> dict:
    """A vLLM chat chunk; with a count, running usage as continuous_usage_stats sends."""
    out: dict = {
        "id": "chatcmpl-v1",
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if finish:
        out["choices"][0]["stop_reason"] = None
    if completion_tokens is not None:
        out["usage"] = {
            "prompt_tokens": 20,
            "total_tokens": 20 + completion_tokens,
            "completion_tokens": completion_tokens,
        }
    return out


def usage_chunk(completion_tokens: int, prompt_tokens: int = 20) -> dict:
    return {
        "id": "chatcmpl-v1",
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": "m",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        },
    }


def events_of(stream: bytes) -> list[bytes]:
    """Split a capture into one read per event."""
    return [e + b"\n\n" for e in stream.split(b"\n\n") if e]


# ---- captures ----------------------------------------------------------------------


def test_openai_chat_with_include_usage() -> None:
    t = tally_of("chat", events_of(OPENAI_CHAT), keep_text=True)
    assert t.done
    assert t.events == 7
    assert t.chunk_ns == [2000, 3000, 4000]  # the role chunk (read 1) carries no output
    assert t.chunk_tokens == [1, 1, 1]
    assert t.finish_reason == "stop"
    assert (t.prompt_tokens, t.completion_tokens, t.cached_tokens) == (12, 4, 0)
    assert t.text == "Hello w\u00f6rld!"
    assert t.reconcile() == ([1, 1, 2], 4, "usage")


def test_one_read_stamps_every_event_with_its_time() -> None:
    t = StreamTally("chat")
    t.feed(OPENAI_CHAT, 777)
    t.close()
    assert t.chunk_ns == [777, 777, 777]
    assert t.done


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("size", [1, 7, 64, 1000])
def test_any_read_size_gives_the_same_tally(size: int, eol: bytes) -> None:
    stream = OPENAI_CHAT.replace(b"\n", eol)
    reads = [stream[i : i + size] for i in range(0, len(stream), size)]
    t = tally_of("chat", reads, keep_text=True)
    whole = tally_of("chat", [OPENAI_CHAT], keep_text=True)
    assert (t.events, t.done, t.chunk_tokens, t.text) == (whole.events, True, [1, 1, 1], whole.text)
    assert t.reconcile() == whole.reconcile()


def test_llamacpp_chat_null_role_chunk_and_timings() -> None:
    t = tally_of("chat", events_of(LLAMACPP_CHAT))
    assert t.chunk_ns == [2000, 3000, 4000]  # content: null role chunk is not output
    assert t.finish_reason == "length"
    assert (t.prompt_tokens, t.completion_tokens, t.cached_tokens) == (9, 3, 4)
    assert t.reconcile() == ([1, 1, 1], 3, "usage")
    assert t.text == ""  # not kept unless asked


def test_llamacpp_completions_usage_on_finish_chunk() -> None:
    t = tally_of("completions", events_of(LLAMACPP_COMPLETIONS), keep_text=True)
    assert t.chunk_ns == [1000, 2000, 3000]  # the finish chunk has text "" and carries none
    assert t.text == " Paris. It"
    assert t.finish_reason == "length"
    assert (t.prompt_tokens, t.completion_tokens) == (6, 3)
    assert t.reconcile() == ([1, 1, 1], 3, "usage")


def test_vllm_continuous_usage_gives_exact_multi_token_chunks() -> None:
    reads = sse(
        vllm_chunk({"role": "assistant", "content": ""}, 0),
        vllm_chunk({"content": "The"}, 1),
        vllm_chunk({"content": " quick brown"}, 3),  # speculative decoding: 2 tokens
        vllm_chunk({"content": " fox jumps over"}, 6),
        vllm_chunk({"content": ""}, 6, finish="length"),
        usage_chunk(6),
        b"[DONE]",
    )
    t = tally_of("chat", reads)
    assert t.chunk_ns == [2000, 3000, 4000]
    assert t.chunk_tokens == [1, 2, 3]
    assert t.reconcile() == ([1, 2, 3], 6, "usage_per_chunk")


def test_vllm_continuous_usage_token_on_finish_chunk_goes_to_last_chunk() -> None:
    # A stop string held back by the detokenizer: the last token shows up only as a
    # usage rise on the (empty) finish chunk. It was generated, so it is counted.
    reads = sse(
        vllm_chunk({"role": "assistant", "content": ""}, 0),
        vllm_chunk({"content": "a"}, 1),
        vllm_chunk({"content": "b"}, 2),
        vllm_chunk({"content": ""}, 3, finish="stop"),
        b"[DONE]",
    )
    assert tally_of("chat", reads).reconcile() == ([1, 2], 3, "usage_per_chunk")


def test_vllm_continuous_usage_held_back_tokens_go_to_next_chunk() -> None:
    reads = sse(
        vllm_chunk({"role": "assistant", "content": ""}, 0),
        vllm_chunk({"content": ""}, 2),  # two tokens, no text yet (partial UTF-8)
        vllm_chunk({"content": "\U0001f600"}, 3),
        b"[DONE]",
    )
    t = tally_of("chat", reads)
    assert t.chunk_ns == [3000]
    assert t.reconcile() == ([3], 3, "usage_per_chunk")


def test_completions_running_usage_without_role_chunk() -> None:
    def chunk(text: str, ct: int) -> dict:
        return {
            "object": "text_completion",
            "choices": [{"index": 0, "text": text}],
            "usage": {"completion_tokens": ct},
        }

    t = tally_of("completions", sse(chunk("a", 2), chunk("b", 3), chunk("cd", 5), b"[DONE]"))
    assert t.reconcile() == ([2, 1, 2], 5, "usage_per_chunk")


def test_usage_on_the_last_content_chunk_is_a_total_not_a_running_count() -> None:
    # Some servers put the final usage on the last chunk, which also carries text.
    reads = sse(
        {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "b", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "c", "finish_reason": "length"}], "usage": {"completion_tokens": 7}},
    )
    t = tally_of("completions", reads)
    assert t.chunk_tokens == [1, 1, 1]
    assert t.reconcile() == ([2, 2, 3], 7, "usage")
    assert not t.done and t.finish_reason == "length"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_deltas_are_output(field: str) -> None:
    reads = sse(
        vllm_chunk({"role": "assistant", "content": ""}, None),
        vllm_chunk({field: "Let me"}, None),
        vllm_chunk({field: " think", "content": None}, None),
        vllm_chunk({"content": "42", field: None}, None),
        vllm_chunk({}, None, finish="stop"),
        usage_chunk(5),
        b"[DONE]",
    )
    t = tally_of("chat", reads, keep_text=True)
    assert t.chunk_ns == [2000, 3000, 4000]  # TTFT starts at the first reasoning delta
    assert t.text == "Let me think42"
    assert t.reconcile() == ([1, 2, 2], 5, "usage")


def test_tool_call_fragments_are_output() -> None:
    def tc(call: dict) -> dict:
        return vllm_chunk({"tool_calls": [call]}, None)

    reads = sse(
        vllm_chunk({"role": "assistant", "content": None}, None),
        tc({"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}),
        tc({"index": 0, "function": {"arguments": '{"city"'}}),
        tc({"index": 0, "function": {"arguments": ': "Paris"}'}}),
        tc({"index": 0, "id": "call_2", "type": "function"}),  # header only: no name, no arguments
        vllm_chunk({"tool_calls": []}, None),
        vllm_chunk({}, None, finish="tool_calls"),
        b"[DONE]",
    )
    t = tally_of("chat", reads, keep_text=True)
    assert t.chunk_ns == [2000, 3000, 4000]
    assert t.text == '{"city": "Paris"}'
    assert t.finish_reason == "tool_calls"
    assert t.reconcile() == ([1, 1, 1], 3, "chunks")


def test_empty_content_chunks_carry_no_output() -> None:
    reads = sse(
        vllm_chunk({"role": "assistant", "content": ""}, None),
        *[vllm_chunk({"content": ""}, None) for _ in range(5)],
        vllm_chunk({"content": "x"}, None),
        *[vllm_chunk({"content": ""}, None) for _ in range(5)],
        vllm_chunk({"content": "y"}, None),
        vllm_chunk({"content": None}, None),
        vllm_chunk({}, None),
        b"[DONE]",
    )
    t = tally_of("chat", reads)
    assert t.chunk_ns == [7000, 13000]
    assert t.events == 16
    assert t.reconcile() == ([1, 1], 2, "chunks")


def test_several_choices_count_together() -> None:
    reads = sse(
        {"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]},
        {"choices": [{"index": 1, "delta": {"content": "c"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    )
    t = tally_of("chat", reads)
    assert t.chunk_tokens == [2, 1]
    assert t.reconcile() == ([2, 1], 3, "chunks")
    t = tally_of("chat", reads + sse(usage_chunk(6)))
    assert t.reconcile() == ([3, 3], 6, "usage")  # surplus spread over the observed counts


def test_stream_without_done_or_final_blank_line() -> None:
    body = b"".join(sse({"choices": [{"delta": {"content": "a"}}]})) + b'data: {"choices":[],"usage":'
    t = StreamTally("chat")
    t.feed(body, 5)
    t.feed(b'{"completion_tokens":1}}', 6)
    assert t.completion_tokens is None
    t.close(9)
    assert not t.done
    assert t.completion_tokens == 1
    assert t.reconcile() == ([1], 1, "usage")


def test_events_after_done_are_ignored() -> None:
    reads = sse(
        {"choices": [{"delta": {"content": "a"}}]}, b"[DONE]", b"not json", {"choices": [{"delta": {"content": "b"}}]}
    )
    t = tally_of("chat", reads)
    assert t.done and t.chunk_ns == [1000] and t.events == 4


# ---- failures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload, match",
    [
        (b"<html>502 Bad Gateway</html>", "non-JSON"),
        (b'{"choices": [', "non-JSON"),
        (b"[1, 2]", "not an object"),
        (b'"text"', "not an object"),
        (b"null", "not an object"),
        (b'{"choices": "abc"}', "malformed"),
        (b'{"choices": [{"delta": "x"}]}', "malformed"),
        (b'{"choices": [1]}', "malformed"),
        (b'{"choices": 3}', "malformed"),
    ],
)
def test_bad_stream(payload: bytes, match: str) -> None:
    t = StreamTally("chat")
    t.feed(b"".join(sse({"choices": [{"delta": {"content": "a"}}]})), 1)
    with pytest.raises(BadStream, match=match):
        t.feed(b"data: " + payload + b"\n\n", 2)
    assert t.chunk_ns == [1]  # what came before stays for the failure record


def test_non_json_error_message_is_short_and_escaped() -> None:
    with pytest.raises(BadStream) as e:
        tally_of("chat", [b"data: " + b"\x1b[31m" + b"x" * 500 + b"\n\n"])
    assert len(str(e.value)) < 120 and "\x1b" not in str(e.value)


def test_empty_data_event_is_ignored() -> None:
    t = tally_of("chat", [b"data:\n\n", *sse({"choices": [{"delta": {"content": "a"}}]})])
    assert t.chunk_ns == [2000] and t.events == 2


def test_event_over_the_cap_is_an_sse_error() -> None:
    with pytest.raises(SSEError):
        tally_of("chat", sse({"choices": [{"delta": {"content": "x" * 200}}]}), max_event_bytes=100)
    assert issubclass(SSEError, BadStream)


@pytest.mark.parametrize(
    "obj, message, code",
    [
        ({"error": {"message": "boom", "type": "InternalServerError", "code": 500}}, "boom", 500),
        (
            {"object": "error", "message": "context too long", "type": "BadRequestError", "param": None, "code": 400},
            "context too long",
            400,
        ),
        ({"error": "overloaded"}, "overloaded", None),
        ({"error": {"type": "server_error"}}, '{"type":"server_error"}', "server_error"),
    ],
)
def test_in_stream_error_object(obj: dict, message: str, code: object) -> None:
    reads = sse(vllm_chunk({"content": "a"}, None), obj)
    with pytest.raises(StreamError) as e:
        tally_of("chat", reads)
    assert e.value.message == message == str(e.value)
    assert e.value.code == code
    assert isinstance(e.value, BadStream)


def test_in_stream_error_message_is_truncated() -> None:
    with pytest.raises(StreamError) as e:
        tally_of("chat", sse({"error": {"message": "m" * 1000}}))
    assert len(e.value.message) == 200


def test_null_error_field_is_not_an_error() -> None:
    t = tally_of("chat", sse({"choices": [{"delta": {"content": "a"}}], "error": None}))
    assert t.chunk_tokens == [1]


def test_unknown_api_is_rejected() -> None:
    with pytest.raises(ValueError, match="api"):
        StreamTally("embeddings")


# ---- reconcile ---------------------------------------------------------------------


def content(n: int, usage: int | None = None) -> list[bytes]:
    reads = sse(*[{"choices": [{"index": 0, "delta": {"content": "w"}}], "usage": None} for _ in range(n)])
    if usage is not None:
        reads += sse(usage_chunk(usage))
    return reads + sse(b"[DONE]")


@pytest.mark.parametrize(
    "n, usage, expected",
    [
        (3, 3, ([1, 1, 1], 3, "usage")),
        (3, 7, ([2, 2, 3], 7, "usage")),  # usage spread over multi-token chunks
        (4, 10, ([2, 3, 2, 3], 10, "usage")),
        (4, 2, ([1, 1, 1, 1], 4, "chunks")),  # under-reporting server: keep the chunks
        (3, None, ([1, 1, 1], 3, "chunks")),  # no usage
        (0, 5, ([], 0, "usage")),
        (0, None, ([], 0, "none")),
        (0, 0, ([], 0, "usage")),
    ],
)
def test_reconcile(n: int, usage: int | None, expected: tuple[list[int], int, str]) -> None:
    t = tally_of("chat", content(n, usage))
    assert t.reconcile() == expected
    assert t.completion_tokens == usage  # the reported value stays visible


@pytest.mark.parametrize("total, n", [(5, 5), (7, 3), (10, 4), (100, 7), (129, 128), (1, 1), (1000, 3)])
def test_spread_is_even_and_sums_to_total(total: int, n: int) -> None:
    counts = spread(total, n)
    assert len(counts) == n and sum(counts) == total
    assert max(counts) - min(counts) <= 1


# ---- the template fast path is exactly the full path ----------------------------------

ANY_TEXT = st.text(max_size=6)  # any code point: quotes, backslashes, controls, emoji
PLAIN_TEXT = st.text(alphabet="abc XYZ\u00e9\u4e2d\U0001f600", min_size=1, max_size=6)


@st.composite
def server_streams(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    """Events of a stream in one of several servers' shapes and JSON styles."""
    api = draw(st.sampled_from(["chat", "completions"]))
    compact = draw(st.booleans())
    ascii_only = draw(st.booleans())
    decoy = draw(st.sampled_from([None, "before", "after", "string"]))
    created = 1718000000

    def dumps(obj: dict) -> bytes:
        seps = (",", ":") if compact else (", ", ": ")
        return json.dumps(obj, separators=seps, ensure_ascii=ascii_only).encode()

    def chunk(body: dict | None, finish: str | None = None, usage: dict | None = None) -> dict:
        obj: dict = {"id": "x1", "object": "chunk", "created": created, "model": "m"}
        if decoy == "before":
            obj["meta"] = {"content": "w"}
        if decoy == "string":
            obj["note"] = 'say "content":"w"'
        if body is None:
            obj["choices"] = []
        elif api == "chat":
            obj["choices"] = [{"index": 0, "delta": body, "logprobs": None, "finish_reason": finish}]
        else:
            obj["choices"] = [{"index": 0, "text": body.get("content", ""), "finish_reason": finish}]
        if decoy == "after":
            obj["x"] = {"content": "w"}
        if usage is not None or draw(st.booleans()):
            obj["usage"] = usage
        return obj

    events = []
    if api == "chat":
        events.append(chunk({"role": "assistant", "content": ""}))
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["plain", "plain", "plain", "any", "reasoning", "empty", "time", "broken"]))
        if kind == "time":
            created += 1  # llama.cpp stamps each chunk with the current second
            continue
        if kind == "reasoning":
            events.append(chunk({"reasoning_content": draw(PLAIN_TEXT), "content": draw(ANY_TEXT)}))
            continue
        # "broken": bytes no JSON encoder writes (a raw control character, bad UTF-8),
        # put in after encoding; both paths must then fail the same way.
        broken = st.sampled_from(["a<CTL>", "<BAD>b"])
        content = {"plain": PLAIN_TEXT, "any": ANY_TEXT, "empty": st.just(""), "broken": broken}[kind]
        events.append(chunk({"content": draw(content)}))
    events.append(chunk({}, finish="length"))
    events.append(chunk(None, usage={"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 20))}))
    framed = [b"data: " + dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    framed = [e.replace(b"<CTL>", b"\x01").replace(b"<BAD>", b"\xff") for e in framed]
    return api, framed


def facts(api: str, reads: list[bytes], learn: bool) -> tuple:
    """What a tally makes of the reads, including the error it stops at, if any."""
    t = StreamTally(api, keep_text=True)
    if not learn:
        t._learns = 0  # never learn a template: every chunk is decoded
    error = None
    try:
        for i, d in enumerate(reads):
            t.feed(d, 1000 * (i + 1))
        t.close()
    except BadStream as e:
        error = str(e)
    return (
        error,
        t.events,
        t.done,
        t.chunk_ns,
        t.chunk_tokens,
        t.text,
        t.finish_reason,
        t.completion_tokens,
        t.reconcile(),
    )


@settings(max_examples=150, deadline=None)
@given(case=server_streams(), data=st.data())
def test_template_path_matches_full_decode(case: tuple[str, list[bytes]], data: st.DataObject) -> None:
    api, events = case
    stream = b"".join(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    splits = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    # whole events grouped into reads, as a server writing back to back delivers them
    bounds = sorted(set(data.draw(st.lists(st.integers(0, len(events)), max_size=6))) | {0, len(events)})
    grouped = [b"".join(events[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    for reads in (events, splits, grouped):
        assert facts(api, reads, learn=True) == facts(api, reads, learn=False)


def test_template_path_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    import loadgen.client.protocol.tally as stream_mod

    calls = []

    def counting(b: bytes) -> object:
        calls.append(b)
        return orjson.loads(b)

    monkeypatch.setattr(stream_mod, "_loads", counting)
    reads = sse(*[vllm_chunk({"content": f" w{i}"}, None) for i in range(50)], b"[DONE]")
    t = tally_of("chat", reads, keep_text=True)
    assert len(t.chunk_ns) == 50 and t.text == "".join(f" w{i}" for i in range(50))
    assert len(calls) <= 4  # the first chunk and [DONE] (the probe decode is template.py's)
    calls.clear()
    t = tally_of("chat", [b"".join(reads)])  # one read of many events: the payload template
    assert len(t.chunk_ns) == 50 and len(calls) <= 4
    calls.clear()
    # the first read teaches the template; the next holds 48 whole events, taken in one piece
    t = tally_of("chat", [reads[0], b"".join(reads[1:49]), *reads[49:]])
    assert len(t.chunk_ns) == 50 and len(set(t.chunk_ns)) == 3 and len(calls) <= 4


def test_template_read_with_a_foreign_event_takes_the_full_path() -> None:
    chunks = [vllm_chunk({"content": f" w{i}"}, None) for i in range(4)]
    odd = vllm_chunk({"content": 'say "hi"'}, None)  # escaped quotes: not the template's plain text
    reads = [*sse(chunks[0], chunks[1]), b"".join(sse(chunks[2], odd, chunks[3]))]
    t = tally_of("chat", reads, keep_text=True)
    assert t.text == ' w0 w1 w2say "hi" w3' and len(t.chunk_ns) == 5


def _template_read(bodies: list[bytes], lead: int = 2) -> list[bytes]:
    """``lead`` events alone (the template is learned from them), then the rest in one read with the end."""
    framed = [
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + b + b'"},"finish_reason":null}]}\n\n'
        for b in bodies
    ]
    tail = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    return [*framed[:lead], b"".join(framed[lead:]) + tail]


@pytest.mark.parametrize("lead", [0, 1, 2])
@pytest.mark.parametrize(
    "case",
    [
        [b" w%d" % i for i in range(30)],
        [b" w%d" % i if i % 7 else b"" for i in range(30)],  # empty bodies: events without output
        [b"\xc3\xa9t\xc3\xa9 %d" % i for i in range(30)],  # non-ASCII, whole characters
        [b" w%d" % i for i in range(14)] + [b"\xc3", b"\xa9"] + [b" w%d" % i for i in range(14)],  # one cut in two
        [b" w%d" % i for i in range(14)] + [b'say \\"hi\\"'] + [b" w%d" % i for i in range(14)],  # an escape
        [b" w%d" % i for i in range(14)] + [b"tab\x01"] + [b" w%d" % i for i in range(14)],  # a raw control byte
    ],
    ids=["plain", "empties", "non-ascii", "split-char", "escaped", "control"],
)
def test_many_template_events_in_one_read_count_as_decoded_one_by_one(case: list[bytes], lead: int) -> None:
    reads = _template_read(case, lead)
    assert facts("chat", reads, learn=True) == facts("chat", reads, learn=False)
    end = reads[-1].index(b'data: {"id":"c","choices":[{"index":0,"delta":{}')
    apart = [*reads[:-1], reads[-1][:end], reads[-1][end:]]  # the end in a read of its own
    assert apart[-1].startswith(b"data: {") and apart[-2].endswith(b"\n\n")
    for read in (apart, [b"".join(reads)]):  # and all of it as one read, as it comes with the headers
        assert facts("chat", read, learn=True) == facts("chat", read, learn=False)


def test_a_read_of_many_template_events_is_counted_in_one_go(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []
    real = StreamTally._bodies

    def spy(self: StreamTally, bodies: list[bytes], t_ns: int) -> bool:
        runs.append(len(bodies))
        return real(self, bodies, t_ns)

    monkeypatch.setattr(StreamTally, "_bodies", spy)
    reads = _template_read([b" w%d" % i for i in range(30)], lead=2)
    t = tally_of("chat", [b"".join(reads)])  # with the learning events: the parser's payloads
    assert runs == [29] and len(t.chunk_ns) == 30
    runs.clear()
    end = reads[-1].index(b'data: {"id":"c","choices":[{"index":0,"delta":{}')
    t = tally_of("chat", [*reads[:-1], reads[-1][:end], reads[-1][end:]])  # a read of template events only
    assert runs == [28] and len(t.chunk_ns) == 30 and t.done
