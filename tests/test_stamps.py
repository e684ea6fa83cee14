"""When a request starts and ends, as the record says: ``t_sent`` just before its bytes are handed
to the socket, ``t_done`` at its answer's last read (not after the HTTP client's cleanup), and how
its stream ended (``stream_end``).

``t_sent`` is checked against a real loopback server in a thread of its own, which stamps each
request's bytes as they arrive (``perf_counter_ns``: CLOCK_MONOTONIC, one clock for both sides).
The client's clock takes 3 ms to read, as a loaded host that preempts the client between the write
and the stamp does: stamped after the write, a request would reach the server before its t_sent.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_wire import MS, Answer, FakeTransport, Read, plan, run, sse, tail

from loadgen.client.aiohttp_transport import AiohttpTransport
from loadgen.client.holds import HoldQueue
from loadgen.client.transport import SEQ_HEADER, Exchange

TICKS = 50_000  # 50 us of virtual time
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
_ANSWER = b"data: [DONE]\n\n"
_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (
    len(_ANSWER),
    _ANSWER,
)


class _StampingServer:
    """HTTP/1.1 keep-alive on 127.0.0.1, a thread per connection: stamps each request's first
    bytes as they arrive, by its X-Loadgen-Seq, and answers a bare [DONE]."""

    def __init__(self) -> None:
        self.arrived: dict[int, int] = {}
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf, first = b"", 0
        with conn:
            while data := conn.recv(65536):
                first = first or time.perf_counter_ns()
                buf += data
                head, sep, rest = buf.partition(b"\r\n\r\n")
                if not sep:
                    continue
                fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
                length = int(fields.get(b"Content-Length", b"0"))
                if len(rest) < length:
                    continue
                self.arrived[int(fields[SEQ_HEADER.encode()])] = first
                buf, first = rest[length:], 0
                conn.sendall(_RESPONSE)


@pytest.fixture
def server() -> Iterator[_StampingServer]:
    s = _StampingServer()
    yield s
    s.sock.close()


def _slow_clock() -> int:
    time.sleep(0.003)  # the host runs something else for 3 ms (the GIL released: the server reads)
    return time.perf_counter_ns()


def test_a_server_never_receives_a_request_before_its_t_sent(server: _StampingServer) -> None:
    """Requests 0-3 are written at once (their instant has passed), 4-7 held 30 ms to their instant."""

    async def go() -> dict[int, int]:
        transport = AiohttpTransport(
            f"http://127.0.0.1:{server.port}/v1/chat/completions", connect_timeout_s=5.0, read_bufsize=1 << 16
        )
        holds = HoldQueue(_slow_clock)
        sent: dict[int, int] = {}
        async with transport.open(_slow_clock, holds, 8) as fit:
            assert fit.ok
            now = time.perf_counter_ns()

            async def one(seq: int) -> None:
                at = 0 if seq < 4 else now + 30 * MS
                ex = Exchange(seq, b'{"n": %d}' % seq, {SEQ_HEADER: str(seq)}, at)
                await transport.exchange(ex, lambda data, t: None)
                assert ex.status == 200 and ex.t_sent is not None
                sent[seq] = ex.t_sent

            await asyncio.gather(*(one(seq) for seq in range(8)))
        return sent

    sent = asyncio.run(go())
    assert sorted(server.arrived) == list(range(8))
    early = {seq: (server.arrived[seq] - t) / MS for seq, t in sent.items() if server.arrived[seq] < t}
    assert not early, f"received before t_sent (ms): {early}"


def test_t_done_is_the_last_read_not_the_end_of_the_http_clients_cleanup(tmp_path: Path) -> None:
    """The last read (usage and [DONE]) arrives 70 ms after the write; the client then spends 2 ms
    releasing the connection, which is not part of the answer."""
    reads = [Read(0.0, sse(0)), Read(10.0, sse(1)), Read(10.0, tail(2))]
    answer = Answer(head_ms=50.0, reads=reads, cleanup_ms=2.0)
    rec, wire, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0.0]))
    assert rec["status"] == ["ok"]
    t_last_read = wire.written(0).t + 70 * MS
    assert abs(rec["t_done"][0] - t_last_read) < TICKS  # (it would be 2 ms later, at the cleanup's end)
    assert abs(rec["t_done"][0] - rec["t_last"][0] - 10 * MS) < TICKS  # the last token came a read before


def test_t_done_of_a_failure_is_when_it_ended(tmp_path: Path) -> None:
    """A disconnect after the last read: the record ends when the client learnt of it."""
    answer = Answer(head_ms=50.0, reads=[Read(0.0, sse(0))], end="disconnect", cleanup_ms=2.0)
    rec, wire, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0.0]))
    assert rec["status"] == ["disconnected"] and rec["stream_end"] == [None]
    assert rec["t_done"][0] - (wire.written(0).t + 50 * MS) >= 2 * MS


@pytest.mark.parametrize(
    "reads,status,end",
    [
        ([Read(0.0, sse(0)), Read(10.0, tail(1))], "ok", "done"),
        ([Read(0.0, sse(0)), Read(10.0, FINISH)], "ok", "finish"),  # whole answer, its framing not
        ([Read(0.0, sse(0))], "disconnected", "eof"),
    ],
    ids=["done", "finish", "eof"],
)
def test_how_a_200_stream_ended_is_recorded(tmp_path: Path, reads: list[Read], status: str, end: str) -> None:
    rec, _, _ = run(tmp_path, lambda c: FakeTransport(c, Answer(reads=reads)), plan([0.0]))
    assert rec["status"] == [status] and rec["stream_end"] == [end]


def test_an_answer_that_is_not_a_200_stream_has_no_stream_end(tmp_path: Path) -> None:
    answer = Answer(status=503, error=b"busy")
    rec, _, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0.0]))
    assert rec["status"] == ["http_error"] and rec["stream_end"] == [None]
