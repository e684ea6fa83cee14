"""The tally keeps an answer's tool calls, byte for byte as servers send them, when the request offered tools.

The calls go back to the endpoint in the next turn (the assistant message with its
``tool_calls``, one ``role: tool`` message per call id), so each call's id, name and
argument text must be whole and in order, parallel calls apart; the arguments as sent,
never parsed. Argument fragments are output tokens (the tally's rule, unchanged here).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from loadgen.client.protocol.responses import ResponsesTally
from loadgen.client.protocol.tally import StreamTally
from loadgen.client.protocol.tool_calls import MAX_ARGUMENT_CHARS, MAX_CALLS
from loadgen.workload.session import ToolCall

_V = b'{"id":"chatcmpl-7f2a","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen2.5-7B-Instruct",'


def _vllm(delta: bytes, finish: bytes = b"null") -> bytes:
    return b'data: %s"choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}\n\n' % (_V, delta, finish)


def _usage(n: int) -> bytes:
    return b'data: %s"choices":[],"usage":{"prompt_tokens":180,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (
        _V,
        180 + n,
        n,
    )


# vLLM (hermes parser), two parallel calls: each header (id, name, empty arguments), then fragments by index.
VLLM_PARALLEL = [
    _vllm(b'{"role":"assistant","content":""}'),
    _vllm(
        b'{"tool_calls":[{"id":"chatcmpl-tool-3c1d9e","type":"function","index":0,'
        b'"function":{"name":"read_file","arguments":""}}]}'
    ),
    _vllm(b'{"tool_calls":[{"index":0,"function":{"arguments":"{\\"path\\": "}}]}'),
    _vllm(b'{"tool_calls":[{"index":0,"function":{"arguments":"\\"a.py\\"}"}}]}'),
    _vllm(
        b'{"tool_calls":[{"id":"chatcmpl-tool-77ab01","type":"function","index":1,'
        b'"function":{"name":"run_tests","arguments":""}}]}'
    ),
    _vllm(b'{"tool_calls":[{"index":1,"function":{"arguments":"{\\"target\\": \\"all\\"}"}}]}'),
    _vllm(b'{"content":""}', b'"tool_calls"'),
    _usage(3),
    b"data: [DONE]\n\n",
]

# SGLang: every absent field an explicit null, id and name null on each fragment.
SGLANG_ONE = [
    b'data: {"id":"9a","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":null,"content":null,'
    b'"tool_calls":[{"id":"call_5b0c","index":0,"type":"function","function":{"name":"search_docs",'
    b'"arguments":""}}]},"finish_reason":null}],"usage":null}\n\n',
    b'data: {"id":"9a","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":null,"content":null,'
    b'"tool_calls":[{"id":null,"index":0,"type":"function","function":{"name":null,"arguments":"retry budget"}}]},'
    b'"finish_reason":null}],"usage":null}\n\n',
    b'data: {"id":"9a","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":null},'
    b'"finish_reason":"tool_calls"}],"usage":null}\n\n',
    b"data: [DONE]\n\n",
]


def tallied(reads: list[bytes], offered: bool = True, keep_text: bool = False) -> StreamTally:
    t = StreamTally("chat", keep_text=keep_text)
    if offered:
        t.capture_tool_calls()
    for i, data in enumerate(reads):
        t.feed(data, 1000 * (i + 1))
    t.close()
    return t


def test_parallel_vllm_calls_are_kept_whole_each_under_its_own_id() -> None:
    t = tallied(VLLM_PARALLEL)
    assert t.tool_calls == (
        ToolCall("chatcmpl-tool-3c1d9e", "read_file", '{"path": "a.py"}'),
        ToolCall("chatcmpl-tool-77ab01", "run_tests", '{"target": "all"}'),
    )
    assert t.tool_call_count == 2
    # the argument fragments are the output (headers count nothing), and the usage agrees
    assert t.chunk_ns == [3000, 4000, 6000] and t.reconcile() == ([1, 1, 1], 3, "usage")
    assert t.finish_reason == "tool_calls" and t.problems == []


def test_sglang_nulls_on_each_fragment_keep_the_headers_id_and_name() -> None:
    t = tallied(SGLANG_ONE)
    assert t.tool_calls == (ToolCall("call_5b0c", "search_docs", "retry budget"),)  # plain words: as sent


def test_the_calls_are_the_same_however_the_bytes_are_split() -> None:
    whole = b"".join(VLLM_PARALLEL)
    assert tallied([whole]).tool_calls == tallied([whole[i : i + 7] for i in range(0, len(whole), 7)]).tool_calls


def test_without_tools_offered_nothing_is_captured_and_the_count_is_null() -> None:
    t = tallied(VLLM_PARALLEL, offered=False, keep_text=True)
    assert t.tool_calls is None and t.tool_call_count is None
    assert t.text == '{"path": "a.py"}{"target": "all"}'  # still output, as before


def test_a_content_answer_offered_tools_has_zero_calls() -> None:
    t = tallied([_vllm(b'{"role":"assistant","content":"Done."}'), _usage(1), b"data: [DONE]\n\n"])
    assert t.tool_calls == () and t.tool_call_count == 0


def test_calls_without_an_index_or_id_still_pair_with_their_results() -> None:
    reads = [
        _vllm(b'{"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"x"}}]}'),
        _vllm(b'{"tool_calls":[{"function":{"arguments":"y"}}]}'),  # no index, no id: the latest call's
        _vllm(b'{"tool_calls":[{"id":"b","type":"function","function":{"name":"g","arguments":"z"}}]}'),
        _vllm(b'{"tool_calls":[{"index":5,"function":{"name":"h","arguments":"w"}}]}'),  # no id ever
    ]
    assert tallied(reads).tool_calls == (
        ToolCall("a", "f", "xy"),
        ToolCall("b", "g", "z"),
        ToolCall("call_2", "h", "w"),
    )


def test_what_the_endpoint_sent_is_bounded_and_cleaned() -> None:
    evil_id = "id\x1b[31m\u202e" + "x" * 500
    calls = [{"index": i, "id": f"c{i}", "function": {"name": "f", "arguments": "a"}} for i in range(MAX_CALLS + 5)]
    calls[0] = {"index": 0, "id": evil_id, "function": {"name": "f", "arguments": "a" * (MAX_ARGUMENT_CHARS + 9)}}
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": calls}}]}
    t = tallied(
        [
            b"data: " + orjson.dumps(chunk) + b"\n\n",
            b'data: {"choices":[{"index":0,"delta":{"tool_calls":'
            b'[{"index":1,"function":{"arguments":"\\ud800!"}}]}}]}\n\n',
        ]
    )
    got = t.tool_calls
    assert got is not None and len(got) == MAX_CALLS
    assert got[0].id.startswith("idxxx") and len(got[0].id) <= 128 and "\x1b" not in got[0].id
    assert len(got[0].arguments) == MAX_ARGUMENT_CHARS
    assert got[1].arguments == "a?!"  # a lone surrogate (read leniently) cannot be sent back as it was
    orjson.dumps([c.message() for c in got])  # every call can be sent again
    assert any("tool calls" in p for p in t.problems) and any("arguments over" in p for p in t.problems)


def _ev(obj: dict[str, Any]) -> bytes:
    return b"event: " + str(obj["type"]).encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def _item(call_id: str, name: str, args: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": status,
    }


@pytest.mark.parametrize("deltas", [True, False], ids=["deltas", "only-done"])
def test_responses_function_calls_are_captured_by_output_index(deltas: bool) -> None:
    reads = [
        _ev({"type": "response.output_item.added", "output_index": i, "item": _item(c, n, "", "in_progress")})
        for i, (c, n) in enumerate([("call_1", "read_file"), ("call_2", "search_docs")])
    ]
    if deltas:
        reads += [
            _ev(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": "fc_call_2",
                    "output_index": 1,
                    "delta": "cache",
                }
            ),
            _ev(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": "fc_call_1",
                    "output_index": 0,
                    "delta": "a.py",
                }
            ),
        ]
    reads += [
        _ev(
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": _item("call_1", "read_file", "a.py", "completed"),
            }
        ),
        _ev(
            {
                "type": "response.output_item.done",
                "output_index": 1,
                "item": _item("call_2", "search_docs", "cache", "completed"),
            }
        ),
        _ev({"type": "response.completed", "response": {"status": "completed", "usage": {"output_tokens": 2}}}),
    ]
    t = ResponsesTally()
    t.capture_tool_calls()
    for i, data in enumerate(reads):
        t.feed(data, 100 * (i + 1))
    assert t.tool_calls == (ToolCall("call_1", "read_file", "a.py"), ToolCall("call_2", "search_docs", "cache"))
    assert t.finish_reason == "tool_calls" and len(t.chunk_ns) == (2 if deltas else 0)
