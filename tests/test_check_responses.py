"""`loadgen check --api responses`: the simulator's /v1/responses passes every item; a stream cut
before its terminal event, one with events after it, or with sequence numbers out of order fails
the item it concerns; the pure verdicts on hand-made event streams."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from loadgen.conformance.check import run_check
from loadgen.conformance.check_client import CheckOptions
from loadgen.conformance.check_items import LEVELS, RESPONSES_ITEMS
from loadgen.conformance.ci_outputs import Outcome
from loadgen.conformance.exchange import Wire
from loadgen.conformance.responses_items import event_shape, function_call, responses_framing, text_done
from loadgen.conformance.responses_stream import read_responses
from loadgen.sim.answer import SimConfig
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer
from loadgen.workload.tokenizer import BUILTIN


def run(serve: Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]], **kw: Any) -> Outcome:
    async def main() -> Outcome:
        url, stop = await serve()
        try:
            return await run_check(CheckOptions(url=url, timeout_s=10, api="responses", **kw))
        finally:
            await stop()

    return asyncio.run(main())


def statuses(out: Outcome) -> dict[str, str]:
    return {c.name: c.status for c in out.cases}


def simulator() -> Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]]:
    async def serve() -> tuple[str, Callable[[], Awaitable[None]]]:
        server = SimServer(FixedModel(0.005, 0.002), SimConfig(max_model_len=4096))
        return await server.start(), server.stop

    return serve


def test_the_simulator_passes_every_responses_item() -> None:
    out = run(simulator(), tokenizer=BUILTIN)
    status = statuses(out)
    assert list(status) == list(RESPONSES_ITEMS)
    msgs = {c.name: c.message for c in out.cases}
    # On a loaded machine the timing item may not be judgeable; it says so, and never fails an honest endpoint.
    assert status.pop("responses-real-streaming") in ("pass", "inconclusive")
    assert set(status.values()) == {"pass"}, msgs
    assert out.exit_code == 0
    assert "then response.incomplete" in msgs["responses-stream-framing"]
    assert "tokenizer counts 64" in msgs["responses-usage-matches-stream"]
    assert "fc_" in msgs["responses-function-call"] and "as the deltas" in msgs["responses-function-call"]


# -- a purpose-built server, streaming what a test gives it -------------------------------------


def event(kind: str, seq: int, **fields: Any) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps({"type": kind, "sequence_number": seq, **fields}))


def answer(words: int = 20, *, terminal: bool = True) -> list[bytes]:
    """A well-formed Responses answer of ``words`` one-word deltas (no terminal event unless asked)."""
    text = "".join(f" w{i}" for i in range(words))
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    out = [event("response.created", 0, response={"id": "r", "status": "in_progress", "output": []})]
    out += [event("response.output_text.delta", 1 + i, delta=f" w{i}", **where) for i in range(words)]
    out.append(event("response.output_text.done", words + 1, text=text, **where))
    usage = {"input_tokens": 7, "output_tokens": words, "total_tokens": 7 + words}
    response = {"id": "r", "status": "completed", "output": [], "usage": usage}
    return out + ([event("response.completed", words + 2, response=response)] if terminal else [])


def fake(events: list[bytes]) -> Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]]:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def responses(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
        await resp.write_eof()
        return resp

    async def serve() -> tuple[str, Callable[[], Awaitable[None]]]:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/responses", responses)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1", runner.cleanup

    return serve


def test_a_stream_cut_before_its_terminal_event_fails_framing() -> None:
    out = run(fake(answer(terminal=False)))
    case = next(c for c in out.cases if c.name == "responses-stream-framing")
    assert case.status == "fail" and "without a terminal event" in case.message
    assert statuses(out)["responses-usage-present"] == "warn"  # no usage: a warn-level item
    assert out.exit_code == 1


def test_events_after_the_terminal_one_fail_framing() -> None:
    late = event("response.output_text.delta", 23, delta=" late", item_id="msg_1", output_index=0, content_index=0)
    out = run(fake([*answer(), late]))
    case = next(c for c in out.cases if c.name == "responses-stream-framing")
    assert case.status == "fail" and "1 event(s) after response.completed" in case.message
    assert out.exit_code == 1


def test_sequence_numbers_out_of_order_fail_the_event_shape() -> None:
    events = answer()
    events[3], events[4] = events[4], events[3]  # two deltas swapped: 3 after 2 becomes 2 after 3
    out = run(fake(events))
    case = next(c for c in out.cases if c.name == "responses-event-shape")
    assert case.status == "fail" and "out of order: 3 after 4" in case.message
    assert statuses(out)["responses-stream-framing"] == "pass"


# -- the pure verdicts on hand-made streams -------------------------------------------------------


def stream(*events: bytes) -> Any:
    wire = Wire(status=200, content_type="text/event-stream", t_done=10**9)
    wire.reads = [(i * 1000, e) for i, e in enumerate(events)]
    return read_responses(wire)


def test_a_missing_event_line_or_a_gap_in_the_numbers_warns() -> None:
    events = answer(4)
    events[1] = events[1].split(b"\n", 1)[1]  # its event: line dropped
    assert event_shape(stream(*events))[0] == "warn"
    gap = [*answer(4)[:-1], event("response.completed", 9, response={"status": "completed"})]
    status, message = event_shape(stream(*gap))
    assert status == "warn" and "skips" in message


def test_an_event_line_naming_another_type_fails() -> None:
    events = answer(4)
    events[1] = events[1].replace(b"event: response.output_text.delta", b"event: response.created")
    status, message = event_shape(stream(*events))
    assert status == "fail" and "'response.created' for 'response.output_text.delta'" in message


def test_a_done_marker_after_the_terminal_event_warns_and_crlf_framing_reads_the_same() -> None:
    events = [e.replace(b"\n", b"\r\n") for e in answer(4)]
    # a CRLF split across two reads is one line end
    split = [b for e in events for b in (e[:-1], e[-1:])]
    s = stream(*split, b"data: [DONE]\r\n\r\n")
    status, message = responses_framing(s)
    assert status == "warn" and "[DONE]" in message
    assert event_shape(s)[0] == "pass" and s.text == " w0 w1 w2 w3"


def test_a_done_text_other_than_the_deltas_fails() -> None:
    events = answer(4)
    events[-2] = events[-2].replace(b" w0 w1 w2 w3", b" w0 w1 w2 XX")
    status, message = text_done(stream(*events))
    assert status == "fail" and "differ from char 10" in message


def test_function_call_arguments_are_the_deltas_joined() -> None:
    where = {"item_id": "fc_1", "output_index": 0}
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather"}
    head = [event("response.output_item.added", 0, output_index=0, item={**call, "arguments": ""})]
    halves = ['{"ci', 'ty": "Lisbon"}']
    deltas = [event("response.function_call_arguments.delta", 1 + i, delta=d, **where) for i, d in enumerate(halves)]

    def tail(args: str) -> list[bytes]:
        return [
            event("response.function_call_arguments.done", 3, arguments=args, **where),
            event("response.output_item.done", 4, output_index=0, item={**call, "arguments": args}),
            event("response.completed", 5, response={"status": "completed"}),
        ]

    good = stream(*head, *deltas, *tail('{"city": "Lisbon"}'))
    assert function_call(good)[0] == "pass" and good.finish_reason == "tool_calls"
    status, message = function_call(stream(*head, *deltas, *tail('{"city": "Porto"}')))
    assert status == "fail" and "function_call_arguments.done of 'fc_1'" in message
    unstreamed = function_call(stream(*head, *tail('{"city": "Lisbon"}')))
    assert unstreamed[0] == "fail" and "were not streamed" in unstreamed[1]
    assert function_call(stream(*answer(4)))[0] == "skip"


def test_every_responses_item_has_a_level() -> None:
    assert all(LEVELS[k] in ("fail", "warn") for k in RESPONSES_ITEMS)
    assert LEVELS["responses-stream-framing"] == "fail" and LEVELS["responses-usage-present"] == "warn"
