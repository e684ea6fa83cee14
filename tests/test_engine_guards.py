"""What the engine keeps of untrusted values, and how it survives its own parts failing (issue 13).

On virtual time, through the scripted transport: every error text is one clean line without
any of the run's secrets (raw, base64, hidden by a zero-width character, in the URL); values the
stream bounded are noted in ``error`` without changing the status; a housekeeping pass or a
writer that raises is counted and the run goes on, its timeouts (timers of their own) on time;
and the per-chunk token options reach the requests and the tallies.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
from fake_wire import MS, Answer, FakeTransport, Read, plan, run, sse

from loadgen.client.config import Timeouts
from loadgen.client.engine import Engine
from loadgen.client.transport import Exchange
from loadgen.clock import VirtualClock
from loadgen.records import Record, RecordWriter
from loadgen.workload.tokenizer import get_tokenizer

KEY = "sk-live-Q7mZ4tWb2Xp9"
URL_PASSWORD = "pw-77-Lr8Vn3Ks"
TICKS = 50_000  # a few dozen turns of the virtual loop


def _unsafe(text: str) -> bool:
    return any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or c in "\u200b\u202e\u2066" for c in text)


def test_an_error_body_echoing_the_secrets_is_kept_clean_and_without_them(tmp_path: Path) -> None:
    b64 = base64.b64encode(f"Bearer {KEY}".encode()).decode()
    hidden = KEY[:6] + "\u200b" + KEY[6:]  # a zero-width space would hide it from a plain search
    body = f"bad key {KEY} \x1b[31m{b64}\u202e {hidden} pw={URL_PASSWORD}\n" + "x" * 5000
    answer = Answer(status=401, error=body.encode(), retry_after=f"2\x1b[2J {KEY}")
    rec, _, _ = run(
        tmp_path,
        lambda c: FakeTransport(c, answer),
        plan([0]),
        api_key=KEY,
        url=f"http://user:{URL_PASSWORD}@fake/v1",
    )
    (error,) = rec["error"]
    assert rec["status"] == ["http_error"] and error.startswith("HTTP 401: bad key [REDACTED] [REDACTED]")
    for secret in (KEY, b64, URL_PASSWORD, KEY[8:]):
        assert secret not in error
    assert not _unsafe(error) and len(error) <= 300
    assert error.endswith("(Retry-After: 2 [REDACTED])")  # kept whole after a body cut short


def test_values_the_stream_bounded_are_noted_without_changing_the_status(tmp_path: Path) -> None:
    usage = {"prompt_tokens": 4, "completion_tokens": 3_000_000_000, "completion_tokens_details": {}}
    tail = b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n"
    answer = Answer(reads=[Read(0.0, sse(0)), Read(10.0, sse(1)), Read(0.0, tail)])
    rec, _, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0]))
    assert rec["status"] == ["ok"] and "3000000000" in rec["error"][0]
    assert rec["output_tokens_reported"] == [None]


def test_visible_content_and_reasoning_tokens_are_recorded(tmp_path: Path) -> None:
    think = b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}\n\n'
    usage = {"prompt_tokens": 4, "completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 2}}
    tail = b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n"
    answer = Answer(reads=[Read(0.0, think), Read(10.0, think), Read(10.0, sse(0)), Read(0.0, tail)])
    rec, _, _ = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0]))
    assert rec["status"] == ["ok"] and rec["reasoning_tokens"] == [2]
    assert abs(rec["t_first_content"][0] - (rec["t_first"][0] + 20 * MS)) < 50_000  # a few loop ticks


# -- the engine's own parts failing -----------------------------------------------------------------
class _FlakyWriter(RecordWriter):
    """Its first 11 flushes raise (a full disk, say): every housekeeping pass to 2.2 s, that of the
    timeout included; and adding the record of request 1 raises."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fails = 11

    def add(self, record: Record) -> None:
        if record.request == 1:
            raise OSError("no room for this one")
        super().add(record)

    def flush(self) -> None:
        if self.fails:
            self.fails -= 1
            raise OSError("disk full")
        super().flush()


def test_a_failing_writer_is_counted_and_loses_neither_the_run_nor_its_timeouts(tmp_path: Path) -> None:
    hang = Answer(head_ms=60_000.0)
    rec, _, engine = run(
        tmp_path,
        lambda c: FakeTransport(c, lambda ex: hang if ex.seq == 2 else Answer.tokens(3)),
        plan([0, 10, 20]),
        writer=_FlakyWriter,
        timeouts=Timeouts(first_byte=1.0),
    )
    # request 1's record was refused: counted, and written in its degraded form (ids, due time, status)
    assert sorted(rec["request"]) == [0, 1, 2]
    assert rec["status"] == ["ok", "ok", "timeout"]
    assert rec["error"][1] == "record could not be written in full: OSError: no room for this one"
    assert rec["t_sched"][1] - rec["t_sched"][0] == 10 * MS and rec["output_tokens"][1] is None
    assert engine.writer.degraded == 1
    took = rec["t_done"][2] - rec["t_sched"][2]
    assert 1000 * MS <= took <= 1000 * MS + TICKS  # on time, while every flush around it failed
    health = engine.live.health()
    assert health["writer_errors"] == 12 and health["last_engine_error"] == "writer.flush: OSError: disk full"


def test_a_housekeeping_pass_that_raises_is_counted_and_neither_the_flushes_nor_the_timeouts_stop(
    tmp_path: Path,
) -> None:
    flushed: list[int] = []

    def break_the_first_pass(engine: Engine, clock: VirtualClock, start: int) -> None:
        flush = engine._flush

        def flaky() -> None:
            flushed.append(clock())
            if len(flushed) == 1:
                raise RuntimeError("a bug in one pass")
            flush()

        engine._flush = flaky  # type: ignore[method-assign]  # the point: a pass that fails

    rec, _, engine = run(
        tmp_path,
        lambda c: FakeTransport(c, Answer(head_ms=60_000.0)),
        plan([0]),
        during=break_the_first_pass,
        timeouts=Timeouts(first_byte=1.0),
    )
    assert rec["status"] == ["timeout"] and rec["error"] == ["no output before the first-byte timeout"]
    took = rec["t_done"][0] - rec["t_sched"][0]
    assert 1000 * MS <= took <= 1000 * MS + TICKS
    assert len(flushed) >= 5  # the passes after the one that raised went on
    health: dict[str, Any] = engine.live.health()
    assert health["housekeeping_errors"] == 1 and "a bug in one pass" in health["last_engine_error"]


# -- per-chunk token counts: what the engine asks for and counts with ---------------------------------
def test_per_chunk_counts_ask_for_running_usage_and_count_with_the_configured_tokenizer(tmp_path: Path) -> None:
    """With ``continuous_usage`` every request asks for running usage; with a tokenizer and no
    running usage in the answer, each chunk's text is counted with it (loaded once per engine)."""
    bodies: list[dict[str, Any]] = []

    def answer(ex: Exchange) -> Answer:
        bodies.append(orjson.loads(ex.body))
        return Answer.tokens(3)

    rec, _, engine = run(
        tmp_path, lambda c: FakeTransport(c, answer), plan([0, 10]), continuous_usage=True, tokenizer="builtin"
    )
    assert engine.tokenizer is get_tokenizer("builtin")
    assert [b["stream_options"] for b in bodies] == [{"include_usage": True, "continuous_usage_stats": True}] * 2
    assert rec["status"] == ["ok"] * 2 and rec["output_tokens_source"] == ["tokenizer"] * 2


def test_without_those_options_the_requests_and_counts_are_as_before(tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []

    def answer(ex: Exchange) -> Answer:
        bodies.append(orjson.loads(ex.body))
        return Answer.tokens(3)

    rec, _, engine = run(tmp_path, lambda c: FakeTransport(c, answer), plan([0]))
    assert engine.tokenizer is None and bodies[0]["stream_options"] == {"include_usage": True}
    assert rec["output_tokens_source"] == ["usage"] and rec["chunk_tokens"] == [[1, 1, 1]]
