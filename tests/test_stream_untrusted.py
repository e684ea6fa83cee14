"""What an endpoint sends is untrusted: the tally bounds every number and string it keeps.

An impossible token count (3000000000, -5, 2.5, "12", true, NaN) is not kept and is
one line of ``problems``; non-standard JSON and invalid UTF-8 are read past, not
failed on; strings are cleaned and cut. Each kind of problem is said once per stream.
What the tally then reports (counts, ``reconcile``) lies inside the records' columns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from chunks import Json, sse, tally_of, usage_chunk, vllm_chunk
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.client.protocol.sse import BadStream
from loadgen.client.protocol.tally import StreamTally
from loadgen.untrusted import MAX_TOKEN_COUNT, clean_text, token_count

IMPOSSIBLE = [3_000_000_000, -5, 2.5, "12", True, math.nan, math.inf, -math.inf, [3], {"n": 3}]


def events(*objs: Any) -> list[bytes]:
    """One read per event, written by Python's json (which writes NaN and Infinity)."""
    return [b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objs]


def content(n: int) -> list[Json]:
    return [{"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]} for i in range(n)]


def final_usage(**fields: Any) -> Json:
    usage: Json = {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}
    usage.update(fields)
    return {"choices": [], "usage": usage}


def clean(line: str) -> bool:
    return clean_text(line) == line and 0 < len(line) <= 300


# ---- numbers -------------------------------------------------------------------------


@pytest.mark.parametrize("value", IMPOSSIBLE, ids=repr)
@pytest.mark.parametrize(
    "field, where",
    [
        ("prompt_tokens", lambda v: {"prompt_tokens": v}),
        ("completion_tokens", lambda v: {"completion_tokens": v}),
        ("cached_tokens", lambda v: {"prompt_tokens_details": {"cached_tokens": v}}),
        ("reasoning_tokens", lambda v: {"completion_tokens_details": {"reasoning_tokens": v}}),
    ],
)
def test_an_impossible_usage_count_is_not_kept_and_is_a_problem(field: str, where: Any, value: object) -> None:
    t = tally_of("chat", events(*content(3), final_usage(**where(value)), b"[DONE]"))
    assert getattr(t, field) is None
    about = [p for p in t.problems if field in p]
    assert len(about) == 1 and clean(about[0])
    odd_json = isinstance(value, float) and not math.isfinite(value)  # NaN, Infinity: not standard JSON
    assert len(t.problems) == 1 + odd_json
    expected = ([1, 1, 1], 3, "chunks") if field == "completion_tokens" else ([1, 1, 1], 3, "usage")
    assert t.reconcile() == expected  # the bounded fallback: the count the chunks give


@pytest.mark.parametrize("value, kept", [(7.0, 7), (0, 0), (MAX_TOKEN_COUNT, MAX_TOKEN_COUNT)])
def test_a_whole_number_in_range_is_kept(value: object, kept: int) -> None:
    t = tally_of("chat", events(*content(3), final_usage(prompt_tokens=value), b"[DONE]"))
    assert t.prompt_tokens == kept and t.problems == []


def test_the_huge_usage_of_a_hostile_server_fails_nothing() -> None:
    huge = final_usage(prompt_tokens=3_000_000_000, completion_tokens=3_000_000_000)
    huge["usage"]["prompt_tokens_details"] = {"cached_tokens": 3_000_000_000}
    t = tally_of("chat", events(*content(4), huge, b"[DONE]"))
    assert (t.prompt_tokens, t.completion_tokens, t.cached_tokens) == (None, None, None)
    assert t.reconcile() == ([1, 1, 1, 1], 4, "chunks")
    assert t.problems == [
        "usage.prompt_tokens 3000000000 is impossible (outside 0..100,000,000)",
        "usage.prompt_tokens_details.cached_tokens 3000000000 is impossible (outside 0..100,000,000)",
        "usage.completion_tokens 3000000000 is impossible (outside 0..100,000,000)",
    ]


def test_an_impossible_running_count_keeps_the_last_good_one() -> None:
    reads = sse(
        vllm_chunk({"content": "a"}, 1),
        vllm_chunk({"content": "b"}, 2),
        vllm_chunk({"content": "c"}, 3_000_000_000),  # one chunk's counter gone wrong
        vllm_chunk({"content": "d"}, 4),
        usage_chunk(4),
        b"[DONE]",
    )
    t = tally_of("chat", reads)
    assert t.completion_tokens == 4
    assert t.reconcile() == ([1, 1, 1, 2], 5, "usage_per_chunk")  # a chunk with output carries at least one
    assert t.problems == ["usage.completion_tokens 3000000000 is impossible (outside 0..100,000,000)"]


def test_running_usage_that_goes_down_keeps_its_highest_value() -> None:
    reads = sse(*[vllm_chunk({"content": f" w{i}"}, 10 - i) for i in range(5)], usage_chunk(2), b"[DONE]")
    t = tally_of("chat", reads)
    assert t.completion_tokens == 10
    assert t.reconcile() == ([10, 1, 1, 1, 1], 14, "usage_per_chunk")
    assert t.problems == ["usage.completion_tokens went down (10, then 9): the highest kept"]


def test_running_usage_that_leaps_to_the_bound_falls_back_to_one_per_chunk() -> None:
    reads = sse(vllm_chunk({"content": "a"}, 1), vllm_chunk({"content": "b"}, MAX_TOKEN_COUNT))
    reads += sse(*[vllm_chunk({"content": "c"}, MAX_TOKEN_COUNT) for _ in range(3)], b"[DONE]")
    t = tally_of("chat", reads)
    counts = t.reconcile()
    assert counts == ([1] * 5, 5, "chunks")
    assert t.problems == ["running usage adds up to an impossible count: one token per chunk kept"]


def test_usage_that_is_not_an_object_is_a_problem() -> None:
    t = tally_of("chat", events(*content(2), {"choices": [], "usage": 12}, b"[DONE]"))
    assert t.completion_tokens is None and t.problems == ["usage is not an object (12)"]


def test_each_kind_of_problem_is_said_once_however_long_the_stream() -> None:
    reads = sse(*[vllm_chunk({"content": "w"}, -1) for _ in range(500)], b"[DONE]")
    reads += [b'data: {"choices":[{"index":0,"delta":{"content":"x"},"logprobs":NaN}]}\n\n'] * 100
    t = tally_of("chat", reads)
    assert t.problems == ["usage.completion_tokens -1 is impossible (outside 0..100,000,000)"]
    t = tally_of("chat", reads[501:] * 2)  # the NaN chunks alone, twice over
    assert t.problems == ["non-standard JSON read leniently (NaN)"] and len(t.chunk_ns) == 200


FIELDS: dict[str, Callable[[object], Json]] = {
    "prompt_tokens": lambda v: {"prompt_tokens": v},
    "completion_tokens": lambda v: {"completion_tokens": v},
    "cached_tokens": lambda v: {"prompt_tokens_details": {"cached_tokens": v}},
    "reasoning_tokens": lambda v: {"completion_tokens_details": {"reasoning_tokens": v}},
}
EDGES = st.sampled_from([0, 1, MAX_TOKEN_COUNT, MAX_TOKEN_COUNT + 1, -1, 2**31, 2**63, 1.0, 1e8, 1e9, -0.0])


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(FIELDS)), value=st.one_of(EDGES, st.integers(), st.floats(), st.booleans()))
def test_each_count_is_kept_exactly_when_token_count_accepts_it(field: str, value: object) -> None:
    # the tally decides the common case inline (per chunk); its verdict must be token_count's
    kept, why = token_count(value, f"usage.{field}")
    t = tally_of("chat", events(*content(1), final_usage(**FIELDS[field](value))))
    assert getattr(t, field) == kept
    assert any(field in p for p in t.problems) == (why is not None)


USAGE_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.integers(0, 300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(
    running=st.lists(st.one_of(st.none(), USAGE_VALUES), max_size=12),
    final=st.dictionaries(
        st.sampled_from(["prompt_tokens", "completion_tokens", "total_tokens"]), USAGE_VALUES, max_size=3
    ),
)
def test_whatever_usage_says_the_counts_fit_their_columns(running: list[Any], final: dict[str, Any]) -> None:
    objs: list[Any] = []
    for i, ct in enumerate(running):
        chunk: Json = {"choices": [{"index": 0, "delta": {"content": f"w{i}" if i % 3 else ""}}]}
        if ct is not None:
            chunk["usage"] = {"prompt_tokens": ct, "completion_tokens": ct}
        objs.append(chunk)
    objs += [{"choices": [], "usage": final}, b"[DONE]"]
    t = tally_of("chat", events(*objs))
    for n in (t.prompt_tokens, t.completion_tokens, t.cached_tokens, t.reasoning_tokens):
        assert n is None or (type(n) is int and 0 <= n <= MAX_TOKEN_COUNT)
    counts, total, _ = t.reconcile()
    assert all(type(c) is int and 0 <= c <= MAX_TOKEN_COUNT for c in counts)
    assert 0 <= total <= MAX_TOKEN_COUNT and len(counts) == len(t.chunk_ns)
    assert all(clean(p) for p in t.problems) and len(t.problems) == len(set(t.problems)) <= 6


# ---- JSON and text -------------------------------------------------------------------


def test_nan_and_infinity_are_read_and_flagged() -> None:
    reads = [
        b'data: {"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"x":NaN,"y":-Infinity}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":NaN,"completion_tokens":Infinity,"total_tokens":-Infinity}}\n\n',
        b"data: [DONE]\n\n",
    ]
    t = tally_of("chat", reads, keep_text=True)
    assert t.text == "ab" and t.done
    assert (t.prompt_tokens, t.completion_tokens) == (None, None)
    assert t.reconcile() == ([1, 1], 2, "chunks")
    assert t.problems == [
        "non-standard JSON read leniently (-Infinity, NaN)",
        "usage.prompt_tokens nan is not a whole number",
        "usage.completion_tokens inf is not a whole number",
    ]


@pytest.mark.parametrize(
    "raw, problem",
    [
        (b'"w\x01x"', "non-standard JSON read leniently (unexpected control character in string"),
        (b'"w\\ud800x"', "non-standard JSON read leniently (no low surrogate in string"),
    ],
    ids=["raw-control", "lone-surrogate"],
)
def test_other_non_standard_strings_are_read_and_flagged(raw: bytes, problem: str) -> None:
    reads = [b'data: {"choices":[{"index":0,"delta":{"content":' + raw + b"}}]}\n\n", b"data: [DONE]\n\n"]
    t = tally_of("chat", reads, keep_text=True)
    assert len(t.chunk_ns) == 1 and t.done
    assert len(t.problems) == 1 and t.problems[0].startswith(problem)
    t.text.encode()  # what is kept can be written as UTF-8


def test_a_huge_integer_is_bounded_not_a_failure() -> None:
    big = b"1" + b"0" * 5000  # Python refuses to convert it; JSON allows it
    reads = sse({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    reads += [b'data: {"choices":[],"usage":{"completion_tokens":' + big + b',"x":NaN}}\n\n']
    t = tally_of("chat", reads)
    assert t.completion_tokens is None and t.reconcile() == ([1], 1, "chunks")
    assert "usage.completion_tokens inf is not a whole number" in t.problems


INVALID = b" \xff\xfe\xc3(\xed\xa0\x80 "  # a stray byte, a cut character, a CESU surrogate


def test_invalid_utf8_in_one_content_chunk_is_replaced_not_failed() -> None:
    chunks = content(3)
    reads = events(*chunks, b"[DONE]")
    reads[1] = reads[1].replace(b" w1", b" w1" + INVALID)
    t = tally_of("chat", reads, keep_text=True)
    assert t.chunk_ns == [1000, 2000, 3000] and t.done
    assert t.text == " w0 w1 \ufffd\ufffd\ufffd(\ufffd\ufffd\ufffd  w2"
    assert t.problems == ["invalid UTF-8 in content replaced"]


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="ab \u00e9\u4e2d\U0001f600\u202e", min_size=1, max_size=4), min_size=1, max_size=8),
    bad=st.sampled_from([None, 0, -1]),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
)
def test_any_split_of_the_bytes_gives_the_same_text(texts: list[str], bad: int | None, cuts: list[int]) -> None:
    # multi-byte characters cut between reads are whole again; invalid bytes are replaced alike
    objs = [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in texts]
    reads = [b"data: " + json.dumps(o, ensure_ascii=False).encode() + b"\n\n" for o in objs]
    if bad is not None:
        reads[bad] = reads[bad].replace(b'"}}]}', INVALID + b'"}}]}')
    stream = b"".join([*reads, b"data: [DONE]\n\n"])
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    split = [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    whole, pieces = tally_of("chat", [stream], keep_text=True), tally_of("chat", split, keep_text=True)
    expected = "".join(texts) if bad is None else None
    for t in (whole, pieces):
        assert expected is None or t.text == expected
        assert len(t.chunk_ns) == len(texts) and t.done
    assert (pieces.text, pieces.problems) == (whole.text, whole.problems)
    assert whole.problems == ([] if bad is None else ["invalid UTF-8 in content replaced"])


@pytest.mark.parametrize(
    "payload",
    [
        b'{"choices": [',
        b"\x1b[31m" + b"<" * 1_000_000,
        b'{"choices":[{"delta":{"content":"a"}}],"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"\xff" * 100_000,
    ],
    ids=["cut", "huge-garbage", "deep", "binary"],
)
def test_an_event_that_is_not_json_even_leniently_fails_with_a_short_message(payload: bytes) -> None:
    t = StreamTally("chat", max_event_bytes=1 << 21)
    t.feed(b"".join(sse({"choices": [{"delta": {"content": "a"}}]})), 1)
    with pytest.raises(BadStream, match="non-JSON event data") as e:
        t.feed(b"data: " + payload + b"\n\n", 2)
    assert len(str(e.value)) <= 300 and "\x1b" not in str(e.value)
    assert t.chunk_ns == [1]


# ---- strings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sent, kept, problem",
    [
        ("stop", "stop", None),
        ("\x1b[1;31mstop\x1b[0m\u202e\u200b\r\nnow", "stop now", None),
        ("finish-" + "x" * 300_000, "finish-" + "x" * 292 + "\u2026", None),
        (7, "7", "finish_reason is not a string (7)"),
        ({"a": [1] * 10_000}, "dict", "finish_reason is not a string (a JSON dict)"),
    ],
    ids=["plain", "escapes", "300KB", "number", "object"],
)
def test_finish_reason_is_kept_clean_and_short(sent: object, kept: str, problem: str | None) -> None:
    t = tally_of("chat", sse(*content(2), {"choices": [{"index": 0, "delta": {}, "finish_reason": sent}]}))
    assert t.finish_reason == kept
    assert t.problems == ([] if problem is None else [problem])
    assert t._fr_raw is not sent or len(kept) < 300  # a long one is not held on to, even raw


def test_every_problem_line_is_clean_and_short() -> None:
    evil = "\x1b]0;pwned\x07\u202e" + "i" * 10_000
    reads = sse({"choices": [{"index": evil, "delta": {"content": "a"}}, {"index": 0, "delta": {"content": "b"}}]})
    reads += sse({"choices": [], "usage": {"prompt_tokens": evil}})
    t = tally_of("chat", reads)
    assert len(t.problems) == 2 and all(clean(p) for p in t.problems)
    assert t.chunk_ns == [1000]
