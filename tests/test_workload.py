"""Workload specs: validation with file:line: field, session structure, determinism."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from loadgen.errors import ConfigError, SpecError
from loadgen.workload.base import Base, SyntheticChat
from loadgen.workload.load import builtin_specs, load_workload
from loadgen.workload.session import Session
from loadgen.workload.synthetic import RagWorkload
from loadgen.workload.text import PREFIX_TOKENS
from loadgen.workload.tokenizer import BUILTIN

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "w.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def session_bytes(s: Session) -> bytes:
    return orjson.dumps(dataclasses.asdict(s))


def check_context(s: Session, system_tokens: int | None = None) -> None:
    """prompt_tokens = system + earlier texts + earlier answers (max_tokens) + this text,
    and every text is exactly as long as that says (built-in tokenizer)."""
    ctx = BUILTIN.count(s.system) if s.system else 0
    if system_tokens is not None:
        assert ctx == system_tokens
    for t in s.turns:
        assert t.prompt_tokens == ctx + BUILTIN.count(t.text)
        assert t.max_tokens >= 1
        ctx = t.prompt_tokens + t.max_tokens
        for c in t.children:
            check_context(c)


CHAT = """
kind: chat
system: 50
turns: {type: uniform, low: 2, high: 4}
input: {type: lognormal, mean: 40, sigma: 0.5, min: 5, max: 200}
output: {type: normal, mean: 20, std: 5, min: 4}
think: {type: uniform, low: 1, high: 2}
"""

AGENTIC = """
kind: agentic
system: 100
first: 60
turns: {type: uniform, low: 4, high: 8}
tool_result: {type: lognormal, median: 30, sigma: 0.5}
output: 10
think: {type: fixed, value: 0.5}
subagents:
  probability: 1.0
  count: 2
  system: 40
  turns: 2
  first: 20
"""

RAG = """
kind: rag
system: 20
documents:
  count: 50
  tokens: {type: uniform, low: 30, high: 60}
k: 3
zipf_alpha: 1.2
question: 8
output: 16
"""


# -- built-in specs ------------------------------------------------------------------


def test_builtin_synthetic_specs_build_consistent_sessions() -> None:
    specs = builtin_specs()
    assert {
        "chat",
        "chat-multiturn",
        "rag",
        "agentic",
        "mooncake",
        "azure",
        "burstgpt",
        "sharegpt",
        "agentic-trace",
    } <= set(specs)
    for name in ("chat", "chat-multiturn", "rag", "agentic"):
        w = load_workload(name, seed=3)
        assert isinstance(w, Base) and w.describe()["kind"] == w.kind
        orjson.dumps(w.describe())  # JSON-able for run.json
        for i in range(3):
            check_context(w.session(i))


def test_synthetic_chat_keeps_its_constructor() -> None:
    w = SyntheticChat(input_tokens=32, output_tokens=8, seed=1, salt="p0")
    t = w.session(2).turns[0]
    assert (t.prompt_tokens, t.max_tokens, BUILTIN.count(t.text)) == (32, 8, 32)
    assert w.offsets_ns() is None and w.size is None


# -- chat ------------------------------------------------------------------------------


def test_multiturn_chat_grows_its_context(tmp_path: Path) -> None:
    w = load_workload(str(write(tmp_path, CHAT)), seed=1)
    systems = set()
    for i in range(20):
        s = w.session(i)
        check_context(s, system_tokens=50)
        systems.add(s.system)
        assert 2 <= len(s.turns) <= 4
        assert s.turns[0].think_ns == 0
        assert all(1e9 <= t.think_ns <= 2e9 for t in s.turns[1:])
        assert all(5 <= BUILTIN.count(t.text) <= 200 for t in s.turns)
    assert len(systems) == 1  # one shared system prompt: a prefix cache sees it


def test_salt_is_a_shared_prefix_that_changes_per_point(tmp_path: Path) -> None:
    p = str(write(tmp_path, CHAT))
    plain, a, a2, b = (load_workload(p, salt=s) for s in ("", "pt1", "pt1", "pt2"))
    s0, s1 = a.session(0), a.session(1)
    assert s0.system == s1.system  # shared within a load point
    assert s0.system != b.session(0).system  # cold for the next point
    assert session_bytes(s0) == session_bytes(a2.session(0))
    plain_system = plain.session(0).system
    assert s0.system is not None and plain_system is not None and s0.system.endswith(plain_system)
    delta = [x.prompt_tokens - y.prompt_tokens for x, y in zip(s0.turns, plain.session(0).turns, strict=True)]
    assert delta == [PREFIX_TOKENS] * len(s0.turns)
    check_context(s0)


# -- agentic ---------------------------------------------------------------------------


def test_agentic_sessions_have_growing_prefix_think_time_and_children(tmp_path: Path) -> None:
    w = load_workload(str(write(tmp_path, AGENTIC)), seed=2)
    s = w.session(0)
    check_context(s, system_tokens=100)
    assert [t.role for t in s.turns] == ["user"] + ["tool"] * (len(s.turns) - 1)
    assert BUILTIN.count(s.turns[0].text) == 60
    assert all(t.think_ns == 500_000_000 for t in s.turns[1:])
    assert s.turns[0].children == ()
    child_systems = set()
    for t in s.turns[1:]:
        assert len(t.children) == 2
        for c in t.children:
            assert len(c.turns) == 2 and BUILTIN.count(c.turns[0].text) == 20
            assert c.system is not None and BUILTIN.count(c.system) == 40
            child_systems.add(c.system)
    assert len(child_systems) == 1 and s.system not in child_systems
    # the children of different turns differ (their own streams)
    assert s.turns[1].children[0].turns[0].text != s.turns[2].children[0].turns[0].text


def test_agentic_max_context_ends_the_session(tmp_path: Path) -> None:
    p = write(tmp_path, AGENTIC.replace("subagents:", "max_context: 300\nsubagents:"))
    for i in range(10):
        turns = load_workload(str(p)).session(i).turns
        assert all(t.prompt_tokens + t.max_tokens <= 300 for t in turns[1:])


# -- rag -------------------------------------------------------------------------------


def test_rag_documents_are_identical_wherever_reused(tmp_path: Path) -> None:
    w = load_workload(str(write(tmp_path, RAG)), seed=5)
    assert isinstance(w, RagWorkload)
    again = load_workload(str(write(tmp_path, RAG, "again.yaml")), seed=5)
    assert isinstance(again, RagWorkload)
    holders: dict[int, list[int]] = {}
    for j in range(40):
        docs = w.docs(j)
        assert len(set(docs)) == 3  # without replacement within a request
        for d in docs:
            holders.setdefault(d, []).append(j)
        s = w.session(j)
        check_context(s)
        assert s.turns[0].text.startswith("".join(w.doc_text(d) for d in docs))
    d, js = max(holders.items(), key=lambda kv: len(kv[1]))
    assert len(js) > 1
    for j in js:
        assert w.doc_text(d) in w.session(j).turns[0].text
    assert again.doc_text(d) == w.doc_text(d)  # a pure function of (seed, j)
    assert BUILTIN.count(w.doc_text(d)) == w.doc_lengths[d]
    reuse = w.describe()["reuse"]
    assert 0 < reuse["doc_tokens_in_cached_prefix"] <= reuse["doc_tokens_seen_before"] < 1


def test_rag_zipf_popularity_and_sorted_order(tmp_path: Path) -> None:
    w = load_workload(str(write(tmp_path, RAG + "order: sorted\n")), seed=0)
    assert isinstance(w, RagWorkload)
    counts = [0] * 50
    for j in range(600):
        docs = w.docs(j)
        assert docs == sorted(docs)
        for d in docs:
            counts[d] += 1
    assert counts[0] > counts[3] > counts[20]
    assert counts[0] > 0.6 * 600  # rank 0 in most requests at alpha 1.2, k=3


# -- determinism -----------------------------------------------------------------------

_DIGEST = """
import dataclasses, hashlib, sys
import orjson
from loadgen.workload.load import load_workload
h = hashlib.sha256()
for spec in sys.argv[1:]:
    w = load_workload(spec, seed=7, salt="s")
    for i in range(12):
        h.update(orjson.dumps(dataclasses.asdict(w.session(i))))
print(h.hexdigest())
"""


def test_same_spec_and_seed_give_the_same_bytes_in_another_process(tmp_path: Path) -> None:
    specs = [str(write(tmp_path, t, f"{n}.yaml")) for n, t in (("chat", CHAT), ("agentic", AGENTIC), ("rag", RAG))]
    h = hashlib.sha256()
    for spec in specs:
        w = load_workload(spec, seed=7, salt="s")
        for i in range(12):
            h.update(session_bytes(w.session(i)))
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _DIGEST, *specs], capture_output=True, text=True, env=env, check=True, cwd=tmp_path
    )
    assert out.stdout.strip() == h.hexdigest()
    # session i does not depend on which sessions were built before it
    w = load_workload(specs[1], seed=7, salt="s")
    assert session_bytes(w.session(5)) == session_bytes(load_workload(specs[1], seed=7, salt="s").session(5))
    assert session_bytes(w.session(5)) != session_bytes(load_workload(specs[1], seed=8, salt="s").session(5))


# -- overrides -------------------------------------------------------------------------


def test_overrides_by_dotted_key_nested_dict_and_run_flags(tmp_path: Path) -> None:
    p = str(write(tmp_path, CHAT))
    w = load_workload(p, overrides={"turns": 1, "input": {"mean": 400, "max": 400, "min": 400}})
    assert w.session(0).turns[0].prompt_tokens == 450
    w = load_workload(p, overrides={"turns": 1, "input_tokens": 77, "output_tokens": 9})
    t = w.session(0).turns[0]
    assert (t.prompt_tokens, t.max_tokens) == (127, 9)
    w = load_workload(p, overrides={"system": 0, "turns": 1, "input.sigma": 0.0, "input.mean": 33})
    assert w.session(0).system is None and w.session(0).turns[0].prompt_tokens == 33
    with pytest.raises(SpecError, match=r"override input\.mean: must be > 0"):
        load_workload(p, overrides={"input.mean": -1})
    with pytest.raises(SpecError, match=r"override input_tokens: does not apply to a rag"):
        load_workload(str(write(tmp_path, RAG, "r.yaml")), overrides={"input_tokens": 5})
    with pytest.raises(ConfigError):
        load_workload(p, seed=-1)


# -- spec errors -----------------------------------------------------------------------

ERRORS = [
    ("kind: chat\ninput: 10\noutput: 10\nsytem: 5\n", 4, "sytem", "unknown key (did you mean 'system'?)"),
    ("kind: chat\ninput:\n  type: lognormal\n  mean: 0\n  sigma: 1\noutput: 5\n", 4, "input.mean", "must be > 0"),
    (
        "kind: chat\ninput:\n  type: lognormal\n  sigma: 1\noutput: 5\n",
        2,
        "input",
        "give exactly one of mean or median",
    ),
    ("kind: chatt\n", 1, "kind", "'chatt': use one of"),
    ("kind: chat\noutput: 5\n", 1, "input", "required"),
    ("kind: agentic\nturns: 2\ntool_result: 1\noutput: 1\n", 1, "first", "required"),
    ("kind: chat\ninput: {type: uniform, low: 9, high: 3}\noutput: 5\n", 2, "input.high", "must be >= low"),
    ("kind: chat\ninput: 5\noutput: {type: gamma, mean: 3}\n", 3, "output.type", "'gamma': use one of"),
    ("kind: chat\ninput: 5.5\noutput: 5\n", 2, "input", "must be a whole number"),
    ("kind: chat\ninput: 5\noutput: 5\ninput: 6\n", 4, "input", "duplicate key (first on line 2)"),
    (
        "kind: rag\ndocuments: {count: 2, tokens: 5}\nk: 3\nquestion: 1\noutput: 1\n",
        3,
        "k",
        "must be <= documents.count (2)",
    ),
    (
        "kind: agentic\nfirst: 1\nturns: 2\ntool_result: 1\noutput: 1\nsubagents:\n  probability: 2\n",
        7,
        "subagents.probability",
        "must be <= 1",
    ),
    ("kind: chat\ninput: 5\noutput: 5\nthink: {type: normal, mean: 1, std: -1}\n", 4, "think.std", "must be >= 0"),
    ("kind: trace\nformat: sharegpt\npath: x.json\nwindow: 10\n", 4, "window", "does not apply to format sharegpt"),
    ("kind: trace\nformat: azure\npath: nope.csv\n", 3, "path", "no such file or folder"),
    ("kind: chat\ninput: [1, 2\n", 3, None, "invalid YAML"),
]


@pytest.mark.parametrize(("text", "line", "field", "msg"), ERRORS)
def test_spec_errors_name_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str | None, msg: str
) -> None:
    p = write(tmp_path, text)
    with pytest.raises(SpecError) as e:
        load_workload(str(p))
    want = f"{p}:{line}: {field}: {msg}" if field else f"{p}:{line}: {msg}"
    assert str(e.value).startswith(want), str(e.value)


def test_empirical_lengths_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "lens.txt").write_text("# observed\n10, 20\n30\n")
    p = write(tmp_path, "kind: chat\ninput: {type: empirical, file: lens.txt}\noutput: 3\n")
    seen = {load_workload(str(p)).session(i).turns[0].prompt_tokens for i in range(60)}
    assert seen == {10, 20, 30}
    (tmp_path / "lens.txt").write_text("10\n20\nabc\n")
    with pytest.raises(SpecError, match=r"lens\.txt:3: not a number: 'abc'"):
        load_workload(str(p))


def test_unknown_names_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"no such workload \(built-in: .*chat"):
        load_workload("no-such-workload")
    with pytest.raises(SpecError, match="no such workload file"):
        load_workload(str(tmp_path / "missing.yaml"))


def test_workloads_pickle_for_spawned_workers(tmp_path: Path) -> None:
    for text in (CHAT, AGENTIC, RAG):
        w = load_workload(str(write(tmp_path, text)), seed=3, salt="p")
        before = session_bytes(w.session(4))
        w.describe()
        clone = pickle.loads(pickle.dumps(w))
        assert session_bytes(clone.session(4)) == before


@pytest.mark.parametrize("salt", ["", "run-7", "p_3", "sweep-ab12cd_4"])
def test_a_synthetic_prompts_ids_are_its_text_tokenized(salt: str) -> None:
    for n in (0, 1, 2, 7, 512, 5000):
        wl = SyntheticChat(input_tokens=n, seed=3, salt=salt)
        for i in (0, 1, 99, 123_456):
            assert wl.prompt_ids(i) == BUILTIN.encode(wl.session(i).turns[0].text)
