"""The simulator's /v1/responses on loopback: read by the official ``openai`` client, by the
OpenAI event schemas, and by loadgen's own Responses tally, from a body loadgen builds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, get_args

import aiohttp
import openai
import orjson
from openai.types.responses import ResponseStreamEvent

from loadgen.client.protocol.responses import ResponsesTally
from loadgen.sim.answer import SimConfig
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer
from loadgen.workload.responses_body import build_responses_body, input_items
from loadgen.workload.session import Conversation, Turn

T = TypeVar("T")
# Each OpenAI event class by its ``type``: an event is checked against its own (pydantic reads
# the SDK's union without its discriminator, and would try every member).
SCHEMAS = {get_args(c.model_fields["type"].annotation)[0]: c for c in get_args(get_args(ResponseStreamEvent)[0])}


def check_schema(event: dict[str, Any]) -> None:
    """Raises pydantic's ValidationError on a missing or wrong-typed field."""
    SCHEMAS[event["type"]].model_validate(event)


def served(config: SimConfig, go: Callable[[str], Awaitable[T]]) -> T:
    async def main() -> T:
        server = SimServer(FixedModel(0.002, 0.0005), config)
        url = await server.start()
        try:
            return await go(url)
        finally:
            await server.stop()

    return asyncio.run(main())


def body(max_tokens: int = 6, **extra: Any) -> bytes:
    conv = Conversation("You are terse.")
    conv.add_turn(Turn("name three colours", max_tokens))
    return build_responses_body("sim", conv.messages, max_tokens, extra=extra or None)


async def raw(url: str, data: bytes) -> bytes:
    async with aiohttp.ClientSession() as s, s.post(url + "/responses", data=data) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        return await r.read()


def test_the_openai_client_reads_the_stream_whole() -> None:
    async def go(url: str) -> list[Any]:
        client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
        stream = await client.responses.create(
            model="sim", input=[{"role": "user", "content": "hello"}], max_output_tokens=5, stream=True
        )
        events = [e async for e in stream]
        await client.close()
        return events

    events = served(SimConfig(natural_mean_tokens=10_000), go)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 5 and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert done.text == text == final.output_text and len(text.split()) == 5
    assert final.incomplete_details.reason == "max_output_tokens"
    assert (final.usage.output_tokens, final.usage.input_tokens) == (5, 1)


def test_every_event_fits_the_openai_schema_and_the_tally_reads_it() -> None:
    stream = served(SimConfig(natural_mean_tokens=10_000), lambda url: raw(url, body(6)))
    for e in stream.strip().split(b"\n\n"):
        name, data = e.split(b"\ndata: ", 1)
        event = orjson.loads(data)
        assert name == b"event: " + event["type"].encode()
        check_schema(event)
    tally = ResponsesTally(keep_text=True)
    for i in range(0, len(stream), 97):  # reads cut anywhere
        tally.feed(stream[i : i + 97], i)
    tally.close()
    assert (tally.end, tally.finish_reason) == ("done", "length")  # ignore_eos: the budget ends it
    assert tally.reconcile().counts == [1] * 6 and tally.completion_tokens == 6
    assert len(tally.text.split()) == 6 and tally.prompt_tokens and tally.prompt_tokens > 3


def test_a_tool_call_is_a_function_call_item_with_argument_deltas() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    stream = served(SimConfig(tool_calls=1.0, natural_mean_tokens=10_000), lambda url: raw(url, body(4, tools=tools)))
    events = [orjson.loads(e.split(b"\ndata: ", 1)[1]) for e in stream.strip().split(b"\n\n")]
    for e in events:
        check_schema(e)
    added = events[2]
    assert added["type"] == "response.output_item.added"
    assert added["item"]["type"] == "function_call" and added["item"]["name"] == "get_weather"
    assert added["item"]["arguments"] == ""
    args = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(args) == 4
    tally = ResponsesTally()
    tally.feed(stream, 1)
    assert len(tally.chunk_ns) == 4 and tally.t_first_content is None  # arguments: output, not visible
    assert events[-1]["response"]["output"][0]["arguments"] == "".join(args)


def test_unstreamed_it_is_the_whole_response_object() -> None:
    async def go(url: str) -> Any:
        client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
        got = await client.responses.create(
            model="sim", input="hello", max_output_tokens=3, extra_body={"ignore_eos": True}
        )
        await client.close()
        return got

    got = served(SimConfig(), go)
    assert got.status == "incomplete" and len(got.output_text.split()) == 3
    assert got.usage is not None and got.usage.output_tokens == 3


def test_the_body_is_the_responses_shape() -> None:
    sent = orjson.loads(body(7, temperature=0.0))
    assert sent == {
        "model": "sim",
        "input": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "name three colours"}],
        "stream": True,
        "max_output_tokens": 7,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    assert "stream_options" not in sent and "max_tokens" not in sent


def test_chat_tool_shapes_become_responses_items() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    messages: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert input_items(messages) == [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    sent = orjson.loads(build_responses_body("m", [], 1, ignore_eos=False, extra={"tools": tools}))
    assert sent["tools"] == [{"type": "function", "name": "f", "parameters": {}}] and "ignore_eos" not in sent


def test_loadgen_run_api_responses_against_the_simulator_times_every_delta(tmp_path: Path) -> None:
    """End to end: ``loadgen run --api responses`` streams /v1/responses and records each answer
    by the same definitions as chat: a first token, one chunk per text delta, usage's count."""
    from loadgen.cli.main import main

    out = tmp_path / "run"
    argv = ["run", "--api", "responses", "--rate", "40", "--requests", "6", "--output-tokens", "8"]
    assert main([*argv, "--sim-ttft-ms", "2", "--sim-itl-ms", "1", "--no-live", "--no-report", "--out", str(out)]) == 0
    import pyarrow.parquet as pq

    recs = pq.read_table(out / "records.parquet").to_pydict()
    assert recs["status"] == ["ok"] * 6 and recs["api"] == ["responses"] * 6 and recs["stream_end"] == ["done"] * 6
    assert recs["output_tokens"] == [8] * 6 and recs["output_tokens_reported"] == [8] * 6
    assert all(
        len(c) == 8 and f is not None and f == c[0] for c, f in zip(recs["chunk_ns"], recs["t_first"], strict=True)
    )
    assert recs["finish_reason"] == ["length"] * 6
