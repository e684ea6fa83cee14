"""`loadgen check`: passes the plain simulator, and each simulator fault fails the item it concerns."""

from __future__ import annotations

import asyncio
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from loadgen.cli.main import main as cli_main
from loadgen.conformance.check import run_check
from loadgen.conformance.check_client import CheckOptions
from loadgen.conformance.check_items import ITEMS, error_shape, overlap, real_streaming
from loadgen.conformance.ci_outputs import Outcome
from loadgen.conformance.exchange import LoopWatch, Stream, Wire
from loadgen.sim.answer import SimConfig
from loadgen.sim.faults import parse_faults
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer
from loadgen.sim.thread import serve_in_thread
from loadgen.workload.tokenizer import BUILTIN


@contextmanager
def sim(faults: str = "", itl_s: float = 0.005, **config: Any) -> Iterator[str]:
    """A fast fixed-latency simulator (TTFT 10 ms, ITL 5 ms: a 64-token answer takes 325 ms) served
    from a thread on loopback.

    It shares the box's CPUs with the client: on a loaded box either can stall for tens of ms.
    The simulator then writes its backlog at once, as any server on that box would, and the
    client reads what waited in its socket at once; an answer ten times longer than such a
    stall keeps both from looking like a buffered burst (or hiding one)."""
    cfg = SimConfig(faults=parse_faults(faults), max_model_len=4096, **config)
    server = SimServer(FixedModel(0.01, itl_s), cfg)
    with serve_in_thread(server) as url:
        yield url


def check(url: str, **kw: Any) -> tuple[Outcome, dict[str, str]]:
    out = asyncio.run(run_check(CheckOptions(url=url, timeout_s=20, **kw)))
    return out, {c.name: c.status for c in out.cases}


# The items judged on when chunks were read: a client too busy to read promptly makes them INCONCLUSIVE.
TIMING_ITEMS = ("real-streaming", "concurrent-streams")


def test_plain_simulator_passes_every_item() -> None:
    with sim() as url:
        out, status = check(url)
    assert list(status) == list(ITEMS)
    msgs = {c.name: c.message for c in out.cases}
    not_passed = {k: v for k, v in status.items() if v != "pass"}
    # On a loaded machine a timing item may not be judgeable; it says so, and never fails an honest endpoint.
    assert all(k in TIMING_ITEMS and v == "inconclusive" for k, v in not_passed.items()), msgs
    assert all("stalled" in msgs[k] for k in not_passed)
    assert out.exit_code == 0 and out.status == "pass"
    assert "then [DONE]" in msgs["chat-stream-framing"] and "'stop'" in msgs["stop-sequence"]


@pytest.mark.parametrize(
    ("fault", "fails", "itl_s"),
    [
        ("usage_under=0.5", "usage-matches-stream", 0.005),
        # A burst is told from a busy client's own only if the client looked late in the answer and saw
        # nothing yet: a longer answer (650 ms) leaves a loaded box's stalls (tens of ms) short beside it.
        ("buffered", "real-streaming", 0.010),
        ("ignore_max_tokens", "max-tokens", 0.005),
        ("malformed=1", "chat-stream-framing", 0.005),
        ("ignore_eos_ignored", "ignore-eos", 0.005),
    ],
)
def test_faults_fail_their_item(fault: str, fails: str, itl_s: float) -> None:
    with sim(fault, itl_s=itl_s) as url:
        out, status = check(url)
    assert status[fails] == "fail", [(c.name, c.status, c.message) for c in out.cases]
    assert out.exit_code == 1
    # what the fault does not touch still passes
    for item in ("models-list", "error-unknown-model", "error-malformed-body"):
        assert status[item] == "pass"
    if fault != "malformed=1":
        assert status["chat-stream-framing"] == "pass"
    if fault == "malformed=1":
        assert status["completions-stream-framing"] == "fail" and status["usage-matches-stream"] == "pass"


async def _hog(busy_s: float, idle_s: float) -> None:
    """Keep the event loop busy ``busy_s`` of every ``busy_s + idle_s`` seconds, as a loaded machine would."""
    while True:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < busy_s:
            pass
        await asyncio.sleep(idle_s)


async def _check_while_busy(url: str) -> Outcome:
    hog = asyncio.create_task(_hog(0.060, 0.005))
    try:
        return await run_check(CheckOptions(url=url, timeout_s=20))
    finally:
        hog.cancel()


@pytest.mark.timing
@pytest.mark.parametrize(("fault", "never"), [("", "fail"), ("buffered", "pass")])
def test_a_busy_client_gives_no_false_timing_verdict(fault: str, never: str) -> None:
    """A client whose loop is blocked 60 ms of every 65 cannot always tell streaming from a burst:
    the timing items then say INCONCLUSIVE, naming the stalls, and never give the wrong verdict."""
    with sim(fault) as url:
        out = asyncio.run(_check_while_busy(url))
    cases = {c.name: c for c in out.cases}
    for item in TIMING_ITEMS:
        assert cases[item].status != never, cases[item].message
        if cases[item].status == "inconclusive":
            assert "the client's event loop stalled" in cases[item].message
    if not fault:
        assert out.exit_code == 0, [(c.name, c.status, c.message) for c in out.cases if c.status == "fail"]


@pytest.mark.timing
def test_loop_watch_sees_a_stall() -> None:
    async def watched() -> list[int]:
        async with LoopWatch() as watch:
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.05:  # a callback that hogs the loop for 50 ms
                pass
            await asyncio.sleep(0.01)
        return watch.looks

    looks = asyncio.run(watched())
    gaps = [b - a for a, b in zip(looks, looks[1:], strict=False)]
    assert max(gaps) >= 50_000_000  # the stall, as one gap
    assert len(looks) >= 5  # and looks while the loop was free around it


def test_tokenizer_verifies_usage_exactly() -> None:
    with sim() as url:
        _, status = check(url, tokenizer=BUILTIN)
    assert status["usage-matches-stream"] == "pass"
    with sim("usage_under=0.8") as url:
        out, status = check(url, tokenizer=BUILTIN)
    assert status["usage-matches-stream"] == "fail"
    assert "tokenizer counts" in {c.name: c.message for c in out.cases}["usage-matches-stream"]


def test_cli_check_outputs_escape_endpoint_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    evil = "evil<script>|[x](http://e)"
    junit, md = tmp_path / "c.xml", tmp_path / "c.md"
    with sim(model_name=evil) as url:
        rc = cli_main(["check", "--endpoint", url, "--timeout", "20", "--junit", str(junit), "--markdown", str(md)])
    assert rc == 0
    root = ET.parse(junit).getroot()
    cases = root.findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == list(ITEMS)
    assert all(c.find("failure") is None for c in cases)
    text = md.read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text and "\\|" in text


# --------------------------------------------------------------------------- pure verdicts


def _wire(status: int, body: bytes, ctype: str = "application/json") -> Wire:
    return Wire(status=status, content_type=ctype, reads=[(1, body)])


@pytest.mark.parametrize(
    ("wire", "status"),
    [
        (_wire(404, b'{"error": {"message": "no such model", "type": "NotFoundError"}}'), "pass"),
        (_wire(200, b'{"choices": []}'), "fail"),  # accepted what it should refuse
        (_wire(422, b'{"detail": [{"msg": "field required"}]}'), "fail"),  # not an OpenAI error object
        (_wire(400, b'{"object": "error", "message": "flat"}'), "fail"),
        (_wire(500, b'{"error": {"message": "crash"}}'), "fail"),  # a 5xx is not a client error
        (Wire(error="no complete answer within 5 s"), "fail"),
    ],
)
def test_error_shape(wire: Wire, status: str) -> None:
    assert error_shape(wire)[0] == status


def _stream(
    times_ms: list[float],
    total_ms: float,
    start_ms: float = 0.0,
    end_ms: float | None = None,
    looks_ms: list[float] | None = None,
) -> Stream:
    """A chat stream whose output chunks arrived at the given times, read by a client whose
    event loop looked at ``looks_ms`` (default: every millisecond, an idle client)."""
    ns = [int(t * 1e6) for t in times_ms]
    end = end_ms if end_ms is not None else start_ms + total_ms
    looks = looks_ms if looks_ms is not None else [start_ms + i for i in range(int(end - start_ms) + 1)]
    w = Wire(
        status=200,
        content_type="text/event-stream",
        t_sent=int(start_ms * 1e6),
        t_done=int(end * 1e6),
        looks=[int(t * 1e6) for t in looks],
    )
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":" a"},"finish_reason":null}]}\n\n'
    w.reads = [(t, chunk) for t in ns] + [(w.t_done, b"data: [DONE]\n\n")]
    return Stream.read(w, "chat")


# A client that is busy 60 ms of every 65 (as on a box with load average 8): it looks only at 0, 65, 130, ...
_BUSY_LOOKS = [65.0 * i for i in range(12)]
# An honest 2 ms stream of 64 chunks (TTFT 10 ms) as that client reads it: each chunk just after the look that
# ends the stall it arrived in (the same wake-up).
_HONEST_BUSY = [next(t for t in _BUSY_LOOKS if t >= 10 + 2 * i) + 0.01 for i in range(64)]
# Busy for the first 130 ms, then idle (a look every millisecond) until the answer ends at 210 ms.
_BUSY_THEN_IDLE = [0.0, 65.0, 130.0] + [float(t) for t in range(131, 211)]


@pytest.mark.parametrize(
    ("times", "total", "looks", "status"),
    [
        ([50 + 10 * i for i in range(64)], 700, None, "pass"),
        ([699.0] * 64, 700, None, "fail"),  # one burst at the end, read by an idle client
        ([600 + 0.01 * i for i in range(64)], 700, None, "fail"),  # many reads, but all at the end
        ([100 * (1 + i // 16) for i in range(64)], 700, None, "fail"),  # four bursts: a proxy flushing blocks
        ([10.0, 20.0], 30, None, "skip"),
        (_HONEST_BUSY, 150, _BUSY_LOOKS, "inconclusive"),  # the client's stalls merged the reads
        ([209.5] * 64, 210, _BUSY_THEN_IDLE, "fail"),  # watched from 130 ms, nothing until the end: a burst
        ([195.01] * 64, 200, _BUSY_LOOKS, "inconclusive"),  # read as a 65 ms stall ended: may date from it
        ([699.0] * 64, 700, [], "inconclusive"),  # never watched: the burst may be the client's
    ],
)
def test_real_streaming_verdicts(times: list[float], total: float, looks: list[float] | None, status: str) -> None:
    got, evidence = real_streaming(_stream(times, total, looks_ms=looks))
    assert got == status, evidence
    if status == "inconclusive":
        assert "client's event loop stalled" in evidence


def test_a_busy_client_keeps_the_spread_it_saw() -> None:
    """Reads that show spread pass however busy the client was: a stall can hide spread, never make it."""
    looks = [5.0 * i for i in range(31)]  # a look every 5 ms: one stall-free read per 2-3 chunks
    times = [next(t for t in looks if t >= 10 + 2 * i) for i in range(64)]
    assert real_streaming(_stream(times, 150, looks_ms=looks))[0] == "pass"


def test_overlap_verdicts() -> None:
    together = [_stream([10 + 5 * i for i in range(20)], 120) for _ in range(8)]
    assert overlap(together)[0] == "pass"
    serial = [_stream([k * 200 + 10 + 5 * i for i in range(20)], 120, start_ms=k * 200) for k in range(8)]
    assert overlap(serial) == ("fail", "the 8 streams were served one at a time")
    pairs = [_stream([(k // 2) * 200 + 10 + 5 * i for i in range(20)], 120, start_ms=(k // 2) * 200) for k in range(8)]
    status, msg = overlap(pairs)
    assert status == "pass" and "at most 2 of 8" in msg
    buffered = [_stream([119.0] * 20, 120) for _ in range(8)]
    assert overlap(buffered)[0] == "skip"


def test_overlap_is_inconclusive_when_the_client_stalled() -> None:
    """Streams that look served one at a time, read by a client that looked only every 100 ms."""
    looks = [100.0 * i for i in range(17)]
    serial = [
        _stream([k * 200 + 10 + 5 * i for i in range(20)], 120, start_ms=k * 200, looks_ms=looks) for k in range(8)
    ]
    status, msg = overlap(serial)
    assert status == "inconclusive" and "stalled" in msg


def test_a_request_the_server_dropped_on_a_stale_keep_alive_connection_is_sent_once_more() -> None:
    """A server that closes an idle pooled connection as the next request arrives (llama.cpp does)
    answered nothing: the check resends once, as the engine does, instead of failing the item."""
    from loadgen.conformance.check import Checker
    from loadgen.conformance.check_client import check_session

    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while await reader.readuntil(b"\r\n\r\n"):
            await reader.readexactly(2)  # the b"{}" body
            if not first:  # a request on a reused connection: drop it unanswered
                writer.close()
                return
            first = False
            served.append(1)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    async def go() -> list[Wire]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        opts = CheckOptions(url=f"http://127.0.0.1:{port}/v1")
        async with server, check_session(opts) as http:
            checker = Checker(opts, http)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            return [await checker.request("POST", url, b"{}") for _ in range(2)]  # aiohttp itself retries a GET

    first, second = asyncio.run(go())
    assert (first.status, second.status) == (200, 200) and second.error is None
    assert len(served) == 2  # the second request was answered on a fresh connection


@pytest.mark.timing
@pytest.mark.parametrize(("fault", "never"), [("", "fail"), ("buffered", "pass")])
def test_a_cpu_busy_thread_in_the_client_process_flips_no_timing_verdict(fault: str, never: str) -> None:
    """A thread spinning on the CPU takes the GIL from the client's event loop (and the simulator's)
    for whole switch intervals: streaming is still not called buffered, nor a burst streaming."""
    import threading

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(10_000))

    hog = threading.Thread(target=spin, name="cpu hog", daemon=True)
    hog.start()
    try:
        with sim(fault, itl_s=0.010) as url:
            out, status = check(url)
    finally:
        stop.set()
        hog.join()
    msgs = {c.name: c.message for c in out.cases}
    for item in TIMING_ITEMS:
        assert status[item] != never, msgs[item]
    if not fault:
        assert out.exit_code == 0, [(c.name, c.status, c.message) for c in out.cases if c.status == "fail"]


def test_a_timing_verdict_short_of_pass_is_measured_once_more() -> None:
    from loadgen.conformance.check import Checker

    checker = Checker(CheckOptions(url="http://127.0.0.1:9/v1"), None)  # type: ignore[arg-type]  # sends nothing
    calls: list[int] = []

    def again(verdict: tuple[str, str]) -> Any:
        async def measure() -> tuple[str, str]:
            calls.append(1)
            return verdict

        return measure

    busy = asyncio.run(checker._timing("real-streaming", ("fail", "a burst"), again(("pass", "spread"))))
    assert (busy.status, len(calls)) == ("pass", 1) and "measured twice" in busy.message
    buffered = asyncio.run(checker._timing("real-streaming", ("fail", "a burst"), again(("fail", "a burst"))))
    assert buffered.status == "fail" and len(calls) == 2
    fine = asyncio.run(checker._timing("real-streaming", ("pass", "spread"), again(("fail", "x"))))
    assert fine.status == "pass" and len(calls) == 2  # a pass is not measured again
