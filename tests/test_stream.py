"""StreamTally on stream captures shaped like what real servers send.

Each capture is a byte literal in the shape the server sends (ids, timestamps and
fingerprints shortened); the assertions pin the metric contract: which chunks carry
output (and so start TTFT and count for ITL), their arrival times, and token counts.
"""

from __future__ import annotations

import pytest
from chunks import Json, sse, tally_of, usage_chunk, vllm_chunk

from loadgen.client.protocol.chunk_errors import StreamError
from loadgen.client.protocol.sse import BadStream, SSEError
from loadgen.client.protocol.tally import StreamTally

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
    assert (t.t_first_content, t.reasoning_tokens) == (2000, 0)
    assert t.problems == []


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
    def chunk(text: str, ct: int) -> Json:
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
    assert t.t_first_content == 4000  # visible content starts with the answer
    assert t.text == "Let me think42"
    assert t.reconcile() == ([1, 2, 2], 5, "usage")  # reasoning tokens are output tokens (ITL)


@pytest.mark.parametrize("keep_text", [False, True])
def test_first_content_is_the_first_chunk_with_visible_text(keep_text: bool) -> None:
    reads = sse(
        vllm_chunk({"role": "assistant", "content": ""}, None),
        vllm_chunk({"reasoning_content": "hm"}, None),
        vllm_chunk({"reasoning": "so", "content": ""}, None),
        vllm_chunk({"content": "A", "reasoning": "and"}, None),  # content beside reasoning: visible
        vllm_chunk({"content": "B"}, None),
        b"[DONE]",
    )
    t = tally_of("chat", reads, keep_text=keep_text)
    assert t.chunk_ns == [2000, 3000, 4000, 5000]
    assert t.t_first_content == 4000


def test_reasoning_only_stream_has_no_first_content() -> None:
    reads = sse(vllm_chunk({"reasoning_content": "hm"}, None), vllm_chunk({}, None, finish="length"), b"[DONE]")
    t = tally_of("chat", reads)
    assert t.chunk_ns == [1000] and t.t_first_content is None


def test_completions_text_is_visible_content() -> None:
    t = tally_of("completions", events_of(LLAMACPP_COMPLETIONS))
    assert t.t_first_content == 1000 == t.chunk_ns[0]


@pytest.mark.parametrize(
    "details, expected",
    [
        ({"reasoning_tokens": 27}, 27),
        ({"reasoning_tokens": 0, "audio_tokens": 0}, 0),
        (None, None),  # vLLM: completion_tokens_details: null
        ({}, None),
    ],
)
def test_reasoning_tokens_come_from_usage(details: Json | None, expected: int | None) -> None:
    last = usage_chunk(40)
    last["usage"]["completion_tokens_details"] = details
    t = tally_of("chat", sse(vllm_chunk({"reasoning_content": "hm"}, None), last, b"[DONE]"))
    assert t.reasoning_tokens == expected
    assert t.completion_tokens == 40 and t.problems == []


def test_tool_call_fragments_are_output_and_the_named_header_is_not() -> None:
    def tc(call: Json) -> Json:
        return vllm_chunk({"tool_calls": [call]}, None)

    reads = sse(
        vllm_chunk({"role": "assistant", "content": None}, None),
        # the header: id, type and name, empty arguments; sent at receipt, not generated
        tc({"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}),
        tc({"index": 0, "function": {"arguments": '{"city"'}}),
        tc({"index": 0, "function": {"arguments": ': "Paris"}'}}),
        tc({"index": 0, "id": "call_2", "type": "function"}),  # header only: no name, no arguments
        tc({"index": 0, "function": {"name": "get_time"}}),  # a name alone: no arguments key at all
        vllm_chunk({"tool_calls": []}, None),
        vllm_chunk({}, None, finish="tool_calls"),
        b"[DONE]",
    )
    t = tally_of("chat", reads, keep_text=True)
    assert t.chunk_ns == [3000, 4000]  # TTFT starts at the first argument fragment
    assert t.text == '{"city": "Paris"}'
    assert t.finish_reason == "tool_calls"
    assert t.reconcile() == ([1, 1], 2, "chunks")
    assert t.t_first_content is None  # arguments are output, not visible content


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


def test_only_the_first_choice_counts_and_others_are_said_once() -> None:
    # loadgen asks for n = 1; a server sending more choices must not multiply the count
    reads = sse(
        {"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]},
        {"choices": [{"index": 3, "delta": {"content": "c"}, "finish_reason": "length"}]},
        {"choices": [{"delta": {"content": "d"}}]},  # no index: the one choice asked for
        {"choices": [{"index": 2, "delta": {"content": "e"}}, {"index": 0, "delta": {"content": "f"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        usage_chunk(3),
    )
    t = tally_of("chat", reads, keep_text=True)
    assert t.chunk_ns == [1000, 3000, 4000] and t.chunk_tokens == [1, 1, 1]
    assert t.text == "adf"
    assert t.finish_reason == "stop"  # index 3's "length" is not this answer's
    assert t.problems == ["extra choices (index 1) ignored"]
    assert t.reconcile() == ([1, 1, 1], 3, "usage")


def test_ten_thousand_choices_per_chunk_count_one_token_each() -> None:
    wide = {"choices": [{"index": i, "delta": {"content": "x"}, "finish_reason": None} for i in range(10_000)]}
    t = tally_of("chat", sse(wide, wide, usage_chunk(8)))
    assert t.reconcile() == ([4, 4], 8, "usage")
    assert len(t.problems) == 1


def test_stream_without_done_or_final_blank_line() -> None:
    body = b"".join(sse({"choices": [{"delta": {"content": "a"}}]})) + b'data: {"choices":[],"usage":'
    t = StreamTally("chat")
    t.feed(body, 5)
    t.feed(b'{"completion_tokens":1}}', 6)
    before_close = t.completion_tokens
    t.close(9)
    assert before_close is None and t.completion_tokens == 1  # the unterminated event counts at the close
    assert not t.done
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
def test_in_stream_error_object(obj: Json, message: str, code: object) -> None:
    reads = sse(vllm_chunk({"content": "a"}, None), obj)
    with pytest.raises(StreamError) as e:
        tally_of("chat", reads)
    assert e.value.message == message == str(e.value)
    assert e.value.code == code
    assert isinstance(e.value, BadStream)


def test_in_stream_error_message_is_cut_and_cleaned() -> None:
    with pytest.raises(StreamError) as e:
        tally_of("chat", sse({"error": {"message": "m" * 1000}}))
    assert e.value.message == "m" * 299 + "\u2026"
    with pytest.raises(StreamError) as e:
        tally_of("chat", sse({"error": {"message": "\x1b[31mred\x1b[0m\n\u202eevil", "code": "c\x07" * 100}}))
    assert e.value.message == "red evil"
    assert isinstance(e.value.code, str) and len(e.value.code) <= 60 and "\x07" not in e.value.code
    with pytest.raises(StreamError) as e:
        tally_of("chat", sse({"error": {"message": "big", "code": 10**12}}))
    assert e.value.code == str(10**12)  # kept as text: an error code is not a number that big


def test_null_error_field_is_not_an_error() -> None:
    t = tally_of("chat", sse({"choices": [{"delta": {"content": "a"}}], "error": None}))
    assert t.chunk_tokens == [1]


def test_unknown_api_is_rejected() -> None:
    with pytest.raises(ValueError, match="api"):
        StreamTally("embeddings")
