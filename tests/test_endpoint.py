"""Asking the endpoint which model to use: a bounded read, a clean name, errors without credentials."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from loadgen.client.endpoint import discover_model, endpoint_label, endpoint_path, parse_models
from loadgen.errors import EndpointError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def ask(handler: Handler, **kw: object) -> str:
    """discover_model against a loopback server whose /v1/models is ``handler``."""
    app = web.Application()
    app.router.add_get("/v1/models", handler)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        return await discover_model(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", None, **kw)  # type: ignore[arg-type]
    finally:
        await runner.cleanup()


async def endless(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    await resp.write(b'{"data": [{"id": "')
    while True:  # never closes the string, never ends
        await resp.write(b"x" * 65536)


def test_an_endless_models_list_is_refused_at_the_cap_without_growing_memory() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(EndpointError, match=r"/models sent more than 1,048,576 bytes; pass --model"):
        asyncio.run(ask(endless))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: far below 100 MB


def test_a_slow_endless_models_list_ends_at_the_total_timeout() -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        while True:
            await resp.write(b" ")
            await asyncio.sleep(0.05)

    with pytest.raises(EndpointError, match="cannot reach http://127.0.0.1:.*/v1: TimeoutError"):
        asyncio.run(ask(trickle, timeout_s=0.5))


def test_the_model_id_is_cleaned_before_it_is_used() -> None:
    async def hostile(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "\x1b[31mllama\u202e\n" + "x" * 1000}]})

    model = asyncio.run(ask(hostile))
    assert model.startswith("llama x") and len(model) == 300 and model.endswith("…")
    assert "\x1b" not in model and "\u202e" not in model


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{}", "listed no model"),
        (b'{"data": []}', "listed no model"),
        (b'{"data": [{"id": 7}]}', "a model with no usable name"),
        (b'{"data": [{"id": "\\u0000\\u200b"}]}', "a model with no usable name"),
        (b"not json", "listed no model"),
    ],
)
def test_a_models_list_without_a_usable_model_asks_for_model(body: bytes, message: str) -> None:
    with pytest.raises(EndpointError, match=message):
        parse_models(body, "http://h/v1/models")


@pytest.mark.parametrize(
    "url, label",
    [
        ("http://user:sk-secret@127.0.0.1:8000/v1/?api-key=sk-secret#frag", "http://127.0.0.1:8000/v1"),
        ("https://[::1]:443/v1", "https://[::1]:443/v1"),
        ("http://host:notaport/v1", "http://host/v1"),
    ],
)
def test_an_endpoint_is_written_down_without_credentials(url: str, label: str) -> None:
    assert endpoint_label(url) == label


def test_a_path_is_joined_before_the_query_of_an_endpoint() -> None:
    assert endpoint_path("http://h/v1/?api-version=2024", "/models") == "http://h/v1/models?api-version=2024"
