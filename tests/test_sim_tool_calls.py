"""The simulator's tool-call answers and variable chunk sizes: the bytes of each server's shape, which
requests get a call, and a ground truth that stays per token (and per chunk) when chunks carry several."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from loadgen.cli.sim_cmd import add_sim_options, sim_args, sim_config
from loadgen.sim.answer import SimConfig, SseFrames, chunk_seed, chunk_size, word_index
from loadgen.sim.faults import FaultPlan
from loadgen.sim.model import FixedModel, SimRequest
from loadgen.sim.server import SimServer
from loadgen.sim.stream_writer import StreamWriter
from loadgen.sim.tool_calls import TOOL_SHAPES, tool_call_for
from loadgen.workload.tokenizer import BUILTIN, WORDS

PROMPT = "the of and to in"


def _post(tmp_path: Path, bodies: list[dict[str, Any]], **config: Any) -> tuple[list[bytes], list[dict[str, Any]]]:
    """POST each body to a simulator (fast fixed timing) in this thread's loop: raw bodies, truth lines."""
    truth = tmp_path / "truth.jsonl"
    server = SimServer(FixedModel(0.002, 0.0005), SimConfig(truth_path=str(truth), **config))

    async def main() -> list[bytes]:
        url = await server.start()
        try:
            async with aiohttp.ClientSession() as s:
                out = []
                for i, body in enumerate(bodies):
                    headers = {"X-Loadgen-Run": "t", "X-Loadgen-Seq": str(i)}
                    async with s.post(url + "/chat/completions", json=body, headers=headers) as r:
                        out.append(await r.read())
                return out
        finally:
            await server.stop()

    raw = asyncio.run(main())
    return raw, [orjson.loads(x) for x in truth.read_bytes().splitlines()]


def _events(raw: bytes) -> list[dict[str, Any]]:
    events = raw.decode().removesuffix("\n\n").split("\n\n")
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    return [orjson.loads(e[6:]) for e in events[:-1]]


def _body(n: int, **extra: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": n, "ignore_eos": True, "stream": True}
    return {**body, **extra}


def _words(n: int) -> str:
    req = SimRequest("x", BUILTIN.encode(PROMPT), n, 0)
    return "".join(" " + WORDS[word_index(req, k)] for k in range(n))


@pytest.mark.parametrize("shape", TOOL_SHAPES)
def test_a_tool_call_streams_role_header_then_one_argument_token_per_chunk(tmp_path, shape):
    """Every shape: the role chunk and the call's header (id, type, name, empty arguments) first, no
    text in either; then the answer's words as argument fragments, a token each; usage counts those
    fragments only, and the truth has one written instant per fragment token."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    (raw,), (t,) = _post(
        tmp_path,
        [_body(12, tools=tools, stream_options={"include_usage": True})],
        tool_calls=1.0,
        tool_call_shape=shape,
    )
    ev = _events(raw)
    role, header, frags, finish, usage = ev[0], ev[1], ev[2:-2], ev[-2], ev[-1]
    assert role["choices"][0]["delta"]["role"] == "assistant" and not role["choices"][0]["delta"]["content"]
    (call,) = header["choices"][0]["delta"]["tool_calls"]
    assert call["index"] == 0 and call["type"] == "function" and call["id"]
    assert call["function"] == {"name": "get_weather", "arguments": ""}
    assert not header["choices"][0]["delta"].get("content")
    args = [f["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for f in frags]
    assert len(args) == 12 and "".join(args) == _words(12)
    assert all(not f["choices"][0]["delta"].get("content") for f in frags)
    assert finish["choices"][0]["finish_reason"] == ("tool_calls" if shape == "vllm" else "length")
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    assert t["tool_call"] and len(t["written_ns"]) == 12 and t["chunk_tokens"] == [1] * 12


def test_a_shape_sends_what_its_server_does(tmp_path):
    """The differences between shapes that a client may trip on: SGLang's explicit nulls (content null
    beside the call, the id repeated as null), llama.cpp's role chunk with content null."""
    raws, _ = _post(tmp_path, [_body(3)] * 3, tool_calls=1.0, tool_call_shape="sglang")
    sg = _events(raws[0])
    assert sg[0]["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": None,
        "tool_calls": None,
    }
    assert sg[1]["choices"][0]["delta"]["content"] is None and sg[1]["choices"][0]["delta"]["tool_calls"][0][
        "id"
    ].startswith("call_")
    assert sg[2]["choices"][0]["delta"]["tool_calls"][0]["id"] is None
    assert sg[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] is None
    raws, _ = _post(tmp_path, [_body(3)], tool_calls=1.0, tool_call_shape="llamacpp")
    assert _events(raws[0])[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}


def test_the_share_picks_requests_deterministically_and_tool_choice_overrides_it():
    ids = BUILTIN.encode(PROMPT)
    picks = [tool_call_for({}, ids, seq, f"r-{seq}", 0.3, "vllm") is not None for seq in range(2000)]
    assert picks == [tool_call_for({}, ids, seq, f"r-{seq}", 0.3, "vllm") is not None for seq in range(2000)]
    assert 0.25 < sum(picks) / len(picks) < 0.35  # the same prompt, split by the request's number
    assert all(tool_call_for({}, ids, s, "r", 1.0, "vllm") for s in range(50))
    assert not any(tool_call_for({}, ids, s, "r", 0.0, "vllm") for s in range(50))
    assert tool_call_for({"tool_choice": "none"}, ids, 0, "r", 1.0, "vllm") is None
    assert tool_call_for({"tool_choice": "required"}, ids, 0, "r", 0.0, "vllm") is not None
    named = {"tool_choice": {"type": "function", "function": {"name": "search"}}}
    call = tool_call_for(named, ids, 0, "r", 0.0, "vllm")
    assert call is not None and call.name == "search" and call.id.startswith("chatcmpl-tool-")
    odd = {"tools": [{"type": "function", "function": {"name": 'x"}\n'}}]}  # not repeated into the stream
    assert tool_call_for(odd, ids, 0, "r", 1.0, "vllm").name == "lookup"  # type: ignore[union-attr]


def test_a_whole_answer_that_is_a_tool_call(tmp_path):
    (raw,), _ = _post(tmp_path, [_body(5, stream=False)], tool_calls=1.0)
    (choice,) = orjson.loads(raw)["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
    assert call["function"]["arguments"] == _words(5) and orjson.loads(raw)["usage"]["completion_tokens"] == 5


def test_continuous_usage_and_drawn_chunk_sizes_with_tool_calls(tmp_path):
    """2-4 tokens a chunk, drawn per chunk: the running usage rises by each fragment's tokens (the header
    says 0), the fragments hold the answer's words in order, and the truth records each chunk's tokens
    and a written instant per token, the same for the tokens of one chunk."""
    n = 40
    opts = {"include_usage": True, "continuous_usage_stats": True}
    (raw,), (t,) = _post(
        tmp_path, [_body(n, stream_options=opts)], tool_calls=1.0, tokens_per_chunk=2, tokens_per_chunk_max=4
    )
    ev = _events(raw)
    assert ev[1]["usage"]["completion_tokens"] == 0  # the header: no token
    frags = ev[2:-2]
    running = [f["usage"]["completion_tokens"] for f in frags]
    sizes = [b - a for a, b in zip([0, *running], running, strict=False)]
    args = [f["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for f in frags]
    assert "".join(args) == _words(n) and [len(a.split()) for a in args] == sizes
    assert all(2 <= k <= 4 for k in sizes[:-1]) and len(set(sizes)) > 1 and sum(sizes) == n
    assert t["chunk_tokens"] == sizes and len(t["written_ns"]) == n
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for s, k in zip(starts, sizes, strict=True):
        assert len(set(t["written_ns"][s : s + k])) == 1  # one write, one instant for its tokens


def test_drawn_chunk_sizes_follow_from_the_request_alone():
    seed = chunk_seed(BUILTIN.encode(PROMPT))
    sizes = [chunk_size(seed, c, 2, 4) for c in range(200)]
    assert sizes == [chunk_size(seed, c, 2, 4) for c in range(200)] and set(sizes) == {2, 3, 4}
    assert all(chunk_size(seed, c, 3, 3) == 3 for c in range(20))


def test_a_partial_last_chunk_ends_the_answer_in_the_writer():
    req = SimRequest("r", [7] * 5, 9, arrival_ns=0)
    w = StreamWriter(req, SseFrames("r", "sim", chat=True), SimConfig(tokens_per_chunk=4), FaultPlan(), [], None, True)
    req.emit(6, 0)
    assert w.take().count(b"data: ") == 1 and req.chunk_tokens == [4]  # 2 left over: not a chunk yet
    req.emit(3, 1)
    assert w.take().count(b"data: ") == 2 and req.chunk_tokens == [4, 4, 1]


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_sim_options(p, prefix="")
    return p.parse_args(list(argv))


def test_the_flags_reach_the_config_and_a_subprocess():
    args = _parse("--tokens-per-chunk", "2-4", "--tool-calls", "0.25", "--tool-call-shape", "sglang", "--ttft-ms", "5")
    _, cfg = sim_config(args)
    assert (cfg.tokens_per_chunk, cfg.tokens_per_chunk_max, cfg.tool_calls, cfg.tool_call_shape) == (
        2,
        4,
        0.25,
        "sglang",
    )
    flags = sim_args(args)
    assert flags[:6] == ["--ttft-ms", "5.0", "--tokens-per-chunk", "2-4", "--tool-calls", "0.25"]
    assert all(
        sim_config(_parse("--tool-call-shape", s, "--ttft-ms", "5"))[1].tool_call_shape == s for s in TOOL_SHAPES
    )
    assert sim_args(_parse(*flags)) == flags and sim_args(_parse("--tokens-per-chunk", "3-3")) == [
        "--tokens-per-chunk",
        "3",
    ]


@pytest.mark.parametrize(
    "argv",
    [("--tokens-per-chunk", "4-2"), ("--tokens-per-chunk", "0"), ("--tool-calls", "1.5"), ("--tool-call-shape", "tgi")],
)
def test_bad_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        _parse(*argv)
