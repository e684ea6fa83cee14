"""`loadgen check`'s verdict levels: FAIL for what breaks measurement or honesty, WARN for API
deviations, ``--strict`` failing on a WARN; judged on vLLM- and llama.cpp-shaped streams.

The servers (tests/openai_fakes.py) send what those engines send: vLLM's
``prompt_tokens_details: null`` and usage in a last chunk with empty choices, chunks whose
content is ``""`` (random weights) while usage counts them; llama.cpp's ``timings``, usage on
the completions finish chunk, any model name accepted, and connections it closes after an
answer while the client pools them.
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from junit_schema import junit_problems
from openai_fakes import FakeServer

from loadgen.conformance.check import run_check
from loadgen.conformance.check_client import CheckOptions
from loadgen.conformance.check_items import ITEMS, LEVELS, RESPONSES_ITEMS, item_case, non_stream, verdict
from loadgen.conformance.check_tokens import ignore_eos, max_tokens, usage_matches
from loadgen.conformance.ci_outputs import Case, Outcome, overall_status, to_json, to_junit, to_markdown
from loadgen.conformance.exchange import Stream, Wire
from loadgen.sim.thread import run_in_thread

TIMING_ITEMS = ("real-streaming", "concurrent-streams")


@contextmanager
def fake(style: str, **kw: Any) -> Iterator[FakeServer]:
    server = FakeServer(style, **kw)
    with run_in_thread(server, name=f"{style}-style server"):
        yield server


def check(url: str, **kw: Any) -> tuple[Outcome, dict[str, str]]:
    out = asyncio.run(run_check(CheckOptions(url=url, timeout_s=20, **kw)))
    return out, {c.name: c.status for c in out.cases}


def judged(status: dict[str, str], expected: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Items whose status is not the expected one (pass unless named); a timing item may be
    inconclusive on a loaded machine instead of passing."""
    wrong = {}
    for name, got in status.items():
        want = expected.get(name, "pass")
        if got != want and not (name in TIMING_ITEMS and want == "pass" and got == "inconclusive"):
            wrong[name] = (got, want)
    return wrong


# --------------------------------------------------------------------------- levels


def test_every_item_has_a_level_and_the_measurement_items_fail() -> None:
    assert set(LEVELS) == set(ITEMS) | set(RESPONSES_ITEMS) and set(LEVELS.values()) == {"fail", "warn"}
    for name in ("chat-stream-framing", "usage-matches-stream", "max-tokens", "ignore-eos", "real-streaming"):
        assert LEVELS[name] == "fail"
    for name in ("error-unknown-model", "error-malformed-body", "chat-role-first", "models-list"):
        assert LEVELS[name] == "warn"
    assert LEVELS["openai-client-stream"] == LEVELS["openai-client-nonstream"] == "fail"


@pytest.mark.parametrize(
    ("name", "given", "kept"),
    [
        ("error-unknown-model", "fail", "warn"),
        ("max-tokens", "fail", "fail"),
        ("error-unknown-model", "pass", "pass"),
        ("real-streaming", "inconclusive", "inconclusive"),
    ],
)
def test_a_fail_of_a_warn_level_item_is_a_warn(name: str, given: str, kept: str) -> None:
    case = item_case(name, given, "evidence")
    assert case.status == kept and case.data["level"] == LEVELS[name]


def _cases(*statuses: str) -> list[Case]:
    return [Case(name=f"c{i}", status=s) for i, s in enumerate(statuses)]


@pytest.mark.parametrize(
    ("statuses", "strict", "status", "code"),
    [
        (("pass", "skip"), False, "pass", 0),
        (("pass", "warn"), False, "warn", 0),
        (("pass", "warn"), True, "fail", 1),
        (("pass", "warn", "fail"), False, "fail", 1),
        (("pass", "inconclusive"), True, "pass", 0),
    ],
)
def test_check_status_and_exit_code(statuses: Sequence[str], strict: bool, status: str, code: int) -> None:
    assert verdict(_cases(*statuses), strict) == (status, code)


def test_overall_status_ranks_warn_below_inconclusive() -> None:
    assert overall_status(["pass", "warn"]) == "warn"
    assert overall_status(["warn", "inconclusive"]) == "inconclusive"
    assert overall_status(["warn", "fail"]) == "fail"


# --------------------------------------------------------------------------- recorded-style servers


def test_a_vllm_style_server_passes_every_item() -> None:
    """prompt_tokens_details: null in the non-streamed usage and not in the stream's is no deviation."""
    with fake("vllm") as server:
        out, status = check(server.url)
    assert judged(status, {}) == {}, [(c.name, c.status, c.message) for c in out.cases]
    assert out.status == "pass" and out.exit_code == 0
    assert "same text as streamed" in {c.name: c.message for c in out.cases}["non-stream-consistent"]


def test_a_vllm_random_weights_server_is_judged_by_usage() -> None:
    """Every token chunk has content "": usage counts them, so the streams streamed, and nothing fails."""
    with fake("vllm", empty_content=True) as server:
        out, status = check(server.url)
    msgs = {c.name: c.message for c in out.cases}
    assert judged(status, {"stop-sequence": "skip"}) == {}, msgs
    assert "usage says 64 tokens" in msgs["chat-stream-framing"]
    assert "64 generated chunks" in msgs["usage-matches-stream"]
    assert out.exit_code == 0


def test_a_llamacpp_style_server_warns_of_the_unknown_model_it_accepts() -> None:
    with fake("llamacpp") as server:
        out, status = check(server.url)
        strict, strict_status = check(server.url, strict=True)
    assert judged(status, {"error-unknown-model": "warn"}) == {}, [(c.name, c.status, c.message) for c in out.cases]
    assert (out.status, out.exit_code) == ("warn", 0)
    assert any("WARN" in n for n in out.notes)
    assert strict_status["error-unknown-model"] == "warn" and (strict.status, strict.exit_code) == ("fail", 1)


def test_requests_dropped_on_reused_connections_are_resent_on_every_path() -> None:
    """llama.cpp closes a connection after each answer while the client pools it: every request
    path of the check (streams, non-streamed answers, errors, /v1/models, the official client)
    resends what a reused connection lost, so no item fails for it."""
    with fake("llamacpp", drop_reused=True) as server:
        out, status = check(server.url)
    assert server.dropped > 0  # the race happened, and was survived
    assert judged(status, {"error-unknown-model": "warn"}) == {}, [(c.name, c.status, c.message) for c in out.cases]


# --------------------------------------------------------------------------- pure verdicts


def _chat_stream(usage: dict[str, Any], n: int = 4, content: str = " w") -> Stream:
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}] * n
    chunks += [{"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length"}]}]
    chunks += [{"choices": [], "usage": usage}]
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    w = Wire(status=200, content_type="text/event-stream", t_sent=0, t_done=10, reads=[(5, body)])
    return Stream.read(w, "chat")


def _answer(usage: dict[str, Any], content: str = "hello") -> Wire:
    body = {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "length"}]}
    return Wire(status=200, content_type="application/json", reads=[(1, orjson.dumps({**body, "usage": usage}))])


_STREAMED = {"prompt_tokens": 19, "total_tokens": 23, "completion_tokens": 4}


@pytest.mark.parametrize(
    ("usage", "status"),
    [
        ({**_STREAMED, "prompt_tokens_details": None, "completion_tokens_details": None}, "pass"),  # vLLM
        ({**_STREAMED, "prompt_tokens_details": {"cached_tokens": 16}}, "pass"),  # details the stream lacks
        ({**_STREAMED, "prompt_tokens": 20, "total_tokens": 24}, "fail"),  # another prompt count
        ({**_STREAMED, "total_tokens": 99}, "fail"),  # a total that is not the sum
        ({"prompt_tokens": 19, "completion_tokens": 4}, "fail"),  # no total
        ({**_STREAMED, "prompt_tokens_details": "x"}, "fail"),
    ],
)
def test_non_stream_compares_the_counts_not_the_key_set(usage: dict[str, Any], status: str) -> None:
    got, evidence = non_stream(_answer(usage), _chat_stream(_STREAMED))
    assert got == status, evidence
    if status == "fail":
        assert item_case("non-stream-consistent", got, evidence).status == "warn"


class _Drifting:
    """A tokenizer whose re-count of the streamed text is off by ``drift`` tokens."""

    name = "drifting"

    def __init__(self, drift: int) -> None:
        self.drift = drift

    def count(self, text: str) -> int:
        return len(text.split()) + self.drift

    def encode(self, text: str) -> list[int]:
        return list(range(self.count(text)))

    def decode(self, ids: Sequence[int]) -> str:
        return " w" * len(ids)

    def words(self, n: int, rng: np.random.Generator) -> str:
        return " w" * n


def test_usage_is_trusted_over_a_drifting_re_count() -> None:
    exact = _chat_stream({**_STREAMED, "completion_tokens": 64, "total_tokens": 83}, n=64)
    assert max_tokens(exact, 64, _Drifting(3))[0] == "pass"  # re-tokenized 67 > 64, usage says 64
    assert ignore_eos([exact], 64, _Drifting(3))[0] == "pass"
    status, evidence = usage_matches([exact], _Drifting(5))
    assert status == "pass" and "drift" in evidence
    assert usage_matches([exact], _Drifting(20))[0] == "fail"  # beyond any drift: usage is wrong
    under = _chat_stream({**_STREAMED, "completion_tokens": 50, "total_tokens": 69}, n=64)
    assert usage_matches([under], _Drifting(0))[0] == "fail"  # 64 chunks disprove 50 whatever the tokenizer
    over = _chat_stream({**_STREAMED, "completion_tokens": 70, "total_tokens": 89}, n=64)
    assert max_tokens(over, 64, None)[0] == "fail"


def test_empty_content_chunks_count_as_tokens_when_usage_counts_them() -> None:
    s = _chat_stream({**_STREAMED, "completion_tokens": 32, "total_tokens": 51}, n=32, content="")
    assert s.chunk_ns == [] and len(s.token_ns) == 32
    assert usage_matches([s], None)[0] == "pass"
    unsaid = _chat_stream({"prompt_tokens": 19, "completion_tokens": 0, "total_tokens": 19}, n=32, content="")
    assert unsaid.token_ns == []  # no usage for them: keep-alive noise, not tokens


# --------------------------------------------------------------------------- WARN in every output


def _outcome(kind: str = "check") -> Outcome:
    cases = [
        Case("models-list", "pass", "lists 1", suite=kind),
        Case("error-unknown-model", "warn", "HTTP 200, expected 4xx", suite=kind),
        Case("max-tokens", "fail", "usage 70", suite=kind),
        Case("real-streaming", "inconclusive", "stalled", suite=kind),
        Case("stop-sequence", "skip", "too short", suite=kind),
    ]
    return Outcome(kind=kind, title="t", status="fail", exit_code=1, header=[("model", "m")], cases=cases)


@pytest.mark.parametrize("kind", ["check", "gate"])
def test_junit_validates_against_the_common_schema(kind: str) -> None:
    xml = to_junit(_outcome(kind))
    assert junit_problems(xml) == []
    root = ET.fromstring(xml)
    assert "skipped" not in root.attrib and root.get("tests") == "5" and root.get("failures") == "1"
    suite = root.find("testsuite")
    assert suite is not None and suite.get("skipped") == "2"


def test_a_warn_is_a_passing_junit_testcase_with_a_note() -> None:
    root = ET.fromstring(to_junit(_outcome()))
    warn = next(tc for tc in root.iter("testcase") if tc.get("name") == "error-unknown-model")
    assert warn.find("failure") is None and warn.find("skipped") is None
    out = warn.find("system-out")
    assert out is not None and (out.text or "").startswith("WARN: HTTP 200")


def test_a_warn_shows_in_json_markdown_and_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from loadgen.conformance.ci_outputs import print_outcome

    outcome = _outcome()
    data = to_json(outcome)
    assert data["counts"]["warn"] == 1
    assert {c["name"]: c["status"] for c in data["cases"]}["error-unknown-model"] == "warn"
    md = to_markdown(outcome)
    assert re.search(r"\| error-unknown-model \| \*\*WARN\*\* \|", md) and "1 warn" in md
    print_outcome(outcome, Console(width=200, force_terminal=False))
    text = capsys.readouterr().out
    assert re.search(r"error-unknown-model[\s│]+WARN", text) and "1 warn" in text


def test_cli_check_strict_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loadgen.cli.main import main as cli_main

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    junit = tmp_path / "c.xml"
    with fake("llamacpp") as server:
        loose = cli_main(["check", "--endpoint", server.url, "--timeout", "20", "--junit", str(junit)])
        assert junit_problems(junit.read_bytes()) == []
        strict = cli_main(["check", "--endpoint", server.url, "--timeout", "20", "--strict"])
    assert (loose, strict) == (0, 1)
