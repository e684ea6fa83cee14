"""Agentic traffic with real tool calls: the spec's tools, the turn flow, the records and the figures.

A session offering tools sends the answer's calls back: the next turn's body carries the
assistant message with those calls (content null) and one ``role: tool`` message per call
id, with the turn's tool result; an answer that did not call goes on as without tools (the
tool result as a user message). The records' ``tool_calls`` counts each answer's calls
(null where no tools were offered), and the report shows how often answers called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fake_wire import Answer, FakeTransport, Read, run, sessions, tail

from loadgen.analysis.tool_use import COLUMNS, tool_use
from loadgen.client.transport import Exchange
from loadgen.errors import SpecError
from loadgen.records import Record, to_batch
from loadgen.report.terminal import tool_line
from loadgen.workload.load import load_workload
from loadgen.workload.session import Session, Turn

_HEAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'


def _chunk(delta: bytes, finish: bytes = b"null") -> bytes:
    return _HEAD + delta + b',"finish_reason":' + finish + b"}]}\n\n"


def _calls(*calls: tuple[str, str, str]) -> Answer:
    """An answer of tool calls in vLLM's shape, one (id, name, arguments) each, in parallel."""
    reads = [Read(0, _chunk(b'{"role":"assistant","content":""}'))]
    for i, (cid, name, args) in enumerate(calls):
        header = {"id": cid, "type": "function", "index": i, "function": {"name": name, "arguments": ""}}
        reads.append(Read(1, _chunk(b'{"tool_calls":[' + orjson.dumps(header) + b"]}")))
        frag = {"index": i, "function": {"arguments": args}}
        reads.append(Read(1, _chunk(b'{"tool_calls":[' + orjson.dumps(frag) + b"]}")))
    reads += [Read(1, _chunk(b"{}", b'"tool_calls"')), Read(0, tail(len(calls)))]
    return Answer(head_ms=5, reads=reads)


TOOLS = {"tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}], "tool_choice": "auto"}


def _agent(extra: dict[str, Any]) -> Session:
    return Session(
        session=0,
        system="sys",
        turns=(
            Turn("task", 8),
            Turn(" result one", 8, role="tool"),
            Turn(" result two", 8, role="tool", follow_up=" and then?"),
        ),
        extra=extra,
    )


def test_tool_calls_go_back_with_one_tool_message_per_call_id(tmp_path: Path) -> None:
    answers = {
        0: _calls(("call_a", "read_file", '{"path": "a.py"}'), ("call_b", "read_file", "b dot py")),
        1: Answer.tokens(2, ttft_ms=5, itl_ms=1),  # turn 1: no call
        2: Answer.tokens(2, ttft_ms=5, itl_ms=1),
    }
    bodies: dict[int, dict[str, Any]] = {}

    def answer(ex: Exchange) -> Answer:
        bodies[ex.seq] = orjson.loads(ex.body)
        return answers[ex.seq]

    recs, _, _ = run(tmp_path, lambda c: FakeTransport(c, answer), sessions([_agent(TOOLS)], [0]))
    assert recs["status"] == ["ok"] * 3
    assert recs["tool_calls"] == [2, 0, 0]  # the answers' calls: two, then none
    assert bodies[0]["tools"] == TOOLS["tools"] and bodies[0]["tool_choice"] == "auto"
    assert bodies[1]["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "b dot py"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": " result one"},
        {"role": "tool", "tool_call_id": "call_b", "content": " result one"},
    ]
    # turn 1's answer called nothing: turn 2 goes on as without tools, its follow-up in the same message
    assert bodies[2]["messages"][5:] == [
        {"role": "assistant", "content": "w0 w1 "},
        {"role": "user", "content": " result two and then?"},
    ]


def test_a_session_that_offers_no_tools_records_null_tool_calls(tmp_path: Path) -> None:
    answer = _calls(("call_a", "read_file", "x"))
    recs, _, _ = run(tmp_path, lambda c: FakeTransport(c, answer), sessions([_agent({})], [0]))
    assert recs["tool_calls"] == [None, None, None]
    assert recs["status"] == ["ok"] * 3  # the arguments were the answer's text, sent back as content


def test_the_agentic_spec_offers_its_default_tools_and_validates_its_own() -> None:
    s = load_workload("agentic").session(0)
    assert [t["function"]["name"] for t in s.extra["tools"]] == ["search_docs", "read_file", "run_tests"]
    assert s.extra["tools"][1]["function"]["parameters"] == {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    }
    assert s.extra["tool_choice"] == "auto"
    assert load_workload("agentic", overrides={"tools": []}).session(0).extra == {}
    named = load_workload("agentic", overrides={"tool_choice": "run_tests"}).session(0)
    assert named.extra["tool_choice"] == {"type": "function", "function": {"name": "run_tests"}}
    with pytest.raises(SpecError, match="tool_choice: 'grep'"):
        load_workload("agentic", overrides={"tool_choice": "grep"})


def test_a_spec_lists_its_own_tools_and_follow_ups(tmp_path: Path) -> None:
    spec = tmp_path / "a.yaml"
    spec.write_text(
        "kind: agentic\nfirst: 20\nturns: 3\ntool_result: 10\noutput: 8\nfollow_up: 5\n"
        "tools:\n  - name: grep\n    parameters: {pattern: string, max: integer}\n"
        "  - name: ls\n    parameters: {type: object, properties: {}}\n"
        "tool_choice: required\n"
        "subagents:\n  probability: 1\n  turns: 2\n  tools: []\n"
    )
    s = load_workload(str(spec)).session(0)
    assert [t["function"]["name"] for t in s.extra["tools"]] == ["grep", "ls"]
    assert s.extra["tools"][0]["function"]["parameters"]["required"] == ["pattern", "max"]
    assert s.extra["tool_choice"] == "required"
    assert s.turns[0].follow_up == "" and s.turns[1].follow_up and s.turns[1].prompt_tokens == 20 + 8 + 10 + 5
    assert s.turns[1].children[0].extra == {}  # its own: none
    spec.write_text("kind: agentic\nfirst: 20\nturns: 3\ntool_result: 10\noutput: 8\ntools:\n  - name: a b\n")
    with pytest.raises(SpecError, match=r"tools\[0\]\.name: 'a b'"):
        load_workload(str(spec))


def _rec(tool_calls: int | None, out: int, status: str = "ok", reasoning: int | None = None) -> Record:
    return Record(t_sched=10**9, output_tokens=out, tool_calls=tool_calls, status=status, reasoning_tokens=reasoning)


def test_the_figures_are_a_function_of_the_records() -> None:
    table = pa.Table.from_batches(
        [
            to_batch(
                [
                    _rec(1, 20),
                    _rec(2, 30, reasoning=10),  # its arguments: 20 of its 30
                    _rec(0, 50),
                    _rec(3, 99, status="timeout"),  # not an answer
                    _rec(None, 1000),  # offered no tools
                ]
            )
        ]
    )
    tu = tool_use(table)
    assert tu is not None
    assert (tu.answers, tu.called, tu.not_called, tu.calls) == (3, 2, 1, 3)
    assert tu.called_pct == pytest.approx(200 / 3) and tu.calls_per_answer == 1.0 and tu.calls_per_calling_answer == 1.5
    assert (tu.argument_tokens, tu.output_tokens) == (40, 100) and tu.argument_output_pct == 40.0
    assert tool_line(tu).startswith("tool calls: 2 of 3 answers called a tool (66.7%; 1 did not), 1.00 calls per")
    assert tool_use(pa.Table.from_batches([to_batch([_rec(None, 5)])])) is None and tool_line(None) == ""


def test_loadgen_run_agentic_against_the_simulator_calls_tools_end_to_end(tmp_path: Path, capsys: Any) -> None:
    from loadgen.cli.main import main

    out = tmp_path / "run"
    argv = ["run", "--workload", "agentic", "--sim-tool-calls", "0.5", "--rate", "50", "--requests", "4"]
    argv += ["--set", "turns=3", "--set", "think=0", "--set", "first=100", "--set", "tool_result=50"]
    argv += ["--set", "subagents.probability=0", "--salt", "none"]  # the same prompts each time
    argv += ["--output-tokens", "8", "--sim-ttft-ms", "2", "--sim-itl-ms", "1", "--no-live", "--no-report"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = pq_records(out)
    recs = table.to_pydict()
    assert all(s == "ok" for s in recs["status"]) and len(recs["status"]) == 12
    calls = recs["tool_calls"]
    assert all(c in (0, 1) for c in calls) and 0 < sum(calls) < 12  # the simulator calls one tool in about half
    finish = ["tool_calls" if c else "length" for c in calls]
    assert recs["finish_reason"] == finish
    tu = tool_use(table)
    assert tu is not None and tu.called == sum(calls) and tu.argument_tokens == 8 * sum(calls)
    assert f"tool calls: {sum(calls)} of 12 answers called a tool" in " ".join(printed.split())


def pq_records(run_dir: Path) -> pa.Table:
    return pq.read_table(run_dir / "records.parquet", columns=[*COLUMNS, "finish_reason"])


def test_run_json_describes_the_tools(tmp_path: Path) -> None:
    w = load_workload("agentic")
    described = json.loads(json.dumps(w.describe()))
    assert described["agent"]["tools"] == {"names": ["search_docs", "read_file", "run_tests"], "tool_choice": "auto"}
