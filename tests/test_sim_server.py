"""The simulated server on the wire: tokens written from inside the model's step.

Raw sockets, so the HTTP framing itself is checked (chunk sizes, HTTP/1.0), and so a reader can
be slow or leave mid-answer. The streaming writer alone, without a socket: test_sim_stream_writer.py.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import orjson

from loadgen.sim.answer import SimConfig, word_index
from loadgen.sim.model import FixedModel, TimingModel
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.server import SimServer
from loadgen.sim.stream_writer import StreamWriter
from loadgen.workload.tokenizer import BUILTIN, WORDS


def _request(port: int, body: dict, path: str = "/v1/chat/completions", version: str = "1.1") -> bytes:
    raw = orjson.dumps(body)
    return (
        f"POST {path} HTTP/{version}\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(raw)}\r\n\r\n"
    ).encode() + raw


def _dechunk(body: bytes) -> bytes:
    """The payload of a chunked body, checking every chunk's declared size."""
    out, i = [], 0
    while True:
        j = body.index(b"\r\n", i)
        size = int(body[i:j], 16)
        if size == 0:
            assert body[j + 2 :] == b"\r\n", body[j:]
            return b"".join(out)
        out.append(body[j + 2 : j + 2 + size])
        assert body[j + 2 + size : j + 4 + size] == b"\r\n"
        i = j + 4 + size


def _events(response: bytes) -> tuple[bytes, list[bytes]]:
    head, _, body = response.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    assert body.endswith(b"\n\n")
    events = body[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") for e in events)
    return head, [e[6:] for e in events]


async def _fetch(port: int, request: bytes, *, rcvbuf: int = 0, pause_s: float = 0.0) -> bytes:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    if pause_s:
        await asyncio.sleep(pause_s)  # a slow reader: the server's socket backs up
    chunks = []
    while data := await loop.sock_recv(sock, 1 << 16):
        chunks.append(data)
    sock.close()
    return b"".join(chunks)


def _serve(model: TimingModel, tmp_path: Path, coro_fn, **config: object) -> tuple[object, list[dict], SimServer]:
    truth = tmp_path / "truth.jsonl"
    server = SimServer(model, SimConfig(max_model_len=100_000, truth_path=str(truth), **config))  # type: ignore[arg-type]

    async def main() -> object:
        url = await server.start()
        try:
            return await coro_fn(int(url.rsplit(":", 1)[1].split("/")[0]))
        finally:
            await server.stop()

    result = asyncio.run(main())
    lines = [orjson.loads(x) for x in truth.read_bytes().splitlines()]
    return result, lines, server


def _words(req_prompt_len: int, start: int, n: int) -> str:
    class _R:
        prompt_ids = [0] * req_prompt_len

    return "".join(" " + WORDS[word_index(_R, k)] for k in range(start, start + n))  # type: ignore[arg-type]


def test_chat_stream_framing_words_and_truth(tmp_path):
    prompt = "the of and to in"
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": 40,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    model = RooflineModel("h100", "llama-3.1-8b", max_num_seqs=8)
    resp, truth, _ = _serve(model, tmp_path, lambda port: _fetch(port, _request(port, body)))
    head, ev = _events(resp)
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    chunks = [orjson.loads(e) for e in ev[:-1]]
    assert ev[-1] == b"[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:-2]
    assert len(tokens) == 40 and all(c["object"] == "chat.completion.chunk" for c in tokens)
    n_prompt = len(BUILTIN.encode(prompt))
    assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == _words(n_prompt, 0, 40)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40
    assert len({c["id"] for c in chunks}) == 1
    (t,) = truth
    assert len(t["emit_ns"]) == len(t["model_ns"]) == len(t["written_ns"]) == 40
    # modelled instant <= really emitted <= written to the socket, token by token
    assert all(m <= e <= w for m, e, w in zip(t["model_ns"], t["emit_ns"], t["written_ns"], strict=True))
    assert t["written_ns"] == sorted(t["written_ns"]) and not t["cancelled"]
    st = model.stats()
    assert st["steps_total"] >= 40 and st["generation_tokens_total"] == 40


class PunctualClock:
    """A model clock for the engine on the wire: the real clock, less every delay the machine added to
    the engine's waits, so that each step's end is met on this clock however loaded the box is. It
    runs at the real rate between waits, never goes back, and never runs ahead of the real clock, so
    the server's real-time stamps (arrivals, writes) still come after the model's instants."""

    def __init__(self) -> None:
        self.debt = 0  # real nanoseconds forgiven so far
        self.high = 0  # the latest reading handed out

    def _read(self) -> int:
        return time.perf_counter_ns() - self.debt

    def __call__(self) -> int:
        self.high = max(self.high, self._read())
        return self.high

    async def wait_until(self, t: int) -> None:
        while (left := t - self._read()) > 0:
            await asyncio.sleep(left / 1e9)
        self.debt += self._read() - max(t, self.high)  # however late this woke, it reads t now


def test_concurrent_streams_are_written_by_the_prepared_path(tmp_path, monkeypatch):
    """Several streams decoding together: the model formats each step's tokens before the step's end and
    writes them first thing at the end (``StreamWriter.fire``); what arrives is still exact, in order, and
    never written before its modelled instant.

    The prepared path is for steps on time: planned before their end, and woken within ``COALESCE_NS``
    of it. On the ``PunctualClock`` every wake-up is on time; a step still misses the path if, between
    the end of the step before and planning it, the engine's process is kept off its core for longer
    than a whole step (30 ms here), which a loaded 2-core box (slices of a few ms) does not do to most
    steps: at load average 10-13 all 80 tokens or all but two took it. The bytes the path writes are
    pinned down in test_sim_stream_writer.py."""
    fired: list[str] = []
    fire = StreamWriter.fire

    def counting_fire(self: StreamWriter) -> None:
        fired.append(self.req.rid)
        fire(self)

    monkeypatch.setattr(StreamWriter, "fire", counting_fire)
    n, streams = 20, 4
    prompts = [" ".join(["the"] * (k + 1)) for k in range(streams)]  # distinct prompts, distinct words
    bodies = [
        {"messages": [{"role": "user", "content": p}], "stream": True, "max_tokens": n, "ignore_eos": True}
        for p in prompts
    ]
    clock = PunctualClock()
    model = RooflineModel(
        "h100", "llama-3.1-8b", max_num_seqs=8, step_overhead_s=0.03, clock=clock, wait_until=clock.wait_until
    )

    async def fetch_all(port: int) -> list[bytes]:
        return list(await asyncio.gather(*(_fetch(port, _request(port, b)) for b in bodies)))

    resps, truth, _ = _serve(model, tmp_path, fetch_all)
    for prompt, resp in zip(prompts, resps, strict=True):
        _, ev = _events(resp)
        tokens = [orjson.loads(e) for e in ev[1:-2]]
        assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == _words(len(BUILTIN.encode(prompt)), 0, n)
    assert len(truth) == streams
    for t in truth:
        assert len(t["written_ns"]) == n and t["written_ns"] == sorted(t["written_ns"])
        assert all(m <= e <= w for m, e, w in zip(t["model_ns"], t["emit_ns"], t["written_ns"], strict=True))
        assert fired.count(t["rid"]) > n // 2  # most of every stream's tokens


def test_completions_stream_and_tokens_per_chunk(tmp_path):
    body = {"prompt": "a b c", "stream": True, "max_tokens": 10, "ignore_eos": True}
    resp, truth, _ = _serve(
        FixedModel(0.002, 0.001),
        tmp_path,
        lambda port: _fetch(port, _request(port, body, "/v1/completions")),
        tokens_per_chunk=3,
    )
    _, ev = _events(resp)
    chunks = [orjson.loads(e) for e in ev[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert [len(t.split()) for t in texts] == [3, 3, 3, 1]
    assert "".join(texts) == _words(len(BUILTIN.encode("a b c")), 0, 10)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len(truth[0]["written_ns"]) == 10


def test_http10_client_gets_an_unchunked_stream(tmp_path):
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 12, "ignore_eos": True}
    resp, truth, _ = _serve(
        FixedModel(0.002, 0.001), tmp_path, lambda port: _fetch(port, _request(port, body, version="1.0"))
    )
    head, ev = _events(resp)
    assert b"chunked" not in head.lower()
    assert len(ev) == 1 + 12 + 1 + 1  # role, tokens, finish, [DONE]
    assert len(truth[0]["written_ns"]) == 12


def test_a_slow_reader_backs_up_to_its_handler_and_loses_nothing(tmp_path):
    """ITL 0: all tokens are emitted at once, far more than the socket holds while nobody reads."""
    n = 20_000
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": n, "ignore_eos": True}
    resp, truth, _ = _serve(
        FixedModel(0.0, 0.0), tmp_path, lambda port: _fetch(port, _request(port, body), rcvbuf=4096, pause_s=0.3)
    )
    _, ev = _events(resp)
    tokens = [orjson.loads(e) for e in ev[1:-2]]
    assert len(tokens) == n
    assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == _words(len(BUILTIN.encode("hi")), 0, n)
    w = truth[0]["written_ns"]
    assert len(w) == n and w == sorted(w)


def test_a_reader_that_leaves_mid_answer_frees_its_sequence(tmp_path):
    model = RooflineModel("h100", "llama-3.1-8b", max_num_seqs=8)
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5000, "ignore_eos": True}

    async def leave(port: int) -> int:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(_request(port, body))
        got = b""
        while got.count(b"data: ") < 20:
            got += await r.read(4096)
        w.close()
        deadline = time.monotonic() + 5
        while model.stats()["num_requests_running"] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return int(model.stats()["num_requests_running"])

    running, truth, _ = _serve(model, tmp_path, leave)
    assert running == 0
    (t,) = truth
    # 20 events read, the first the role's: 19 tokens at least were written before the client left
    assert t["cancelled"] and 19 <= len(t["written_ns"]) < 5000


def test_stop_string_ends_the_stream_early(tmp_path):
    n_prompt = len(BUILTIN.encode("hi"))
    words = _words(n_prompt, 0, 30).split()
    stop = words[5]  # the 6th word: the answer is the first five and a space
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 30,
        "ignore_eos": True,
        "stop": " " + stop,
    }
    resp, _, _ = _serve(FixedModel(0.002, 0.001), tmp_path, lambda port: _fetch(port, _request(port, body)))
    _, ev = _events(resp)
    chunks = [orjson.loads(e) for e in ev[1:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == _words(n_prompt, 0, 30)[: _words(n_prompt, 0, 30).find(" " + stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_model_that_is_behind_coalesces_writes_and_loses_nothing(tmp_path):
    """Tokens emitted > 2 ms after their modelled instant go out together at the next yield."""

    class LateClock:  # the loop reads 50 ms more than the server's arrival stamps: it starts far behind
        def __call__(self) -> int:
            return time.perf_counter_ns() + 50_000_000

    model = RooflineModel("h100", "llama-3.1-8b", max_num_seqs=8, clock=LateClock())
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 60, "ignore_eos": True}
    resp, truth, _ = _serve(model, tmp_path, lambda port: _fetch(port, _request(port, body)))
    _, ev = _events(resp)
    tokens = [orjson.loads(e) for e in ev[1:-2]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == _words(len(BUILTIN.encode("hi")), 0, 60)
    w = truth[0]["written_ns"]
    assert len(w) == 60 and w == sorted(w)
    assert len(set(w)) < 60  # several tokens per write while it caught up
    assert model.stats()["late_steps_total"] >= 2


def test_metrics_escape_a_model_name_that_would_break_the_label() -> None:
    """A served model name with a quote, backslash or newline still gives parseable /metrics."""
    from loadgen.client.prometheus import fetch_metrics

    async def go() -> dict[str, float] | None:
        sim = SimServer(FixedModel(), SimConfig(model_name='odd "name"\\ with\nnewline'))
        url = await sim.start("127.0.0.1", 0)
        try:
            return await fetch_metrics(url.removesuffix("/v1") + "/metrics")
        finally:
            await sim.stop()

    samples = asyncio.run(go())
    assert samples is not None and samples


def test_a_request_whose_client_left_while_it_queued_leaves_the_engine_at_once(tmp_path):
    """A client that gives up on a queued request (a sweep's drain cut at an overloaded point)
    takes it out of the engine when its connection closes, not when its first token would have
    come: else the next point meets a backlog nobody waits for."""
    model = FixedModel(ttft_s=30.0, itl_s=0.01)  # the first token far away: the request queues

    async def leave(port: int) -> float:
        body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
        sock = socket.socket()
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, _request(port, body))
        await asyncio.sleep(0.3)  # received, waiting for its first token
        sock.close()
        t0 = time.monotonic()
        while not (tmp_path / "truth.jsonl").exists() or not (tmp_path / "truth.jsonl").read_bytes():
            if time.monotonic() - t0 > 10:
                break
            await asyncio.sleep(0.02)
        return time.monotonic() - t0

    waited, truth, _ = _serve(model, tmp_path, leave)
    (t,) = truth
    assert t["cancelled"] is True and t["emit_ns"] == []
    assert waited < 10  # (it ends when the connection closes; without that, 30 s on)
