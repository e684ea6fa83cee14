"""`loadgen check`: passes the plain simulator, and each simulator fault fails the item it concerns."""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loadgen.cli.main import main as cli_main
from loadgen.conformance.check import CheckOptions, run_check
from loadgen.conformance.check_items import ITEMS, error_shape, overlap, real_streaming
from loadgen.conformance.ci_outputs import Outcome
from loadgen.conformance.exchange import Stream, Wire
from loadgen.sim.answer import SimConfig
from loadgen.sim.faults import parse_faults
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer
from loadgen.sim.thread import serve_in_thread
from loadgen.workload.tokenizer import BUILTIN


@contextmanager
def sim(faults: str = "", **config: object) -> Iterator[str]:
    """A fast fixed-latency simulator (TTFT 10 ms, ITL 2 ms) served from a thread on loopback."""
    cfg = SimConfig(faults=parse_faults(faults), max_model_len=4096, **config)  # type: ignore[arg-type]
    server = SimServer(FixedModel(0.01, 0.002), cfg)
    with serve_in_thread(server) as url:
        yield url


def check(url: str, **kw: object) -> tuple[Outcome, dict[str, str]]:
    out = asyncio.run(run_check(CheckOptions(url=url, timeout_s=20, **kw)))  # type: ignore[arg-type]
    return out, {c.name: c.status for c in out.cases}


def test_plain_simulator_passes_every_item() -> None:
    with sim() as url:
        out, status = check(url)
    assert list(status) == list(ITEMS)
    assert {k: v for k, v in status.items() if v != "pass"} == {}, [c.message for c in out.cases]
    assert out.exit_code == 0 and out.status == "pass"
    msgs = {c.name: c.message for c in out.cases}
    assert "then [DONE]" in msgs["chat-stream-framing"] and "'stop'" in msgs["stop-sequence"]


@pytest.mark.parametrize(
    ("fault", "fails"),
    [
        ("usage_under=0.5", "usage-matches-stream"),
        ("buffered", "real-streaming"),
        ("ignore_max_tokens", "max-tokens"),
        ("malformed=1", "chat-stream-framing"),
        ("ignore_eos_ignored", "ignore-eos"),
    ],
)
def test_faults_fail_their_item(fault: str, fails: str) -> None:
    with sim(fault) as url:
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


def _stream(times_ms: list[float], total_ms: float, start_ms: float = 0.0, end_ms: float | None = None) -> Stream:
    """A chat stream whose output chunks arrived at the given times."""
    ns = [int(t * 1e6) for t in times_ms]
    w = Wire(
        status=200,
        content_type="text/event-stream",
        t_sent=int(start_ms * 1e6),
        t_done=int((end_ms if end_ms is not None else start_ms + total_ms) * 1e6),
    )
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":" a"},"finish_reason":null}]}\n\n'
    w.reads = [(t, chunk) for t in ns] + [(w.t_done, b"data: [DONE]\n\n")]
    return Stream.read(w, "chat")


def test_real_streaming_verdicts() -> None:
    assert real_streaming(_stream([50 + 10 * i for i in range(64)], 700))[0] == "pass"
    assert real_streaming(_stream([699.0] * 64, 700))[0] == "fail"  # one burst at the end
    assert real_streaming(_stream([600 + 0.01 * i for i in range(64)], 700))[0] == "fail"
    assert real_streaming(_stream([10.0, 20.0], 30))[0] == "skip"


def test_overlap_verdicts() -> None:
    together = [_stream([10 + 5 * i for i in range(20)], 120) for _ in range(8)]
    assert overlap(together)[0] == "pass"
    serial = [_stream([k * 200 + 10 + 5 * i for i in range(20)], 120, start_ms=k * 200) for k in range(8)]
    assert overlap(serial) == ("fail", "the 8 streams were served one at a time")
    pairs = [_stream([(k // 2) * 200 + 10 + 5 * i for i in range(20)], 120, start_ms=(k // 2) * 200) for k in range(8)]
    status, msg = overlap(pairs)
    assert status == "pass" and "at most 2 of 8" in msg
