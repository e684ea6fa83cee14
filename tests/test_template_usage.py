"""The usage template (content chunks with running usage) counts exactly what decoding would.

With vLLM's ``continuous_usage_stats`` every content chunk carries the usage so far,
and the tally reads such chunks off a template whose counts are holes. That may only
change how fast a stream is read: every test compares a tally with templates against
one that decodes every chunk (``_facts``), or checks the template path is the one
taken, and that a chunk the template cannot prove is decoded.
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.client.protocol.sse import BadStream
from loadgen.client.protocol.tally import StreamTally
from loadgen.untrusted import MAX_TOKEN_COUNT
from loadgen.workload.tokenizer import BUILTIN

Json = dict[str, object]
ANY_TEXT = st.text(max_size=5)  # any code point: quotes, backslashes, controls, emoji
# Text that needs no escaping: ASCII, or not (which an ASCII-only encoder escapes)
PLAIN_TEXT = st.one_of(
    st.text(alphabet="ab Z.", min_size=1, max_size=5),
    st.text(alphabet="ab Z\u00e9\u4e2d\U0001f600", min_size=1, max_size=5),
)
# How completion_tokens moves from one chunk to the next: not at all, by one, by several
# (speculative decoding), or down (a lying server).
RISES = st.sampled_from([0, 1, 1, 1, 1, 2, 3, 4, -1, -3])
# A count at or past the bounds, or not a count at all, sent once.
ODD_COUNTS = st.sampled_from(
    [MAX_TOKEN_COUNT, MAX_TOKEN_COUNT + 1, 999_999_999, 3_000_000_000, 10**25, -5, 2.5, 7.0, "12", True, None]
)


@st.composite
def running_streams(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    """Events of a stream with running usage on every chunk, in several servers' layouts."""
    api = draw(st.sampled_from(["chat", "completions"]))
    seps = (",", ":") if draw(st.booleans()) else (", ", ": ")
    ascii_only = draw(st.booleans())
    order = draw(st.sampled_from([("p", "t", "c"), ("c", "p", "t"), ("p", "c"), ("t", "c", "p")]))
    extra = draw(st.sampled_from([None, None, None, "details-null", "details-null", "details-cached", "before"]))
    created, prompt, done = 1718000000, draw(st.sampled_from([0, 7, 512, MAX_TOKEN_COUNT])), 0

    def usage(ct: object, pt: object) -> Json:
        out: Json = {}
        for key in order:
            out[{"p": "prompt_tokens", "t": "total_tokens", "c": "completion_tokens"}[key]] = (
                pt if key == "p" else ct if key == "c" else (pt + ct if type(pt) is type(ct) is int else 0)
            )
        if extra == "details-null":
            out["prompt_tokens_details"] = None
        elif extra == "details-cached":  # an effect of its own: such chunks are decoded
            out["prompt_tokens_details"] = {"cached_tokens": 3}
        return out

    def chunk(body: Json | None, ct: object, pt: object, finish: str | None = None) -> Json:
        obj: Json = {"id": "cmpl-1", "object": "chunk", "created": created, "model": "m"}
        if extra == "before":
            obj["usage"] = usage(ct, pt)
        if body is None:
            obj["choices"] = []
        elif api == "chat":
            obj["choices"] = [{"index": 0, "delta": body, "logprobs": None, "finish_reason": finish}]
        else:
            obj["choices"] = [{"index": 0, "text": body.get("content", ""), "finish_reason": finish}]
        if extra != "before":
            obj["usage"] = usage(ct, pt)
        return obj

    events = [chunk({"role": "assistant", "content": ""}, 0, prompt)] if api == "chat" else []
    for _ in range(draw(st.integers(1, 16))):
        kind = draw(st.sampled_from(["plain"] * 8 + ["any", "empty", "reasoning", "time", "prompt", "odd", "zero"]))
        done = max(done + draw(RISES), 0)
        ct: object = done
        pt: object = prompt
        if kind == "time":
            created += 1  # llama.cpp stamps each chunk with the current second: a fixed part moves
        elif kind == "prompt":
            pt = draw(st.sampled_from([prompt + 1, -1, MAX_TOKEN_COUNT + 1, 10**12]))
        elif kind == "odd":
            ct = draw(ODD_COUNTS)
        text = draw({"any": ANY_TEXT, "prompt": ANY_TEXT, "empty": st.just("")}.get(kind, PLAIN_TEXT))
        if kind == "reasoning":
            events.append(chunk({"reasoning_content": text}, ct, pt))
        elif kind == "zero":  # a leading zero, which no JSON encoder writes: put in after encoding
            events.append(chunk({"content": text}, "<ZERO>", pt))
        else:
            events.append(chunk({"content": text}, ct, pt))
    events.append(chunk({}, done + draw(st.integers(0, 2)), prompt, finish="length"))
    if draw(st.booleans()):
        events.append(chunk(None, done + 1, prompt))  # the final usage chunk (include_usage)

    def dumps(obj: Json) -> bytes:
        return json.dumps(obj, separators=seps, ensure_ascii=ascii_only).encode()

    framed = [b"data: " + dumps(e).replace(b'"<ZERO>"', b"007") + b"\n\n" for e in events]
    return api, [*framed, b"data: [DONE]\n\n"]


def _facts(
    api: str, reads: list[bytes], learn: bool, keep_text: bool, tokenizer: bool, cap: int = 1 << 20
) -> tuple[object, ...]:
    """All a tally makes of the reads, including the error it stops at, if any."""
    t = StreamTally(api, keep_text=keep_text, max_event_bytes=cap, tokenizer=BUILTIN if tokenizer else None)
    if not learn:
        t._learns = 0  # never learn a template: every chunk is decoded
    error = None
    try:
        for i, d in enumerate(reads):
            t.feed(d, 1000 * (i + 1))
        t.close()
    except BadStream as e:
        error = str(e)
    return (
        error,
        t.events,
        t.end,
        t.chunk_ns,
        t.chunk_tokens,
        t.text,
        t.finish_reason,
        (t.prompt_tokens, t.completion_tokens, t.cached_tokens, t.reasoning_tokens),
        t.reconcile(),
        t.t_first_content,
        t.problems,  # after reconcile, which may add one
    )


@settings(max_examples=100, deadline=None)
@given(case=running_streams(), data=st.data())
def test_the_usage_template_path_matches_the_full_decode(case: tuple[str, list[bytes]], data: st.DataObject) -> None:
    api, events = case
    keep_text, tokenizer = data.draw(st.booleans()), data.draw(st.booleans())
    stream = b"".join(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    splits = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    # whole events grouped into reads, as a server writing back to back delivers them
    bounds = sorted(set(data.draw(st.lists(st.integers(0, len(events)), max_size=6))) | {0, len(events)})
    grouped = [b"".join(events[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    for reads in (events, splits, grouped):
        decoded = _facts(api, reads, False, keep_text, tokenizer)
        assert _facts(api, reads, True, keep_text, tokenizer) == decoded


_HEAD = b'{"id":"chatcmpl-v1","object":"chat.completion.chunk","created":1718000000,"model":"m","choices":'


def _vllm(content: bytes, done: int, prompt: int = 20, details: bytes = b"") -> bytes:
    """A vLLM content chunk with continuous_usage_stats, byte for byte."""
    return (
        b'data: %s[{"index":0,"delta":{"content":"%s"},"logprobs":null,"finish_reason":null}],'
        b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%s}}\n\n'
        % (_HEAD, content, prompt, prompt + done, done, details)
    )


def _counting_loads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    import loadgen.client.protocol.tally as tally_mod

    calls: list[bytes] = []

    def counting(b: bytes) -> object:
        calls.append(b)
        return orjson.loads(b)

    monkeypatch.setattr(tally_mod, "_loads", counting)
    return calls


def _tally(reads: list[bytes]) -> StreamTally:
    t = StreamTally("chat", keep_text=True)
    for i, d in enumerate(reads):
        t.feed(d, 1000 * (i + 1))
    t.close()
    return t


@pytest.mark.parametrize("details", [b"", b',"prompt_tokens_details":null'])
def test_running_usage_chunks_are_read_off_the_template(monkeypatch: pytest.MonkeyPatch, details: bytes) -> None:
    calls = _counting_loads(monkeypatch)
    rises = [1, 2, 0, 4, 1, 3] * 5  # a rise of 0 on a chunk with text still counts it as 1
    counts = [sum(rises[: i + 1]) for i in range(len(rises))]
    events = [_vllm(b" w%d" % i, c, details=details) for i, c in enumerate(counts)]
    whole = b"".join(events)
    for reads in (events, [whole], [whole[i : i + 300] for i in range(0, len(whole), 300)]):
        calls.clear()
        t = _tally([*reads, b"data: [DONE]\n\n"])
        assert t.text == "".join(f" w{i}" for i in range(30)) and t.done
        assert t.chunk_tokens == [r if r else 1 for r in rises] and t.completion_tokens == counts[-1]
        assert t.reconcile().source == "usage_per_chunk" and t.prompt_tokens == 20
        assert len(calls) <= 3  # the chunk that taught the template (and a split's first pieces)


def test_what_the_template_cannot_prove_is_decoded_and_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_loads(monkeypatch)
    events = [_vllm(b" a", 1), _vllm(b" b", 2)]
    odd = [
        _vllm(b" c", 1),  # down: noted, the highest kept
        _vllm(b" d", 3_000_000_000),  # ten digits: impossible, noted
        _vllm(b'say \\"hi\\"', 4),  # an escape
        _vllm(b" e", 5, prompt=MAX_TOKEN_COUNT + 1),  # nine digits, past the bound
    ]
    t = _tally([*events, *odd, _vllm(b'\\"', 6, prompt=21)])  # another prompt, in a chunk that teaches none
    assert t.prompt_tokens == 21
    calls.clear()
    t = _tally([*events, *odd, _vllm(b'\\"', 6, prompt=21), _vllm(b" f", 7), b"data: [DONE]\n\n"])
    assert t.chunk_tokens == [1, 1, 1, 1, 2, 1, 1, 1]
    assert t.completion_tokens == 7 and t.prompt_tokens == 20  # the template's, as decoding would keep
    assert any("went down" in p for p in t.problems) and any("3000000000" in p for p in t.problems)
    assert any("prompt_tokens 100000001" in p for p in t.problems)
    assert len(calls) == 1 + 4  # the teacher, those past the bounds, the escapes; the decrease off the template


def test_usage_with_an_effect_of_its_own_teaches_no_template(monkeypatch: pytest.MonkeyPatch) -> None:
    # cached_tokens is kept from each chunk: skipping it could keep a stale value.
    calls = _counting_loads(monkeypatch)
    details = b',"prompt_tokens_details":{"cached_tokens":4}'
    t = _tally([_vllm(b" w%d" % i, i + 1, details=details) for i in range(10)])
    assert t.chunk_tokens == [1] * 10 and t.cached_tokens == 4 and len(calls) == 10


@pytest.mark.parametrize("over", [0, 1])
def test_the_size_cap_holds_for_usage_template_events_however_they_are_read(over: int) -> None:
    big = _vllm(b"x" * 300, 3)
    cap = len(big) - 2 - over  # the event's lines, without the blank line, against the cap
    lead = [_vllm(b"a", 1), _vllm(b"b", 2)]
    for reads in ([*lead, big], [*lead, big[:100], big[100:]], [*lead, lead[1] + big]):
        with_template = _facts("chat", reads, True, False, False, cap)
        assert with_template == _facts("chat", reads, False, False, False, cap)
        assert (with_template[0] is not None) == bool(over)  # over the cap: an error, in every split
