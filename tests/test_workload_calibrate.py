"""Calibration against tiny loopback servers: /tokenize first, else usage probes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import orjson
import pytest
from aiohttp import web

from loadgen.client.calibrate import calibrate, fit
from loadgen.errors import EndpointError
from loadgen.workload.load import load_workload
from loadgen.workload.tokenizer import BUILTIN

T = TypeVar("T")


def server_app(*, tokenize: bool, usage: bool) -> web.Application:
    """An endpoint whose tokenizer makes 2 tokens of every built-in token (+5 template
    tokens on completions), optionally without /tokenize or usage."""

    async def tok(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        n = 2 * BUILTIN.count(body["prompt"])
        return web.json_response({"tokens": list(range(n)), "count": n})

    async def completions(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        assert body["max_tokens"] == 1 and body["stream"] is False
        if not usage:
            return web.json_response({"choices": [{"text": "x"}]})
        n = 2 * BUILTIN.count(body["prompt"]) + 5
        return web.json_response({"choices": [{"text": "x"}], "usage": {"prompt_tokens": n}})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m1"}]})

    app = web.Application()
    routes = [web.post("/v1/completions", completions), web.get("/v1/models", models)]
    if tokenize:
        routes.append(web.post("/tokenize", tok))
    app.add_routes(routes)
    return app


def with_server(app: web.Application, fn: Callable[[str], Awaitable[T]]) -> T:
    async def main() -> T:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await fn(f"http://127.0.0.1:{port}/v1")
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_tokenize_endpoint_gives_the_ratio() -> None:
    cal = with_server(server_app(tokenize=True, usage=True), lambda url: calibrate(url, lengths=(10, 100)))
    assert cal.method == "tokenize"
    assert cal.ratio == pytest.approx(2.0) and cal.overhead == pytest.approx(0.0, abs=1e-6)
    assert cal.samples == ((10, 20), (100, 200))


def test_usage_probes_when_there_is_no_tokenize() -> None:
    cal = with_server(server_app(tokenize=False, usage=True), lambda url: calibrate(url, lengths=(16, 64, 256)))
    assert cal.method == "usage:completions"
    assert cal.ratio == pytest.approx(2.0) and cal.overhead == pytest.approx(5.0)


def test_no_source_of_counts_is_an_endpoint_error() -> None:
    with pytest.raises(EndpointError, match="no /tokenize"):
        with_server(server_app(tokenize=False, usage=False), lambda url: calibrate(url, lengths=(8,)))


def test_a_workload_applies_the_ratio(tmp_path: Path) -> None:
    cal = with_server(server_app(tokenize=True, usage=True), lambda url: calibrate(url, lengths=(10, 40)))
    spec = tmp_path / "w.yaml"
    spec.write_text("kind: chat\ninput: 200\noutput: 5\n")
    t = load_workload(str(spec), overrides=cal.overrides()).session(0).turns[0]
    assert t.prompt_tokens == 200  # requested, in endpoint tokens
    assert BUILTIN.count(t.text) == 100  # built as 200 / 2 built-in tokens
    assert fit([(10, 30)]) == (3.0, 0.0)
