"""The transports over real loopback (the lean wire and aiohttp, both ways), and aiohttp's internals
(_aiohttp.py) on a hand-fed protocol."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import numpy as np
import pytest

from loadgen.analysis.validity import client_caveats
from loadgen.client import _aiohttp as wire
from loadgen.client import aiohttp_transport
from loadgen.client import engine as engine_module
from loadgen.client._aiohttp_fit import fast_path
from loadgen.client.config import EngineConfig, Plan
from loadgen.client.engine import Engine
from loadgen.client.holds import HoldQueue
from loadgen.client.point import run_engine
from loadgen.client.settings import RunSettings
from loadgen.client.transport import NEVER, FastPath
from loadgen.records import RecordWriter, read_stream
from loadgen.schedule import Arrival
from loadgen.workload.base import SyntheticChat

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
TAIL = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d}}\n\ndata: [DONE]\n\n'


class _Paced(asyncio.Protocol):
    """HTTP/1.1 keep-alive server: answers each request with ``n`` chunks ``gap_s`` apart.

    Notes the perf_counter_ns at which each request's bytes arrived. With ``drop_reused``
    it behaves like a server that closed an idle keep-alive connection just as the
    client reused it: a second request on a connection is read and dropped unanswered.
    """

    def __init__(self, log: dict[str, list[Any]], n: int, gap_s: float, drop_reused: bool) -> None:
        self.log, self.n, self.gap_s, self.drop_reused = log, n, gap_s, drop_reused
        self.buf = b""
        self.served = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode().lower()
        length = int(head.split("content-length:")[1].split("\r\n")[0])
        if len(self.buf) < end + 4 + length:
            return
        self.log["arrived"].append(time.perf_counter_ns())
        self.buf = b""
        if self.drop_reused and self.served:
            self.log["dropped"].append(1)
            self.t.close()
            return
        self.served += 1
        asyncio.get_running_loop().create_task(self.answer())

    async def answer(self) -> None:
        self.t.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: keep-alive\r\n\r\n"
        )
        for _ in range(self.n):
            await asyncio.sleep(self.gap_s)
            self.log["wrote"].append(time.perf_counter_ns())
            self.t.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
        tail = TAIL % self.n
        self.t.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))


async def _serve(
    log: dict[str, list[Any]], n: int, gap_s: float, drop_reused: bool = False
) -> tuple[asyncio.Server, str]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Paced(log, n, gap_s, drop_reused), "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def _run(
    tmp_path: Path, n: int, gap_s: float, plan: Plan, drop_reused: bool = False, path: str = "lean"
) -> tuple[dict[str, list[Any]], dict[str, list[Any]], Engine]:
    log: dict[str, list[Any]] = {"arrived": [], "wrote": [], "dropped": []}

    async def go() -> Engine:
        server, url = await _serve(log, n, gap_s, drop_reused)
        async with server:
            with RecordWriter(tmp_path / "r.arrows") as w:
                engine = Engine(EngineConfig(url=url, model="m", run_id="t", transport=_wire(path)), w)
                await engine.run(plan, time.perf_counter_ns() + 10_000_000, grace_s=20)
        return engine

    engine = asyncio.run(go())
    return read_stream(tmp_path / "r.arrows").to_pydict(), log, engine


def _wire(path: str) -> str:
    return "lean" if path == "lean" else "aiohttp"


@pytest.fixture(params=["lean", "fast", "plain"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way a request can go: the lean wire (client.wire), aiohttp's fast path, or aiohttp's
    public API alone (as on an aiohttp whose internals no longer fit)."""
    if request.param == "plain":
        monkeypatch.setattr(aiohttp_transport, "fast_path", lambda connector: FastPath(False, "turned off by a test"))
    return str(request.param)


def test_the_fast_path_fits_the_installed_aiohttp() -> None:
    async def go() -> FastPath:
        connector = aiohttp.TCPConnector()
        try:
            return fast_path(connector)
        finally:
            await connector.close()

    fit = asyncio.run(go())
    # if a new aiohttp changes an internal the fast path uses, runs fall back to the plain way; this says so
    assert fit == FastPath(True, ""), f"aiohttp {aiohttp.__version__}: {fit.why}"


def test_the_fast_path_says_which_internal_is_missing() -> None:
    async def go() -> FastPath:
        connector = aiohttp.TCPConnector()
        try:
            del connector._factory
            return fast_path(connector)
        finally:
            await connector.close()

    fit = asyncio.run(go())
    assert not fit.ok and "TCPConnector._factory not found" in fit.why and aiohttp.__version__ in fit.why


@pytest.mark.timing
def test_each_read_is_stamped_when_it_arrives(tmp_path: Path) -> None:
    """The server writes a chunk every 10 ms. Each stamp follows its write (one clock: same
    process), by delivery only; a stamp nearer the next write than its own (half a gap)
    would belong to a read that waited for something else."""
    wl = SyntheticChat(input_tokens=4, output_tokens=12)
    rec, log, engine = _run(tmp_path, 12, 0.01, Plan(wl.session, np.zeros(1, dtype=np.int64), np.arange(1)))
    assert engine.fast_path.ok
    assert rec["status"] == ["ok"] and rec["output_tokens"] == [12]
    stamps = np.asarray(rec["chunk_ns"][0])
    wrote = np.asarray(log["wrote"])
    assert len(stamps) == len(wrote) == 12
    delay_ms = (stamps - wrote) / 1e6
    assert (delay_ms > 0).all(), delay_ms
    assert np.median(delay_ms) < 10 / 2, delay_ms


@pytest.mark.timing
def test_t_sent_is_when_the_request_was_written(tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests are prepared a lead before their instant; none is written before it, and t_sent
    is the write: had it been taken at preparation, the server would see each request a lead
    after it, so half a lead separates the two. The lead is 250 ms here, so that half of it
    stands above a loaded box's loop lag (14 ms seen at load average 4). Only
    the fast path prepares early and holds: the plain path stamps t_sent as it posts, and what
    follows is aiohttp's own time, which a loaded box stretches past any bound."""
    if path == "plain":
        pytest.skip("the plain path holds nothing: t_sent is its post")
    lead_ns = 250_000_000
    monkeypatch.setattr(engine_module, "LEAD_NS", lead_ns)
    wl = SyntheticChat(input_tokens=4, output_tokens=3)
    offs = (np.arange(20) * 5e6).astype(np.int64)
    rec, log, engine = _run(tmp_path, 3, 0.002, Plan(wl.session, offs, np.arange(20)), path=path)
    assert set(rec["status"]) == {"ok"} and engine.fast_path.ok == (path != "plain")
    sent = np.sort(np.asarray(rec["t_sent"]))
    arrived = np.sort(np.asarray(log["arrived"]))
    assert (np.asarray(rec["t_sent"]) >= np.asarray(rec["t_sched"])).all()  # never before its instant
    assert (arrived >= np.sort(np.asarray(rec["t_sched"]))).all()
    assert (sent <= arrived).all()
    assert np.median((arrived - sent) / 1e6) < lead_ns / 1e6 / 2


def test_a_request_sent_on_a_connection_the_server_dropped_is_sent_again_once(tmp_path: Path, path: str) -> None:
    wl = SyntheticChat(input_tokens=4, output_tokens=2)
    rec, log, _ = _run(tmp_path, 2, 0.001, Plan(wl.session, concurrency=1, count=5), drop_reused=True, path=path)
    assert rec["status"] == ["ok"] * 5
    # requests 2..5 each went out first on the pooled connection, which the server dropped
    assert len(log["dropped"]) == 4
    assert len(log["arrived"]) == 9


def test_without_the_fast_path_the_run_says_so_and_its_summary_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aiohttp_transport, "fast_path", lambda connector: FastPath(False, "aiohttp 9.9: gone"))
    log: dict[str, list[Any]] = {"arrived": [], "wrote": [], "dropped": []}

    async def go() -> dict[str, Any]:
        server, url = await _serve(log, 2, 0.001)
        async with server:
            arrival = Arrival("poisson", rate=50.0)
            settings = RunSettings(endpoint=url, model="m", arrival=arrival, requests=3, transport="aiohttp")
            wl = SyntheticChat(input_tokens=4, output_tokens=2)
            return await run_engine(settings, wl, url, "m", tmp_path, "t", api_key=None)

    client = asyncio.run(go())
    assert client["fast_read"] is False and client["records"] == 3
    assert client["transport"] == "aiohttp" and client["transport_fallback"] == ""
    probe = [client[k] for k in ("loop_lag_p99_ms", "loop_lag_max_ms", "read_lateness_p99_ms")]  # the self-check
    assert all(isinstance(v, float) and v >= 0 for v in probe) and probe[0] <= probe[1]
    (warning,) = [c.message for c in client_caveats(client) if c.code == "slow_path"]
    assert "aiohttp 9.9: gone" in warning and "slower path" in warning
    assert not [c for c in client_caveats({**client, "fast_read": True}) if c.code == "slow_path"]


@asynccontextmanager
async def _streaming(pieces: list[tuple[bytes, float]]) -> AsyncIterator[str]:
    """An aiohttp server answering any request with ``pieces`` (bytes, then a pause); yields its base URL."""

    async def handler(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for data, pause in pieces:
            await resp.write(data)
            await asyncio.sleep(pause)
        return resp

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _session(clock: Callable[[], int], holds: Any, stamping: bool = True) -> AsyncIterator[aiohttp.ClientSession]:
    """A client session whose connections are StampingHandlers (as the engine's), or plain ones."""
    connector = aiohttp.TCPConnector()
    if stamping:
        wire.install(connector, clock, holds)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as http:
        yield http


def test_a_bad_event_mid_body_ends_the_request_as_bad_stream(tmp_path: Path, path: str) -> None:
    async def go() -> list[str]:
        pieces = [(CHUNK, 0.01), (b"data: {not json\n\n", 0.01), (CHUNK + b"data: [DONE]\n\n", 0.0)]
        async with _streaming(pieces) as url:
            with RecordWriter(tmp_path / "r.arrows") as w:
                engine = Engine(EngineConfig(url=url, model="m", run_id="t", transport=_wire(path)), w)
                wl = SyntheticChat(input_tokens=4, output_tokens=3)
                await engine.run(
                    Plan(wl.session, np.zeros(2, dtype=np.int64), np.arange(2)),
                    time.perf_counter_ns() + 5_000_000,
                    grace_s=10,
                )
        return list(read_stream(tmp_path / "r.arrows").to_pydict()["status"])

    assert asyncio.run(go()) == ["bad_stream", "bad_stream"]


@pytest.mark.parametrize("stamping", [True, False], ids=["hooked", "readany"])
@pytest.mark.parametrize("split", [1, 7, len(CHUNK) + 3])
def test_reads_split_anywhere_are_all_delivered(split: int, stamping: bool) -> None:
    body = CHUNK * 5 + TAIL % 5

    async def go() -> bytes:
        got: list[bytes] = []
        clock = time.perf_counter_ns
        async with (
            _streaming([(body[i : i + split], 0.0) for i in range(0, len(body), split)]) as url,
            _session(clock, HoldQueue(clock), stamping) as http,
            http.get(url) as resp,
        ):
            await wire.read_body(resp.content, lambda d, t: got.append(d), clock)
        return b"".join(got)

    assert asyncio.run(go()) == body


class _Due:
    """Stands in for the engine's hold queue: one held request, due at ``at`` on a ticking clock."""

    def __init__(self, at: int, log: list[tuple[str, int]]) -> None:
        self.next_due, self.log = at, log

    def send_due(self, t: int) -> None:
        self.log.append(("send", t))
        self.next_due = NEVER  # the queue moves on to its next held request (none)

    async def hold(self, ex: Any, held: Any) -> None:
        raise AssertionError("not used here")


def test_a_held_request_due_during_a_burst_of_reads_is_sent_from_the_first_read_after_its_instant() -> None:
    body = CHUNK * 6 + TAIL % 6
    ticks = iter(range(1, 1000))
    log: list[tuple[str, int]] = []

    def clock() -> int:
        return next(ticks)

    async def go() -> None:
        async with (
            _streaming([(body[i : i + len(CHUNK)], 0.005) for i in range(0, len(body), len(CHUNK))]) as url,
            _session(clock, _Due(5, log)) as http,
            http.get(url) as resp,
        ):
            await wire.read_body(resp.content, lambda d, t: log.append(("read", t)), clock)

    asyncio.run(go())
    sends = [i for i, (what, _) in enumerate(log) if what == "send"]
    assert len(sends) == 1
    i = sends[0]
    assert log[i - 1] == ("read", log[i][1]) and log[i][1] >= 5  # right after the read that passed it
    assert all(t < 5 for what, t in log[: i - 1] if what == "read")


class _FakeTransport:
    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def test_held_bytes_go_out_once_in_one_write() -> None:
    real = _FakeTransport()
    held = wire.HeldWrite(real)
    held.writelines([b"POST / HTTP/1.1\r\n", b"\r\n"])
    held.write(memoryview(b"{}"))
    assert real.out == [] and held.get_extra_info("peername") == "extra peername"
    held.send()
    held.send()
    assert real.out == [b"POST / HTTP/1.1\r\n\r\n{}"] and held.sent and not held.lost


def test_held_bytes_for_a_closed_connection_are_lost_and_dropped_ones_never_go_out() -> None:
    real = _FakeTransport()
    held = wire.HeldWrite(real)
    held.write(b"request")
    real.closing = True
    held.send()
    assert held.lost and real.out == []
    real.closing = False
    dropped = wire.HeldWrite(real)
    dropped.write(b"request")
    dropped.drop()
    dropped.send()
    assert real.out == [] and not dropped.lost


class _Quiet(asyncio.Transport):
    """A transport that goes nowhere: the protocol is fed by hand."""

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _framed(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)


def _handler(now: list[int]) -> wire.StampingHandler:
    handler = wire.StampingHandler(asyncio.get_running_loop(), lambda: now[0], HoldQueue(lambda: now[0]))
    handler.connection_made(_Quiet())
    handler.set_response_params(read_until_eof=False, auto_decompress=False, read_timeout=None, read_bufsize=2**16)
    return handler


def test_reads_before_the_task_reads_the_body_keep_the_time_they_arrived() -> None:
    async def go() -> tuple[int | None, list[tuple[bytes, int]]]:
        now = [1000]
        handler = _handler(now)
        handler.data_received(HEAD + _framed(CHUNK))  # the first token with the headers
        now[0] = 2000
        handler.data_received(_framed(CHUNK))  # another before the task gets to the body
        now[0] = 9000  # the task runs late (a burst of other reads, say)
        _, content = await handler.read()
        t_headers = wire.answer_arrived(content)
        got: list[tuple[bytes, int]] = []
        task = asyncio.ensure_future(wire.read_body(content, lambda d, t: got.append((d, t)), lambda: now[0]))
        await asyncio.sleep(0)
        now[0] = 9500
        handler.data_received(_framed(CHUNK, TAIL % 3) + b"0\r\n\r\n")
        await task
        return t_headers, got

    t_headers, got = asyncio.run(go())
    assert t_headers == 1000
    assert [t for _, t in got] == [1000, 2000, 9500, 9500]
    assert b"".join(d for d, _ in got) == CHUNK * 3 + TAIL % 3


def test_reads_of_a_body_cut_before_its_task_reads_it_are_handed_over_then_the_cut() -> None:
    # A loaded loop: the stream's reads and the cut all come before the request's task runs.
    async def go() -> tuple[list[bytes], BaseException | None]:
        now = [1000]
        handler = _handler(now)
        handler.data_received(HEAD + _framed(CHUNK))
        handler.data_received(_framed(CHUNK, CHUNK))
        handler.connection_lost(None)
        _, content = await handler.read()
        got: list[bytes] = []
        try:
            await wire.read_body(content, lambda d, t: got.append(d), lambda: now[0])
        except aiohttp.ClientPayloadError as e:
            return got, e
        return got, None

    got, cut = asyncio.run(go())
    assert b"".join(got) == CHUNK * 3
    assert cut is not None


def test_an_error_answer_is_not_hooked_and_reads_as_usual() -> None:
    async def go() -> bytes:
        handler = _handler([1])
        body = b'{"error": "overloaded"}'
        handler.data_received(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        _, content = await handler.read()
        assert wire.answer_arrived(content) is None and handler.lg_body is None
        return bytes(await content.read(4096))

    assert asyncio.run(go()) == b'{"error": "overloaded"}'


def test_an_answer_with_no_body_is_not_hooked() -> None:
    async def go() -> bool:
        handler = _handler([1])
        handler.data_received(b"HTTP/1.1 204 No Content\r\n\r\n")
        _, content = await handler.read()
        return wire.answer_arrived(content) is None and handler.lg_body is None

    assert asyncio.run(go())
