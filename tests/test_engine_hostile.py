"""The engine against hostile loopback endpoints (tests/hostile.py), where the wire matters:
compression, broken framing, echoed keys, capped error bodies, and a stop from a signal handler;
each through both transports (the lean wire and aiohttp's)."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp.web
import numpy as np
import pytest
from hostile import HostileServer, serve_in_thread

from loadgen.client.aiohttp_transport import ERROR_BODY_BYTES, AiohttpTransport
from loadgen.client.config import EngineConfig, Plan, Timeouts
from loadgen.client.engine import Engine
from loadgen.client.holds import HoldQueue
from loadgen.client.transport import Exchange, Transport
from loadgen.client.wire.connection import ERROR_BODY_BYTES as LEAN_ERROR_BODY_BYTES
from loadgen.client.wire.transport import LeanTransport
from loadgen.records import RecordWriter, read_stream
from loadgen.workload.base import SyntheticChat

KEY = "hostile-Q7mZ4tWb2Xp9/Lr8+Vn3Ks="
SLOW = Timeouts(first_byte=20.0, idle=20.0, total=25.0)  # a request ending by a timeout would show it


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with serve_in_thread() as server:
        yield server


@pytest.fixture(params=["lean", "aiohttp"])
def wire(request: pytest.FixtureRequest) -> str:
    """The transport the engine sends through (EngineConfig.transport)."""
    return str(request.param)


def _send(
    url: str, path: Path, n: int = 2, *, engine_to: list[Engine] | None = None, grace_s: float = 10.0, **kw: Any
) -> dict[str, list[Any]]:
    async def go() -> None:
        cfg = EngineConfig(url=url, model="m", run_id="t", timeouts=kw.pop("timeouts", SLOW), **kw)
        wl = SyntheticChat(input_tokens=8, output_tokens=4)
        with RecordWriter(path) as w:
            engine = Engine(cfg, w, api_key=KEY)
            if engine_to is not None:
                engine_to.append(engine)
            offs = (np.arange(n) * 10e6).astype(np.int64)
            await engine.run(Plan(wl.session, offs, np.arange(n)), time.perf_counter_ns() + 10_000_000, grace_s)

    asyncio.run(go())
    return read_stream(path).to_pydict()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_answer_although_identity_was_asked_is_a_bad_stream(
    hostile: HostileServer, tmp_path: Path, encoding: str, wire: str
) -> None:
    rec = _send(hostile.url(encoding, wire), tmp_path / "r.arrows", transport=wire)
    assert rec["status"] == ["bad_stream"] * 2
    assert rec["error"] == [f"compressed answer (Content-Encoding: {encoding}) although identity was asked"] * 2
    for served in hostile.served(encoding, wire):
        asked = [v for k, v in served["headers"] if k.lower() == "accept-encoding"]
        assert asked == ["identity"]  # aiohttp's own "gzip, deflate" replaced, not added to


def test_a_chunked_body_with_bad_framing_fails_at_once_not_by_a_timeout(
    hostile: HostileServer, tmp_path: Path, wire: str
) -> None:
    rec = _send(hostile.url("bad-chunked"), tmp_path / "r.arrows", transport=wire)
    assert rec["status"] == ["disconnected"] * 2  # with 20 s timeouts: a timeout would say so
    assert all("payload is not completed" in e for e in rec["error"])
    assert all(len(c) == 1 for c in rec["chunk_ns"])  # the token before the broken chunk is kept


def _forms() -> dict[str, str]:
    return {
        "raw": KEY,
        "url": quote(KEY, safe=""),
        "b64": base64.b64encode(KEY.encode()).decode(),
        "b64-header": base64.b64encode(f"Bearer {KEY}".encode()).decode(),
        "fragment": KEY[8:20],
    }


@pytest.mark.parametrize("behaviour,status", [("echo-auth-error", "http_error"), ("echo-auth", "ok")])
def test_an_endpoint_echoing_the_key_gets_it_into_no_record(
    hostile: HostileServer, tmp_path: Path, behaviour: str, status: str, wire: str
) -> None:
    rec = _send(hostile.url(behaviour), tmp_path / "r.arrows", keep_text=True, transport=wire)
    assert rec["status"] == [status] * 2
    if status == "http_error":
        assert all(e.startswith("HTTP 401: ") and "[REDACTED]" in e for e in rec["error"])
    texts = [str(v) for col in ("error", "finish_reason", "output_text") for v in rec[col]]
    for name, form in _forms().items():
        assert not [t for t in texts if form in t], name


def test_an_error_body_is_read_up_to_its_cap(tmp_path: Path, wire: str) -> None:
    async def handler(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(status=503, body=b"e" * (4 << 20))

    async def go() -> Exchange:
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
        transport: Transport = (
            LeanTransport(url, connect_timeout_s=5.0)
            if wire == "lean"
            else AiohttpTransport(url, connect_timeout_s=5.0, read_bufsize=1 << 16)
        )
        clock = time.perf_counter_ns
        ex = Exchange(1, b"{}", {"X-Loadgen-Seq": "1"}, clock())
        try:
            async with transport.open(clock, HoldQueue(clock), 4):
                await transport.exchange(ex, lambda data, t: None)
        finally:
            await runner.cleanup()
        return ex

    ex = asyncio.run(go())
    assert ex.status == 503 and ex.error == b"e" * ERROR_BODY_BYTES == b"e" * LEAN_ERROR_BODY_BYTES


def test_a_stop_from_a_signal_handler_then_a_second_one_ends_the_run_at_once(
    hostile: HostileServer, tmp_path: Path, wire: str
) -> None:
    """Three requests to an endpoint that never answers, a drain of 60 s: SIGUSR1 stops the
    run (the loop's signal handler calls ``stop``), a second ends the drain; every request is
    recorded cancelled, and the fourth, planned at 30 s, not sent."""
    engines: list[Engine] = []

    async def go() -> dict[str, list[Any]]:
        loop = asyncio.get_running_loop()
        wl = SyntheticChat(input_tokens=8, output_tokens=4)
        url = hostile.url("never-answer", wire)
        cfg = EngineConfig(url=url, model="m", run_id="t", timeouts=SLOW, transport=wire)
        with RecordWriter(tmp_path / "r.arrows") as w:
            engine = Engine(cfg, w, api_key=KEY)
            engines.append(engine)
            loop.add_signal_handler(signal.SIGUSR1, engine.stop, "SIGUSR1")
            try:

                async def signal_twice() -> None:
                    while engine.live.inflight < 3 or len(hostile.served("never-answer", wire)) < 3:
                        await asyncio.sleep(0.01)
                    os.kill(os.getpid(), signal.SIGUSR1)
                    await asyncio.sleep(0.05)
                    os.kill(os.getpid(), signal.SIGUSR1)

                sender = asyncio.ensure_future(signal_twice())
                offs = np.asarray([0, 0, 0, 30_000_000_000], dtype=np.int64)
                await engine.run(Plan(wl.session, offs, np.arange(4)), time.perf_counter_ns(), grace_s=60.0)
                await sender
            finally:
                loop.remove_signal_handler(signal.SIGUSR1)
        return read_stream(tmp_path / "r.arrows").to_pydict()

    rec = asyncio.run(go())
    assert rec["status"] == ["cancelled"] * 3 + ["not_sent"]
    assert set(rec["error"][:3]) == {"cancelled before the answer ended: drain cut short (SIGUSR1)"}
    assert engines[0].stop_reason == "SIGUSR1" and engines[0].drain_cut
