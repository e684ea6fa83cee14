"""What the engine keeps of untrusted values, and how it survives its own parts failing (issue 13).

On virtual time, through the scripted transport: every error text is one clean line without
any of the run's secrets (raw, base64, hidden by a zero-width character, in the URL); values the
stream bounded are noted in ``error`` without changing the status; a housekeeping pass or a
writer that raises is counted and the run goes on, timeouts still enforced.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
from fake_wire import MS, Answer, FakeTransport, Read, plan, run, sse

from loadgen.client.config import Timeouts
from loadgen.client.engine import Engine
from loadgen.clock import VirtualClock
from loadgen.records import Record, RecordWriter

KEY = "sk-live-Q7mZ4tWb2Xp9"
URL_PASSWORD = "pw-77-Lr8Vn3Ks"
HOUSEKEEPING = 200 * MS


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
    assert sorted(rec["request"]) == [0, 2]  # request 1's record was refused: counted, the rest kept
    assert rec["status"] == ["ok", "timeout"]
    took = rec["t_done"][1] - rec["t_sched"][1]
    assert 1000 * MS <= took <= 1000 * MS + HOUSEKEEPING + MS  # enforced by a pass whose flush failed
    health = engine.live.health()
    assert health["writer_errors"] == 12 and health["last_engine_error"] == "writer.flush: OSError: disk full"


def test_a_housekeeping_pass_that_raises_is_counted_and_the_next_one_enforces_the_timeouts(tmp_path: Path) -> None:
    def break_the_first_pass(engine: Engine, clock: VirtualClock, start: int) -> None:
        enforce, calls = engine.sessions.enforce_timeouts, []

        def flaky(now: int) -> None:
            calls.append(now)
            if len(calls) == 1:
                raise RuntimeError("a bug in one pass")
            enforce(now)

        engine.sessions.enforce_timeouts = flaky  # type: ignore[method-assign]  # the point: a pass that fails

    rec, _, engine = run(
        tmp_path,
        lambda c: FakeTransport(c, Answer(head_ms=60_000.0)),
        plan([0]),
        during=break_the_first_pass,
        timeouts=Timeouts(first_byte=1.0),
    )
    assert rec["status"] == ["timeout"] and rec["error"] == ["no data before the first-byte timeout"]
    took = rec["t_done"][0] - rec["t_sched"][0]
    assert 1000 * MS <= took <= 1000 * MS + HOUSEKEEPING + MS
    health: dict[str, Any] = engine.live.health()
    assert health["housekeeping_errors"] == 1 and "a bug in one pass" in health["last_engine_error"]
