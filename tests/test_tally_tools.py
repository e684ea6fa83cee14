"""Tool-call streams, byte for byte as vLLM, SGLang and llama.cpp send them.

Output tokens are what carries generated text: a tool call's argument fragments are
output, the header that only names the call (id, type, function name, ``arguments:
""``) is not. Servers send that header at receipt, with the role chunk, so counting it
would put TTFT at a few ms and add a token per call that the usage does not have
(and then blame the endpoint for under-reporting). Each test feeds one read per
event at t = 1000, 2000, ... (``tally_of``), so ``chunk_ns`` says which events counted.
"""

from __future__ import annotations

import pytest
from chunks import tally_of

from loadgen.client.protocol.tally import StreamTally

_V = b'{"id":"chatcmpl-7f2a","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen2.5-7B-Instruct",'


def _vllm(delta: bytes, finish: bytes = b"null") -> bytes:
    return (
        b"data: "
        + _V
        + b'"choices":[{"index":0,"delta":'
        + delta
        + b',"logprobs":null,"finish_reason":'
        + finish
        + b"}]}\n\n"
    )


def _vllm_usage(completion: int) -> bytes:
    return b'data: %s"choices":[],"usage":{"prompt_tokens":180,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (
        _V,
        180 + completion,
        completion,
    )


# vLLM (hermes parser): the role chunk at receipt, the header with empty arguments, then fragments.
VLLM_TOOL = [
    _vllm(b'{"role":"assistant","content":""}'),
    _vllm(
        b'{"tool_calls":[{"id":"chatcmpl-tool-3c1d9e","type":"function","index":0,'
        b'"function":{"name":"get_weather","arguments":""}}]}'
    ),
    _vllm(b'{"tool_calls":[{"index":0,"function":{"arguments":"{\\"ci"}}]}'),
    _vllm(b'{"tool_calls":[{"index":0,"function":{"arguments":"ty\\": \\""}}]}'),
    _vllm(b'{"tool_calls":[{"index":0,"function":{"arguments":"Paris"}}]}'),
    _vllm(b'{"tool_calls":[{"index":0,"function":{"arguments":"\\"}"}}]}'),
    _vllm(b'{"content":""}', b'"tool_calls"'),
    _vllm_usage(4),
    b"data: [DONE]\n\n",
]

_S = b'{"id":"9a3e1c","object":"chat.completion.chunk","created":1718000000,"model":"qwen2.5",'


def _sglang(delta: bytes, finish: bytes = b"null") -> bytes:
    return (
        b"data: "
        + _S
        + b'"choices":[{"index":0,"delta":'
        + delta
        + b',"logprobs":null,"finish_reason":'
        + finish
        + b',"matched_stop":null}],"usage":null}\n\n'
    )


# SGLang: the header with content null, and every fragment with its index and type repeated.
SGLANG_TOOL = [
    _sglang(b'{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null}'),
    _sglang(
        b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":"call_5b0c","index":0,'
        b'"type":"function","function":{"name":"get_weather","arguments":""}}]}'
    ),
    _sglang(
        b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":null,"index":0,'
        b'"type":"function","function":{"name":null,"arguments":"{\\"city\\": \\""}}]}'
    ),
    _sglang(
        b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":null,"index":0,'
        b'"type":"function","function":{"name":null,"arguments":"Paris\\"}"}}]}'
    ),
    _sglang(b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":null}', b'"tool_calls"'),
    b'data: {"id":"9a3e1c","object":"chat.completion.chunk","created":1718000000,"model":"qwen2.5","choices":[],'
    b'"usage":{"prompt_tokens":180,"total_tokens":182,"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]


def _llamacpp(delta: bytes, finish: bytes = b"null") -> bytes:
    return (
        b'data: {"choices":[{"finish_reason":'
        + finish
        + b',"index":0,"delta":'
        + delta
        + b'}],"created":1718000000,"id":"chatcmpl-Lx9","model":"gpt-3.5-turbo",'
        b'"system_fingerprint":"b5350-1a2b3c","object":"chat.completion.chunk"}\n\n'
    )


# llama.cpp server: the role chunk (content null), then a header with id and name and
# empty arguments, then fragments with the index alone.
LLAMACPP_TOOL = [
    _llamacpp(b'{"role":"assistant","content":null}'),
    _llamacpp(
        b'{"tool_calls":[{"index":0,"id":"qX1l9f","type":"function","function":{"name":"get_weather","arguments":""}}]}'
    ),
    _llamacpp(b'{"tool_calls":[{"index":0,"function":{"arguments":"{\\""}}]}'),
    _llamacpp(b'{"tool_calls":[{"index":0,"function":{"arguments":"city"}}]}'),
    _llamacpp(b'{"tool_calls":[{"index":0,"function":{"arguments":"\\":\\"Paris\\"}"}}]}'),
    _llamacpp(b"{}", b'"tool_calls"'),
    b'data: {"choices":[],"created":1718000000,"id":"chatcmpl-Lx9","model":"gpt-3.5-turbo",'
    b'"system_fingerprint":"b5350-1a2b3c","object":"chat.completion.chunk","usage":{"completion_tokens":3,'
    b'"prompt_tokens":180,"total_tokens":183}}\n\n',
    b"data: [DONE]\n\n",
]


@pytest.mark.parametrize(
    ("reads", "first", "n", "args"),
    [
        (VLLM_TOOL, 3000, 4, '{"city": "Paris"}'),
        (SGLANG_TOOL, 3000, 2, '{"city": "Paris"}'),
        (LLAMACPP_TOOL, 3000, 3, '{"city":"Paris"}'),
    ],
    ids=["vllm", "sglang", "llamacpp"],
)
def test_ttft_is_the_first_argument_fragment_and_usage_matches_the_fragments(
    reads: list[bytes], first: int, n: int, args: str
) -> None:
    t = tally_of("chat", reads, keep_text=True)
    assert t.t_output == t.chunk_ns[0] == first  # not the role chunk, not the header
    assert t.chunk_ns == [first + 1000 * i for i in range(n)]
    assert t.text == args
    assert t.finish_reason == "tool_calls" and t.end == "done"
    # the usage equals the fragments: no surplus to spread, and no under-reporting
    assert t.reconcile() == ([1] * n, n, "usage")
    assert t.completion_tokens == n and t.problems == []
    assert t.t_first_content is None  # arguments are output, not visible content


@pytest.mark.parametrize("reads", [VLLM_TOOL, SGLANG_TOOL, LLAMACPP_TOOL], ids=["vllm", "sglang", "llamacpp"])
def test_a_tool_call_stream_counts_the_same_however_it_is_read(reads: list[bytes]) -> None:
    whole = b"".join(reads)
    one = StreamTally("chat", keep_text=True)
    one.feed(whole, 5)
    one.close()
    bytewise = tally_of("chat", [whole[i : i + 1] for i in range(len(whole))], keep_text=True)
    each = tally_of("chat", reads, keep_text=True)
    assert one.chunk_ns == [5] * len(each.chunk_ns)
    assert one.reconcile() == bytewise.reconcile() == each.reconcile()
    assert one.text == bytewise.text == each.text


def test_parallel_calls_interleaved_count_every_fragment_of_each() -> None:
    reads = [
        _vllm(b'{"role":"assistant","content":""}'),
        _vllm(b'{"tool_calls":[{"id":"call_a","type":"function","index":0,"function":{"name":"f","arguments":""}}]}'),
        _vllm(b'{"tool_calls":[{"id":"call_b","type":"function","index":1,"function":{"name":"g","arguments":""}}]}'),
        _vllm(b'{"tool_calls":[{"index":0,"function":{"arguments":"{\\"x\\""}}]}'),
        _vllm(b'{"tool_calls":[{"index":1,"function":{"arguments":"{\\"y\\""}}]}'),
        _vllm(b'{"tool_calls":[{"index":0,"function":{"arguments":": 1}"}}]}'),
        # both calls' fragments in one delta: one chunk, one arrival
        _vllm(b'{"tool_calls":[{"index":1,"function":{"arguments":": 2"}},{"index":0,"function":{"arguments":""}}]}'),
        _vllm(b'{"tool_calls":[{"index":1,"function":{"arguments":"}"}}]}'),
        _vllm(b'{"content":""}', b'"tool_calls"'),
        _vllm_usage(5),
        b"data: [DONE]\n\n",
    ]
    t = tally_of("chat", reads, keep_text=True)
    assert t.chunk_ns == [4000, 5000, 6000, 7000, 8000]  # the two headers (reads 2 and 3) count nothing
    assert t.text == '{"x"{"y": 1}: 2}'
    assert t.reconcile() == ([1] * 5, 5, "usage") and t.problems == []


def test_a_header_that_brings_its_first_fragment_counts() -> None:
    reads = [
        _llamacpp(b'{"role":"assistant","content":null}'),
        _llamacpp(
            b'{"tool_calls":[{"index":0,"id":"qX1","type":"function","function":{"name":"get_weather","arguments":"{\\""}}]}'
        ),
        _llamacpp(b'{"tool_calls":[{"index":0,"function":{"arguments":"city\\":1}"}}]}'),
        _llamacpp(b"{}", b'"tool_calls"'),
        b"data: [DONE]\n\n",
    ]
    t = tally_of("chat", reads, keep_text=True)
    assert t.t_output == 2000 and t.chunk_ns == [2000, 3000]
    assert t.text == '{"city":1}'
    assert t.reconcile() == ([1, 1], 2, "chunks")


def test_header_shapes_without_arguments_start_nothing() -> None:
    headers = [
        b'{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f"}}]}',  # no arguments key
        b'{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":null}}]}',
        b'{"tool_calls":[{"index":0,"id":"c1","type":"function"}]}',  # no function at all
        b'{"content":null,"tool_calls":[{"index":0,"function":{"name":"f","arguments":""}}]}',
        b'{"content":"","reasoning_content":"","tool_calls":[]}',
        b'{"tool_calls":null}',
    ]
    t = tally_of("chat", [_vllm(h) for h in headers] + [b"data: [DONE]\n\n"])
    assert t.chunk_ns == [] and t.t_output is None
    assert t.reconcile() == ([], 0, "none") and t.end == "done"


def test_tool_calls_after_content_count_exactly_with_a_learned_template() -> None:
    """Content chunks teach the tally a byte template; the tool-call chunks after them
    must not fit it, whatever their bytes: they are decoded and counted as fragments."""
    content = [_vllm(b'{"content":"%s"}' % w) for w in (b"Let", b" me", b" check", b" the", b" weather", b".")]
    reads = [VLLM_TOOL[0], *content, *VLLM_TOOL[1:-2], _vllm_usage(10), b"data: [DONE]\n\n"]
    learned = tally_of("chat", reads, keep_text=True)
    decoded = StreamTally("chat", keep_text=True)
    decoded._learns = 0  # never learn a template: every chunk is decoded
    for i, data in enumerate(reads):
        decoded.feed(data, 1000 * (i + 1))
    decoded.close()
    assert learned.chunk_ns == decoded.chunk_ns == [1000 * i for i in range(2, 8)] + [9000, 10000, 11000, 12000]
    assert learned.text == decoded.text == 'Let me check the weather.{"city": "Paris"}'
    assert learned.reconcile() == decoded.reconcile() == ([1] * 10, 10, "usage")
    assert learned.t_first_content == 2000
    # in one read (a run of events counted in one go), the same
    one = StreamTally("chat")
    one.feed(b"".join(reads), 7)
    one.close()
    assert one.chunk_ns == [7] * 10 and one.reconcile() == ([1] * 10, 10, "usage")


def test_end_says_how_the_body_ended() -> None:
    t = StreamTally("chat")

    def now() -> tuple[str | None, int | None]:  # read afresh each time
        return t.end, t.t_output

    assert now() == (None, None)  # nothing fed
    t.feed(b"", 1)
    assert now() == (None, None)  # an empty read is no byte of body
    t.feed(b": keep-alive\n\n", 2)
    assert now() == ("eof", None) and t.t_read == 2  # a comment is read, but is no output
    t.feed(VLLM_TOOL[0] + VLLM_TOOL[1], 3)
    assert now() == ("eof", None)  # role chunk and header: still no output
    t.feed(VLLM_TOOL[2], 4)
    assert now() == ("eof", 4)
    t.feed(VLLM_TOOL[6], 5)
    assert now() == ("finish", 4)  # a finish reason, no [DONE] yet
    t.feed(b"data: [DONE]\n\n", 6)
    t.close()
    assert now() == ("done", 4)
