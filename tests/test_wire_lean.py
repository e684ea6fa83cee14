"""The lean wire (client/wire) over real loopback: TLS with the run's options, the proxy fallback,
a cancelled exchange releasing its connection, the pool's limit, the connect timeout, and no resend
on a fresh connection.

(Both transports' shared behaviours, stamping, holding, the stale keep-alive resend, a bad event,
are in test_wire.py; the hostile endpoints in test_engine_hostile.py and test_hostile_endpoints.py;
the parser on byte literals in test_wire_parser.py.)
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadgen.client.config import EngineConfig, Plan
from loadgen.client.endpoint_options import EndpointOptions
from loadgen.client.engine import Engine
from loadgen.client.holds import HoldQueue
from loadgen.client.transport import Exchange, Held, WireError
from loadgen.client.wire.choice import transport_for
from loadgen.client.wire.connection import Connection
from loadgen.client.wire.pool import Pool
from loadgen.client.wire.transport import LeanTransport
from loadgen.records import RecordWriter, read_stream
from loadgen.workload.base import SyntheticChat
from tests.endpoint_servers import ManagedEndpoint, serving, tls_files

OK_STREAM = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
)
EVENTS = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'


def _engine_run(url: str, path: Path, http: EndpointOptions, n: int = 3) -> tuple[list[str], list[str], Engine]:
    async def go() -> Engine:
        cfg = EngineConfig(url=url, model="d", run_id="t", http=http, transport="lean")
        wl = SyntheticChat(input_tokens=4, output_tokens=3)
        with RecordWriter(path) as w:
            engine = Engine(cfg, w)
            offs = (np.arange(n) * 5e6).astype(np.int64)
            await engine.run(Plan(wl.session, offs, np.arange(n)), time.perf_counter_ns() + 5_000_000, 10.0)
        return engine

    engine = asyncio.run(go())
    rec = read_stream(path).to_pydict()
    return rec["status"], rec["error"], engine


def test_tls_uses_the_runs_ca_and_client_certificate_and_refuses_an_unknown_ca(tmp_path: Path) -> None:
    tls = tls_files(tmp_path)
    server = ManagedEndpoint()
    with serving(server.app(), tls.server_context(client_certs=True)) as port:
        url = f"https://127.0.0.1:{port}/v1"
        mutual = EndpointOptions(
            ca_bundle=str(tls.ca), client_cert=str(tls.client_cert), client_key=str(tls.client_key)
        )
        status, _, engine = _engine_run(url, tmp_path / "a.arrows", mutual)
        assert status == ["ok"] * 3 and engine.wire is not None and engine.wire.name == "lean"
        status, error, _ = _engine_run(url, tmp_path / "b.arrows", EndpointOptions(), n=1)  # the system's CAs
        assert status == ["disconnected"] and "certificate verify failed" in error[0]
    assert len(server.chats()) == 3


def test_insecure_tls_is_not_verified(tmp_path: Path) -> None:
    tls = tls_files(tmp_path)
    with serving(ManagedEndpoint().app(), tls.server_context()) as port:
        status, _, _ = _engine_run(
            f"https://127.0.0.1:{port}/v1", tmp_path / "r.arrows", EndpointOptions(insecure=True)
        )
    assert status == ["ok"] * 3


def test_a_proxy_in_the_environment_falls_back_to_aiohttp_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "")
    cfg = EngineConfig(url="https://api.example/v1", model="m")
    choice = transport_for(cfg)
    assert choice.name == "aiohttp" and "HTTPS_PROXY" in choice.fallback and "127.0.0.1:9" not in choice.fallback
    assert transport_for(EngineConfig(url="http://api.example/v1", model="m")).name == "lean"  # no HTTP_PROXY
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "api.example")
    assert transport_for(cfg)[1:] == ("lean", "")  # exempt: straight there
    asked = transport_for(EngineConfig(url="http://api.example/v1", model="m", transport="aiohttp"))
    assert asked.name == "aiohttp" and asked.fallback == ""


class _Server(asyncio.Protocol):
    """Answers each request as ``how`` says: ``ok``, ``never`` (reads it, says nothing), ``drop``
    (reads it, closes); counts connections and requests."""

    def __init__(self, log: dict[str, int], how: str) -> None:
        self.log, self.how = log, how

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: Any = transport
        self.log["connections"] += 1
        self.log["open"] += 1
        self.log["most_open"] = max(self.log["most_open"], self.log["open"])

    def connection_lost(self, exc: Exception | None) -> None:
        self.log["open"] -= 1

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" not in data:
            return
        self.log["requests"] += 1
        if self.how == "drop":
            self.t.close()
        elif self.how == "ok":
            self.t.write(OK_STREAM % (len(EVENTS), EVENTS))


@asynccontextmanager
async def _serve(how: str) -> AsyncIterator[tuple[str, dict[str, int]]]:
    log = {"connections": 0, "open": 0, "most_open": 0, "requests": 0}
    server = await asyncio.get_running_loop().create_server(lambda: _Server(log, how), "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions", log


def _ex(seq: int) -> Exchange:
    return Exchange(seq, b"{}", {"X-Loadgen-Seq": str(seq)}, 0)


def test_a_cancelled_exchange_closes_its_connection_and_frees_its_place() -> None:
    async def go() -> dict[str, int]:
        async with _serve("never") as (url, log):
            lean, clock = LeanTransport(url, connect_timeout_s=5.0), time.perf_counter_ns
            async with lean.open(clock, HoldQueue(clock), 1):
                task = asyncio.ensure_future(lean.exchange(_ex(1), lambda data, t: None))
                while log["requests"] < 1:
                    await asyncio.sleep(0.005)
                task.cancel()  # as the engine's request timer does
                with pytest.raises(asyncio.CancelledError):
                    await task
                while log["open"]:  # the server sees the connection go
                    await asyncio.sleep(0.005)
                second = asyncio.ensure_future(lean.exchange(_ex(2), lambda data, t: None))
                while log["requests"] < 2:  # the one place in the pool was freed: a new connection
                    await asyncio.sleep(0.005)
                second.cancel()
                await asyncio.gather(second, return_exceptions=True)
            return log

    log = asyncio.run(go())
    assert log["connections"] == 2 and log["most_open"] == 1


def test_the_pool_opens_no_more_than_its_limit_and_reuses_them() -> None:
    async def go() -> tuple[dict[str, int], list[int | None]]:
        async with _serve("ok") as (url, log):
            lean, clock = LeanTransport(url, connect_timeout_s=5.0), time.perf_counter_ns
            async with lean.open(clock, HoldQueue(clock), 2):
                exs = [_ex(i) for i in range(8)]
                await asyncio.gather(*(lean.exchange(ex, lambda data, t: None) for ex in exs))
            return log, [ex.status for ex in exs]

    log, statuses = asyncio.run(go())
    assert statuses == [200] * 8 and log["requests"] == 8
    assert log["connections"] == log["most_open"] == 2


def test_a_request_dropped_on_a_fresh_connection_is_not_sent_again() -> None:
    async def go() -> tuple[dict[str, int], WireError]:
        async with _serve("drop") as (url, log):
            lean, clock = LeanTransport(url, connect_timeout_s=5.0), time.perf_counter_ns
            async with lean.open(clock, HoldQueue(clock), 1):
                with pytest.raises(WireError) as e:
                    await lean.exchange(_ex(1), lambda data, t: None)
            return log, e.value

    log, error = asyncio.run(go())
    assert log["requests"] == log["connections"] == 1
    assert error.status == "disconnected" and "before any answer" in str(error)


@contextmanager
def _unanswered_port() -> Iterator[int]:
    """A port whose listener never accepts and whose queue is full: a connect to it hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port))  # the one place in its queue
    try:
        yield port
    finally:
        queued.close()
        listener.close()


def test_a_connect_that_outlasts_the_connect_timeout_is_a_timeout_and_frees_its_place() -> None:
    async def go(port: int) -> tuple[WireError, float, int]:
        clock = time.perf_counter_ns
        pool = Pool("127.0.0.1", port, None, 1, 0.2, clock, HoldQueue(clock))
        t0 = time.perf_counter()
        with pytest.raises(WireError) as e:
            await pool.take()
        took = time.perf_counter() - t0
        task = asyncio.current_task()
        assert task is not None and getattr(task, "cancelling", lambda: 0)() == 0  # the timer's cancel taken back
        return e.value, took, pool.opened

    with _unanswered_port() as port:
        error, took, opened = asyncio.run(go(port))
    assert error.status == "timeout" and str(error) == f"ServerTimeoutError: connection timeout to 127.0.0.1:{port}"
    assert 0.2 <= took < 5.0 and opened == 0


def test_a_request_cancelled_while_it_connects_is_cancelled_not_timed_out() -> None:
    async def go(port: int) -> tuple[bool, int]:
        clock = time.perf_counter_ns
        pool = Pool("127.0.0.1", port, None, 1, 0.2, clock, HoldQueue(clock))
        task = asyncio.ensure_future(pool.take())
        await asyncio.sleep(0.05)
        task.cancel()  # as a request timer or the drain's end does
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.3)  # past the connect timeout: its timer must not fire on anything
        return task.cancelled(), pool.opened

    with _unanswered_port() as port:
        cancelled, opened = asyncio.run(go(port))
    assert cancelled and opened == 0


class _Due:
    """A hold queue as a connection sees it: one request due at ``next_due``."""

    def __init__(self, at: int) -> None:
        self.next_due = at
        self.sent_at: list[int] = []

    def send_due(self, t: int) -> None:
        self.sent_at.append(t)
        self.next_due = 1 << 62

    async def hold(self, ex: Exchange, held: Held) -> None:
        raise AssertionError("a connection only sends what is due")


class _Nowhere:
    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        pass


def test_a_read_at_or_after_a_held_requests_instant_sends_it_and_each_read_keeps_its_stamp() -> None:
    async def go() -> tuple[list[int], list[tuple[bytes, int]], Exchange]:
        times = iter([100, 200, 300])
        due = _Due(at=150)
        conn = Connection(asyncio.get_running_loop(), lambda: next(times), due)
        conn.connection_made(_Nowhere())  # type: ignore[arg-type]  # a stand-in: all a connection asks of it
        reads: list[tuple[bytes, int]] = []
        ex = _ex(1)
        done = conn.begin(ex, lambda data, t: reads.append((data, t)))
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        conn.data_received(head)  # at 100: nothing due yet
        conn.data_received(b"3\r\nabc\r\n")  # at 200: the held request (due at 150) goes now
        conn.data_received(b"2\r\nde\r\n0\r\n\r\n")  # at 300
        await done
        return due.sent_at, reads, ex

    sent_at, reads, ex = asyncio.run(go())
    assert sent_at == [200]
    assert reads == [(b"abc", 200), (b"de", 300)]
    assert (ex.t_headers, ex.status, ex.content_type) == (100, 200, "text/event-stream")
