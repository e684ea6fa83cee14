"""The per-chunk usage probe on a real loopback server: one tiny request decides, once per endpoint.

The server answers as three kinds of endpoint do when asked for ``continuous_usage_stats``:
vLLM's (running usage on every chunk), one that refuses the unknown field (HTTP 400), and one
that ignores it (usage only at the end); a fourth route never answers. The built-in simulator
is probed too: it offers running usage, so a sweep of it gets exact per-chunk counts.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from loadgen.client.config import Timeouts
from loadgen.client.settings import RunSettings, engine_config
from loadgen.client.usage_probe import (
    PerChunkUsage,
    detect,
    forget,
    probe_body,
    probe_continuous_usage,
    probe_headers,
    resolved,
)
from loadgen.sim.answer import SimConfig
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer

KEY = "sk-probe-test-0123456789"


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(content: str | None, usage: dict[str, int] | None, role: bool = False) -> bytes:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    out: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    if usage is not None:
        out["usage"] = usage
    return _event(out)


def _usage(n: int) -> dict[str, int]:
    return {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}


@dataclass
class Server:
    """A loopback endpoint in a thread of its own; ``seen`` holds every request it was sent
    (its route, its headers with lower-case names, its body)."""

    url: str = ""
    release: asyncio.Event = field(default_factory=asyncio.Event)  # set: the silent route lets go
    seen: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)

    def base(self, kind: str) -> str:
        return f"{self.url}/{kind}/v1"

    def bodies(self, kind: str) -> list[dict[str, Any]]:
        return [body for k, _, body in self.seen if k == kind]


async def _handle(server: Server, request: web.Request) -> web.StreamResponse:
    kind = request.match_info["kind"]
    body = orjson.loads(await request.read())
    server.seen.append((kind, {k.lower(): v for k, v in request.headers.items()}, body))
    continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
    if kind == "refuses" and continuous:
        error = {"object": "error", "message": "stream_options: extra inputs are not permitted", "code": 400}
        return web.json_response(error, status=400)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if kind == "silent":
        await server.release.wait()  # never a byte of body: the probe's own bound ends it
        return resp
    running = kind == "offers" and continuous
    await resp.write(b": keep-alive\n\n" + _chunk("", _usage(0) if running else None, role=True))
    for k in range(1, body["max_tokens"] + 1):
        await resp.write(_chunk(f" w{k}", _usage(k) if running else None))
    await resp.write(_event({"choices": [], "usage": _usage(body["max_tokens"])}) + b"data: [DONE]\n\n")
    return resp


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server()
    loop = asyncio.new_event_loop()
    app = web.Application()

    async def handle(request: web.Request) -> web.StreamResponse:
        return await _handle(srv, request)

    app.router.add_post("/{kind}/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    srv.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield srv
    loop.call_soon_threadsafe(srv.release.set)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    forget()
    yield
    forget()


def settings(**kw: Any) -> RunSettings:
    return RunSettings(endpoint="http://127.0.0.1:9/v1", model="m", **kw)


def test_an_endpoint_that_offers_running_usage_is_asked_for_it_after_one_probe(server: Server) -> None:
    s = settings()
    got = detect(s, server.base("offers"), "m", api_key=KEY, run_id="run-1")
    assert got == PerChunkUsage(True, "probe", True, "the first output chunk carried usage")
    assert got.json() == {"asked": True, "how": "probe", "supported": True}
    [(_, headers, body)] = [x for x in server.seen if x[0] == "offers"]
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["stream"] is True and body["max_tokens"] == 3 and body["model"] == "m"
    assert headers["authorization"] == f"Bearer {KEY}" and headers["accept-encoding"] == "identity"
    assert headers["x-request-id"] == "run-1-usage-probe" and headers["x-loadgen-probe"] == "per-chunk-usage"
    assert "x-loadgen-seq" not in headers and "x-loadgen-run" not in headers  # no request of the schedule
    # remembered for the process: the next run (a sweep's next point) does not probe again
    again = detect(s, server.base("offers") + "/", "m", api_key=KEY)
    assert again == PerChunkUsage(True, "remembered", True)
    assert len(server.bodies("offers")) == 1
    # and the engines are told to ask
    cfg = engine_config(resolved(s, again), server.base("offers"), "m", "run-1")
    assert cfg.continuous_usage is True


@pytest.mark.parametrize(
    "kind, why",
    [("refuses", "HTTP 400"), ("ignores", "the first output chunk carried no usage")],
)
def test_an_endpoint_that_refuses_or_ignores_the_field_is_not_asked(server: Server, kind: str, why: str) -> None:
    s = settings()
    got = detect(s, server.base(kind), "m", api_key=None)
    assert got == PerChunkUsage(False, "probe", False, why)
    assert detect(s, server.base(kind), "m", api_key=None).how == "remembered"
    assert len(server.bodies(kind)) == 1
    assert engine_config(resolved(s, got), server.base(kind), "m", "r").continuous_usage is False


def test_the_flag_decides_without_a_probe(server: Server) -> None:
    on = detect(settings(per_chunk_usage="on"), server.base("ignores"), "m2", api_key=None)
    off = detect(settings(per_chunk_usage="off"), server.base("offers"), "m2", api_key=None)
    assert on.json() == {"asked": True, "how": "flag", "supported": None}
    assert off.json() == {"asked": False, "how": "flag", "supported": None}
    assert not [b for b in server.bodies("ignores") + server.bodies("offers") if b["model"] == "m2"]


def test_a_probe_that_cannot_tell_is_bounded_and_not_remembered(server: Server) -> None:
    s = settings(timeouts=Timeouts(connect=0.1, first_byte=0.2))  # the probe's bound: 0.3 s
    got = detect(s, server.base("silent"), "m", api_key=None)
    assert got == PerChunkUsage(False, "probe", None, "timed out")
    assert detect(s, server.base("silent"), "m", api_key=None).how == "probe"  # asked again next time
    assert len(server.bodies("silent")) == 2


def test_the_built_in_simulator_offers_running_usage() -> None:
    async def go() -> tuple[bool | None, str]:
        sim = SimServer(FixedModel(ttft_s=0.001, itl_s=0.001), SimConfig())
        url = await sim.start("127.0.0.1", 0)
        try:
            body = probe_body(settings(), "sim")
            return await probe_continuous_usage(f"{url}/chat/completions", body, "chat", headers=probe_headers(None))
        finally:
            await sim.stop()

    assert asyncio.run(go()) == (True, "the first output chunk carried usage")
