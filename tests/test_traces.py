"""Trace replay: each format from a generated sample, windows, errors with line numbers."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from loadgen.errors import SpecError
from loadgen.workload.load import load_workload
from loadgen.workload.text import PREFIX_TOKENS
from loadgen.workload.tokenizer import BUILTIN


def spec(tmp_path: Path, fmt: str, path: str, extra: str = "") -> str:
    p = tmp_path / f"{fmt}.yaml"
    p.write_text(f"kind: trace\nformat: {fmt}\npath: {path}\n" + textwrap.dedent(extra))
    return str(p)


def write_lines(p: Path, rows: Sequence[object]) -> Path:
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


MOONCAKE = [
    {"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 1000, "input_length": 22, "output_length": 0, "hash_ids": [1, 2, 4]},
    {"timestamp": 1500, "input_length": 8, "output_length": 7, "hash_ids": [9]},
    {"timestamp": 4000, "input_length": 30, "output_length": 2, "hash_ids": [1, 2]},
]


# -- mooncake ---------------------------------------------------------------------------------


def test_mooncake_blocks_share_text_and_lengths_are_exact(tmp_path: Path) -> None:
    write_lines(tmp_path / "mc.jsonl", MOONCAKE)
    w = load_workload(spec(tmp_path, "mooncake", "mc.jsonl", "block_tokens: 8\n"), seed=1)
    s = [w.session(i).turns[0] for i in range(4)]
    assert [t.prompt_tokens for t in s] == [20, 22, 8, 30]
    assert [t.max_tokens for t in s] == [5, 1, 7, 2]  # a 0-token answer is asked for as 1
    assert [BUILTIN.count(t.text) for t in s] == [20, 22, 8, 30]
    words = [t.text.split() for t in s]
    assert words[0][:16] == words[1][:16]  # ids 1, 2: the same 16 tokens
    assert words[0][16:] != words[1][16:20]  # id 3 vs 4 (partial last blocks)
    assert words[3][:16] == words[0][:16]  # then 14 tokens of unique filler
    assert words[2][:8] != words[0][:8]
    np.testing.assert_array_equal(w.offsets_ns(), [0, 1_000_000_000, 1_500_000_000, 4_000_000_000])
    assert w.describe()["reuse"]["blocks_in_cached_prefix"] == pytest.approx(4 / 9)


def test_window_speed_and_max_requests(tmp_path: Path) -> None:
    write_lines(tmp_path / "mc.jsonl", MOONCAKE)
    w = load_workload(spec(tmp_path, "mooncake", "mc.jsonl", "speed: 2\nstart: 0.5\nwindow: 3\n"))
    np.testing.assert_array_equal(w.offsets_ns(), [0, 250_000_000])  # rows at 1.0 and 1.5 s
    assert w.size == 2 and w.session(0).turns[0].prompt_tokens == 22
    w = load_workload(spec(tmp_path, "mooncake", "mc.jsonl", "max_requests: 3\noutput_tokens: 9\n"))
    offsets = w.offsets_ns()
    assert offsets is not None and len(offsets) == 3 and w.session(2).turns[0].max_tokens == 9
    with pytest.raises(SpecError, match="start: no request"):
        load_workload(spec(tmp_path, "mooncake", "mc.jsonl", "start: 100\n"))


def test_a_finite_trace_wraps_around_under_a_new_prefix(tmp_path: Path) -> None:
    write_lines(tmp_path / "mc.jsonl", MOONCAKE)
    w = load_workload(spec(tmp_path, "mooncake", "mc.jsonl", "block_tokens: 8\n"))
    a, b = w.session(1).turns[0], w.session(5).turns[0]
    assert b.prompt_tokens == a.prompt_tokens + PREFIX_TOKENS
    assert b.text.endswith(a.text) and b.text != a.text
    assert w.session(5).session == 5


@pytest.mark.parametrize(
    ("row", "msg"),
    [
        ("{not json", r"mc\.jsonl:3: not valid JSON"),
        ('{"timestamp": 5, "input_length": -1, "output_length": 1}', r"mc\.jsonl:3: input_length: must be"),
        ('{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": 7}', r"mc\.jsonl:3: hash_ids"),
        ("[1, 2]", r"mc\.jsonl:3: each line must be a JSON object"),
    ],
)
def test_malformed_mooncake_lines_are_named(tmp_path: Path, row: str, msg: str) -> None:
    write_lines(tmp_path / "mc.jsonl", [MOONCAKE[0], MOONCAKE[1], row])
    with pytest.raises(SpecError, match=msg):
        load_workload(spec(tmp_path, "mooncake", "mc.jsonl"))


# -- azure and burstgpt -----------------------------------------------------------------------


def test_azure_csv_with_datetimes_and_no_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "az.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,48,10\n"
        "2023-11-16 18:17:04.0319600,31,8\n"
        "2023-11-16 18:17:05.9799600,11,27"
    )
    w = load_workload(spec(tmp_path, "azure", "az.csv"))
    np.testing.assert_array_equal(w.offsets_ns(), [0, 52_000_000, 2_000_000_000])
    t = [w.session(i).turns[0] for i in range(3)]
    assert [(x.prompt_tokens, x.max_tokens) for x in t] == [(48, 10), (31, 8), (11, 27)]
    assert [BUILTIN.count(x.text) for x in t] == [48, 31, 11]
    assert w.describe()["arrivals"]["requests"] == 3
    (tmp_path / "az.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,48,10\n2023-11-16 18:17:04,x1,8\n"
    )
    with pytest.raises(SpecError, match=r"az\.csv:3: ContextTokens: not a number: 'x1'"):
        load_workload(spec(tmp_path, "azure", "az.csv"))
    (tmp_path / "az.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,48,10\n1,inf,8\n")
    with pytest.raises(SpecError, match=r"az\.csv:3: ContextTokens: must be a whole number >= 0, not inf"):
        load_workload(spec(tmp_path, "azure", "az.csv"))
    (tmp_path / "az.csv").write_text("TIMESTAMP,Context\n2023-11-16 18:17:03.97,48\n")
    with pytest.raises(SpecError, match=r"az\.csv:1: missing column\(s\) ContextTokens, GeneratedTokens"):
        load_workload(spec(tmp_path, "azure", "az.csv"))


def test_burstgpt_reads_columns_by_name_and_filters(tmp_path: Path) -> None:
    (tmp_path / "b.csv").write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID\n"
        "5,ChatGPT,472,18,490,Conversation log,a\n"
        "6,GPT-4,100,0,100,Conversation log,b\n"
        "7.5,ChatGPT,30,0,30,API log,c\n"
        "9,ChatGPT,12,4,16,Conversation log,a\n"
    )
    w = load_workload(spec(tmp_path, "burstgpt", "b.csv"))
    assert w.size == 4 and w.session(1).turns[0].max_tokens == 1
    w = load_workload(spec(tmp_path, "burstgpt", "b.csv", "models: ChatGPT\nlog_types: [Conversation log]\n"))
    np.testing.assert_array_equal(w.offsets_ns(), [0, 4_000_000_000])
    assert [w.session(i).turns[0].prompt_tokens for i in range(2)] == [472, 12]
    (tmp_path / "c.csv").write_text("Request tokens,Timestamp,Response tokens\n3,0,1\n4,2\n")
    with pytest.raises(SpecError, match=r"c\.csv:3: 2 columns, the header has 3"):
        load_workload(spec(tmp_path, "burstgpt", "c.csv"))


# -- sharegpt ---------------------------------------------------------------------------------

SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "You are terse."},
            {"from": "human", "value": "What is the capital of France?"},
            {"from": "gpt", "value": "Paris is the capital."},
            {"from": "human", "value": "And of Spain?"},
            {"from": "gpt", "value": "Madrid."},
        ],
    },
    {"id": "b", "conversations": [{"from": "gpt", "value": "orphan answer"}]},
    {
        "id": "c",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello there"},
            {"role": "user", "content": "unanswered"},
        ],
    },
]


@pytest.mark.parametrize("jsonl", [False, True])
def test_sharegpt_sends_the_human_turns_at_recorded_answer_lengths(tmp_path: Path, jsonl: bool) -> None:
    p = tmp_path / "sg.json"
    if jsonl:
        write_lines(p, SHAREGPT)
    else:
        p.write_text(json.dumps(SHAREGPT, indent=1))
    w = load_workload(spec(tmp_path, "sharegpt", "sg.json", "think: 2\n"))
    assert w.size == 2 and w.offsets_ns() is None and w.describe()["skipped"] == 1
    s = w.session(0)
    assert s.system == "You are terse."
    assert [t.text for t in s.turns] == ["What is the capital of France?", "And of Spain?"]
    assert [t.max_tokens for t in s.turns] == [BUILTIN.count("Paris is the capital."), BUILTIN.count("Madrid.")]
    sys_n = BUILTIN.count("You are terse.")
    assert s.turns[0].prompt_tokens == sys_n + BUILTIN.count(s.turns[0].text)
    assert s.turns[1].prompt_tokens == s.turns[0].prompt_tokens + s.turns[0].max_tokens + 4
    assert s.turns[1].think_ns == 2_000_000_000
    assert [t.text for t in w.session(1).turns] == ["hi"]


def test_malformed_sharegpt_records_are_named(tmp_path: Path) -> None:
    bad = [SHAREGPT[0], {"conversations": [{"from": "robot", "value": "x"}]}]
    (tmp_path / "sg.json").write_text(json.dumps(bad))
    with pytest.raises(SpecError, match=r"sg\.json: record 1: conversations\[0\]\.from: unknown speaker"):
        load_workload(spec(tmp_path, "sharegpt", "sg.json"))
    (tmp_path / "sg.json").write_text('[\n{"conversations": []},\n{oops}\n]')
    with pytest.raises(SpecError, match=r"sg\.json:3: not valid JSON"):
        load_workload(spec(tmp_path, "sharegpt", "sg.json"))


# -- agentic (Weka / AgentX) ------------------------------------------------------------------


def agent_session(name: str, base: int) -> dict[str, Any]:
    sub = [
        {"t": 0.0, "type": "n", "in": 40, "out": 5, "hash_ids": [500, 501, 502], "think_time": 0.0},
        {"t": 3.0, "type": "n", "in": 60, "out": 6, "hash_ids": [500, 501, 502, 503], "think_time": 1.5},
    ]
    return {
        "id": name,
        "block_size": 16,
        "hash_id_scope": "local",
        "requests": [
            {"t": 0.0, "type": "n", "in": 50, "out": 10, "hash_ids": [1, 2, 3], "think_time": 0.0},
            {"t": 9.0, "type": "s", "in": 70 + base, "out": 8, "hash_ids": [1, 2, 3, 4], "think_time": 3.0},
            {"t": 20.0, "type": "subagent", "agent_id": "agent_001", "requests": sub},
            {"t": 22.0, "type": "subagent", "agent_id": "agent_002", "requests": sub},
            {"t": 30.0, "type": "n", "in": 95 + base, "out": 7, "hash_ids": [1, 2, 3, 4, 5], "think_time": 20.0},
            {"t": 40.0, "type": "n", "in": 60, "out": 4, "hash_ids": [1, 2, 3], "think_time": 200.0},
        ],
    }


def test_agentic_trace_sessions_children_and_think(tmp_path: Path) -> None:
    d = tmp_path / "agents"
    d.mkdir()
    (d / "trace_1.json").write_text(json.dumps(agent_session("trace_1", 0)))
    (d / "trace_2.json").write_text(json.dumps(agent_session("trace_2", 10)))
    w = load_workload(spec(tmp_path, "agentic", "agents", "speed: 2\nmax_think: 60\n"), seed=4)
    assert w.size == 2 and w.offsets_ns() is None
    s = w.session(0)
    assert [t.prompt_tokens for t in s.turns] == [50, 70, 95, 103]  # the last shrank: +1 token
    assert [BUILTIN.count(t.text) for t in s.turns] == [50, 10, 17, 1]
    assert [t.max_tokens for t in s.turns] == [10, 8, 7, 4]
    assert [t.think_ns for t in s.turns] == [0, 1_500_000_000, 10_000_000_000, 30_000_000_000]
    assert [t.role for t in s.turns] == ["user", "tool", "tool", "tool"]
    kids = s.turns[2].children
    assert len(kids) == 2 and all(len(k.turns) == 2 for k in kids)
    assert [t.prompt_tokens for t in kids[0].turns] == [40, 60]
    assert kids[0].turns[1].think_ns == 750_000_000
    # the subagents' first requests are the same blocks: the same text, a shared prefix
    assert kids[0].turns[0].text == kids[1].turns[0].text
    assert s.turns[0].text != w.session(1).turns[0].text  # ids are local to each file
    again = w.session(2)  # past the end: session 0 again, under a new prefix
    assert again.turns[2].children[0].session == 2
    assert again.turns[0].prompt_tokens == s.turns[0].prompt_tokens + PREFIX_TOKENS
    assert again.turns[2].children[0].turns[0].text.endswith(kids[0].turns[0].text)
    stats = w.describe()
    assert (stats["sessions"], stats["subagents"], stats["context_shrinks"]) == (2, 4, 2)
    w = load_workload(spec(tmp_path, "agentic", "agents", "max_context: 100\n"))
    assert len(w.session(0).turns) == 2


def test_malformed_agentic_trace_is_named(tmp_path: Path) -> None:
    bad = agent_session("t", 0)
    bad["requests"][2]["requests"][1]["in"] = "many"
    (tmp_path / "a.json").write_text(json.dumps(bad))
    with pytest.raises(SpecError, match=r"a\.json: requests\[2\]: requests\[1\]: in: must be a whole number"):
        load_workload(spec(tmp_path, "agentic", "a.json"))


def test_builtin_trace_specs_take_a_path_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_lines(tmp_path / "mc.jsonl", MOONCAKE)
    (tmp_path / "sg.json").write_text(json.dumps(SHAREGPT))
    (tmp_path / "a.json").write_text(json.dumps(agent_session("t", 0)))
    (tmp_path / "az.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.5,4,4\n1.5,5,5\n")
    (tmp_path / "b.csv").write_text(
        "Timestamp,Model,Request tokens,Response tokens,Log Type\n1,ChatGPT,5,5,Conversation log\n"
    )
    monkeypatch.chdir(tmp_path)  # override paths are relative to the working directory
    for name, path in (
        ("mooncake", "mc.jsonl"),
        ("sharegpt", "sg.json"),
        ("agentic-trace", "a.json"),
        ("azure", "az.csv"),
        ("burstgpt", "b.csv"),
    ):
        w = load_workload(name, overrides={"path": path})
        assert w.session(0).turns and w.describe()["path"] == str(tmp_path / path)
        orjson.dumps(w.describe())  # JSON-able for run.json, no numpy types
