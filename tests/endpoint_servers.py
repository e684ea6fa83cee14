"""Small loopback servers that pin how loadgen reaches a managed endpoint.

``ManagedEndpoint``: an OpenAI-style server under any path prefix (an Azure OpenAI deployment
URL, ``/openai/deployments/{d}``) that demands its query (``?api-version=...``) and its headers
on every route, and records every request it saw. ``Forwarder``: a tiny HTTP proxy (absolute
URLs in, the answer streamed back). ``tls_files``: a CA, a server certificate for 127.0.0.1 and
a client certificate, made with the ``openssl`` command here (skipped without it). Each server
runs on its own loop in a thread, so a command run in-process (its own ``asyncio.run``) can
reach it.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]


@dataclass
class ManagedEndpoint:
    prefix: str = "/v1"
    query: dict[str, str] = field(default_factory=dict)  # demanded on every route
    headers: dict[str, str] = field(default_factory=dict)  # demanded on every request
    models: tuple[str, ...] = ("d",)
    echo_every: int = 0  # every n-th chat request: a 429 whose body echoes each demanded header value
    seen: list[Seen] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(f"{self.prefix}/models", self._models)
        app.router.add_post(f"{self.prefix}/chat/completions", self._chat)
        return app

    def _refused(self, request: web.Request) -> web.Response | None:
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers)))
        if any(request.query.get(k) != v for k, v in self.query.items()):
            return web.json_response({"error": {"message": "missing api-version"}}, status=404)
        if any(request.headers.get(k) != v for k, v in self.headers.items()):
            return web.json_response({"error": {"message": "bad credentials"}}, status=401)
        return None

    async def _models(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._refused(request)) is not None:
            return refused
        await request.read()
        chats = sum(s.method == "POST" for s in self.seen)
        if self.echo_every and chats % self.echo_every == 0:
            said = " ".join(f"{v} {base64.b64encode(v.encode()).decode()}" for v in self.headers.values())
            return web.json_response({"error": {"message": f"slow down, {said}"}}, status=429)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("Hello", " there", "."):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        done = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
        await resp.write(b"data: " + orjson.dumps(done) + b"\n\ndata: [DONE]\n\n")
        return resp

    def chats(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "POST"]


@dataclass
class Forwarder:
    """An HTTP proxy for http:// targets: it forwards each absolute-URL request and counts them."""

    forwarded: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        url = str(request.url)
        self.forwarded.append(f"{request.method} {url}")
        hop = {"host", "proxy-authorization", "proxy-connection", "connection", "content-length"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            async with http.request(request.method, url, data=await request.read(), headers=headers) as up:
                resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
                await resp.prepare(request)
                async for data in up.content.iter_any():
                    await resp.write(data)
                return resp


@contextmanager
def serving(app: web.Application, ssl_context: ssl.SSLContext | None = None) -> Iterator[int]:
    """Serve ``app`` on 127.0.0.1 from a thread; yields the port."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    loop.run_until_complete(site.start())
    port: int = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp has no public getter
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self, *, client_certs: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.server_cert, self.server_key)
        if client_certs:
            ctx.load_verify_locations(cafile=self.ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def tls_files(folder: Path) -> TlsFiles:
    """A private CA and two certificates it signed (127.0.0.1's, a client's), made here offline."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a test CA with")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=loadgen test CA")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for who, subj in (("server", "/CN=127.0.0.1"), ("client", "/CN=loadgen client")):
        run("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", subj)
        ext = ("-extfile", "san.ext") if who == "server" else ()
        sign = ("-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2")
        run("x509", "-req", "-in", f"{who}.csr", *sign, "-out", f"{who}.pem", *ext)
    f = folder
    return TlsFiles(f / "ca.pem", f / "server.pem", f / "server.key", f / "client.pem", f / "client.key")
