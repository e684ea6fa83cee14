"""Reading bodies inside aiohttp's protocol, and stamping requests as they go out, over real loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import aiohttp.web
import numpy as np
import pytest

from loadgen.client import _aiohttp as wire
from loadgen.client.config import EngineConfig, Plan
from loadgen.client.engine import Engine
from loadgen.records import RecordWriter, read_stream
from loadgen.workload.base import SyntheticChat

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
TAIL = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d}}\n\ndata: [DONE]\n\n'


class _Paced(asyncio.Protocol):
    """HTTP/1.1 keep-alive server: answers each request with ``n`` chunks ``gap_s`` apart.

    Notes the perf_counter_ns at which each request's bytes arrived. With ``drop_reused``
    it behaves like a server that closed an idle keep-alive connection just as the
    client reused it: a second request on a connection is read and dropped unanswered.
    """

    def __init__(self, log: dict[str, list], n: int, gap_s: float, drop_reused: bool) -> None:
        self.log, self.n, self.gap_s, self.drop_reused = log, n, gap_s, drop_reused
        self.buf = b""
        self.served = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport  # type: ignore[assignment]

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


async def _serve(log: dict[str, list], n: int, gap_s: float, drop_reused: bool = False) -> tuple[asyncio.Server, str]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Paced(log, n, gap_s, drop_reused), "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def _run(tmp_path: Path, n: int, gap_s: float, plan: Plan, drop_reused: bool = False) -> tuple[dict, dict]:
    log: dict[str, list] = {"arrived": [], "wrote": [], "dropped": []}

    async def go() -> None:
        server, url = await _serve(log, n, gap_s, drop_reused)
        async with server:
            with RecordWriter(tmp_path / "r.arrows") as w:
                engine = Engine(EngineConfig(url=url, model="m", run_id="t"), w)
                await engine.run(plan, time.perf_counter_ns() + 10_000_000, grace_s=20)

    asyncio.run(go())
    return read_stream(tmp_path / "r.arrows").to_pydict(), log


def test_the_hook_applies_to_the_installed_aiohttp() -> None:
    # if a future aiohttp changes StreamReader, reading silently falls back to readany; this says so
    assert wire._HOOKABLE, f"aiohttp {aiohttp.__version__}: StreamReader no longer fits the hook"


def test_each_read_is_stamped_when_it_arrives_not_when_the_task_next_runs(tmp_path: Path) -> None:
    wl = SyntheticChat(input_tokens=4, output_tokens=12)
    rec, log = _run(tmp_path, 12, 0.01, Plan(wl.session, np.zeros(1, dtype=np.int64), np.arange(1)))
    assert rec["status"] == ["ok"] and rec["output_tokens"] == [12]
    stamps = np.asarray(rec["chunk_ns"][0])
    wrote = np.asarray(log["wrote"])
    assert len(stamps) == len(wrote) == 12
    # every stamp follows its write, by loopback delivery time only (same machine, same clock)
    delay_ms = (stamps - wrote) / 1e6
    assert (delay_ms > 0).all(), delay_ms
    assert np.median(delay_ms) < 2, delay_ms


def test_t_sent_is_when_the_request_was_written(tmp_path: Path) -> None:
    wl = SyntheticChat(input_tokens=4, output_tokens=3)
    offs = (np.arange(20) * 5e6).astype(np.int64)
    rec, log = _run(tmp_path, 3, 0.002, Plan(wl.session, offs, np.arange(20)))
    assert set(rec["status"]) == {"ok"}
    sent = np.sort(np.asarray(rec["t_sent"]))
    arrived = np.sort(np.asarray(log["arrived"]))
    # prepared early, but held: no byte leaves before its intended instant
    assert (np.asarray(rec["t_sent"]) >= np.asarray(rec["t_sched"])).all()
    assert (arrived >= np.sort(np.asarray(rec["t_sched"]))).all()
    # written before the server had it, and not long before: no connect or queueing hidden in it
    assert (sent <= arrived).all()
    assert np.median((arrived - sent) / 1e6) < 2


def test_a_request_sent_on_a_connection_the_server_dropped_is_sent_again_once(tmp_path: Path) -> None:
    wl = SyntheticChat(input_tokens=4, output_tokens=2)
    rec, log = _run(tmp_path, 2, 0.001, Plan(wl.session, concurrency=1, count=5), drop_reused=True)
    assert rec["status"] == ["ok"] * 5
    # requests 2..5 each went out first on the pooled connection, which the server dropped
    assert len(log["dropped"]) == 4
    assert len(log["arrived"]) == 9


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
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def test_a_bad_event_mid_body_ends_the_request_as_bad_stream(tmp_path: Path) -> None:
    async def go() -> list[str]:
        pieces = [(CHUNK, 0.01), (b"data: {not json\n\n", 0.01), (CHUNK + b"data: [DONE]\n\n", 0.0)]
        async with _streaming(pieces) as url:
            with RecordWriter(tmp_path / "r.arrows") as w:
                engine = Engine(EngineConfig(url=url, model="m", run_id="t"), w)
                wl = SyntheticChat(input_tokens=4, output_tokens=3)
                await engine.run(
                    Plan(wl.session, np.zeros(2, dtype=np.int64), np.arange(2)),
                    time.perf_counter_ns() + 5_000_000,
                    grace_s=10,
                )
        return read_stream(tmp_path / "r.arrows").to_pydict()["status"]

    assert asyncio.run(go()) == ["bad_stream", "bad_stream"]


@pytest.mark.parametrize("split", [1, 7, len(CHUNK) + 3])
def test_reads_split_anywhere_are_all_delivered(split: int) -> None:
    body = CHUNK * 5 + TAIL % 5

    async def go() -> bytes:
        got: list[bytes] = []
        async with (
            _streaming([(body[i : i + split], 0.0) for i in range(0, len(body), split)]) as url,
            aiohttp.ClientSession() as http,
            http.get(url) as resp,
        ):
            await wire.read_body(resp.content, lambda d, t: got.append(d), time.perf_counter_ns)
        return b"".join(got)

    assert asyncio.run(go()) == body


def test_a_held_request_due_during_a_burst_of_reads_is_sent_from_the_first_read_after_its_instant() -> None:
    body = CHUNK * 6 + TAIL % 6
    ticks = iter(range(1, 1000))
    log: list[tuple[str, int]] = []
    due = [4]  # the instant of a held request, on a clock that ticks once per read

    def send_due(t: int) -> None:
        log.append(("send", t))
        due[0] = 1 << 62  # the engine moves it on to the next held request

    async def go() -> None:
        async with (
            _streaming([(body[i : i + len(CHUNK)], 0.005) for i in range(0, len(body), len(CHUNK))]) as url,
            aiohttp.ClientSession() as http,
            http.get(url) as resp,
        ):
            await wire.read_body(
                resp.content, lambda d, t: log.append(("read", t)), lambda: next(ticks), (due, send_due)
            )

    asyncio.run(go())
    sends = [i for i, (what, _) in enumerate(log) if what == "send"]
    assert len(sends) == 1
    i = sends[0]
    assert log[i - 1] == ("read", log[i][1]) and log[i][1] >= 4  # right after the read that passed it
    assert all(t < 4 for what, t in log[: i - 1] if what == "read")


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


def test_while_the_timer_cannot_run_held_requests_go_out_from_the_reads_of_other_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in for a loop busy with a burst of reads: the hold's own timer wakes 60 ms late
    (after the first request's, which starts the stream the others are due during). Requests
    due while another stream is being read still go out at their instant, from a read."""
    import loadgen.client.engine as engine_mod

    real_sleep = engine_mod.sleep_until
    holds: list[int] = []

    async def late_hold_timer(due: int, clock, *args, **kw):  # type: ignore[no-untyped-def]
        if kw.get("spin_ns") == 0:  # the dispatcher's own wait: untouched
            return await real_sleep(due, clock, *args, **kw)
        holds.append(due)
        return await real_sleep(due + (60_000_000 if len(holds) > 1 else 0), clock)

    monkeypatch.setattr(engine_mod, "sleep_until", late_hold_timer)
    wl = SyntheticChat(input_tokens=4, output_tokens=40)
    # the first request streams for ~80 ms (a chunk every 2 ms); the next seven fall due during
    # it; the last when every stream has ended
    offs = (np.array([0, 10, 20, 30, 40, 50, 60, 70, 400]) * 1e6).astype(np.int64)
    rec, log = _run(tmp_path, 40, 0.002, Plan(wl.session, offs, np.arange(9)))
    assert set(rec["status"]) == {"ok"}
    order = np.argsort(rec["t_sched"])
    lag_ms = ((np.asarray(rec["t_sent"]) - np.asarray(rec["t_sched"])) / 1e6)[order]
    assert (lag_ms[1:8] < 20).all(), lag_ms  # sent from a read, well before the late timer
    assert lag_ms[8] >= 60, lag_ms  # nothing streaming: only the (late) timer could send it
    assert (lag_ms >= 0).all() and (np.sort(log["arrived"]) >= np.sort(rec["t_sched"])).all()


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

    def write(self, data: bytes) -> None:
        pass


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _framed(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)


def _handler(now: list[int]) -> wire.StampingHandler:
    handler = wire.StampingHandler(asyncio.get_running_loop(), clock=lambda: now[0])
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
        t_headers = wire.arrived(content)
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


def test_a_body_that_is_not_read_is_let_go_with_its_connection() -> None:
    async def go() -> tuple[bool, bool]:
        now = [1]
        handler = _handler(now)
        handler.data_received(HEAD + _framed(CHUNK))
        _, content = await handler.read()
        held = content in wire._EARLY and content in wire._SINKS
        handler.connection_lost(None)
        return held, content in wire._EARLY or content in wire._SINKS or type(content) is not StreamReader

    from aiohttp.streams import StreamReader

    assert asyncio.run(go()) == (True, False)


def test_an_error_answer_is_not_hooked_and_reads_as_usual() -> None:
    async def go() -> bytes:
        handler = _handler([1])
        body = b'{"error": "overloaded"}'
        handler.data_received(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        _, content = await handler.read()
        assert wire.arrived(content) is None
        return await content.read(4096)

    assert asyncio.run(go()) == b'{"error": "overloaded"}'


def test_the_engine_stamps_answers_in_aiohttps_protocol() -> None:
    async def go() -> object:
        connector = aiohttp.TCPConnector()
        try:
            return getattr(connector, "_factory", None)
        finally:
            await connector.close()

    # if a future aiohttp renames its protocol factory, answers are stamped when the task reads them; this says so
    assert asyncio.run(go()) is not None, f"aiohttp {aiohttp.__version__}: TCPConnector has no _factory"
