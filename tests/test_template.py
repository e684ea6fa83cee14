"""The learned content-chunk template counts exactly what decoding every chunk would.

A template may only change how fast a stream is read, never what is read: every
test here compares a tally with the template against one without it (``facts``),
on server-shaped streams split every way a socket can split them, or checks that
the template path is really the one taken.
"""

from __future__ import annotations

import json

import orjson
import pytest
from chunks import Json, sse, tally_of, vllm_chunk
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.client.protocol.sse import BadStream
from loadgen.client.protocol.tally import StreamTally

ANY_TEXT = st.text(max_size=6)  # any code point: quotes, backslashes, controls, emoji
PLAIN_TEXT = st.text(alphabet="abc XYZ\u00e9\u4e2d\U0001f600", min_size=1, max_size=6)


@st.composite
def server_streams(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    """Events of a stream in one of several servers' shapes and JSON styles."""
    api = draw(st.sampled_from(["chat", "completions"]))
    compact = draw(st.booleans())
    ascii_only = draw(st.booleans())
    decoy = draw(st.sampled_from([None, "before", "after", "string"]))
    created = 1718000000

    def dumps(obj: Json) -> bytes:
        seps = (",", ":") if compact else (", ", ": ")
        return json.dumps(obj, separators=seps, ensure_ascii=ascii_only).encode()

    def chunk(body: Json | None, finish: str | None = None, usage: Json | None = None) -> Json:
        obj: Json = {"id": "x1", "object": "chunk", "created": created, "model": "m"}
        if decoy == "before":
            obj["meta"] = {"content": "w"}
        if decoy == "string":
            obj["note"] = 'say "content":"w"'
        if body is None:
            obj["choices"] = []
        elif api == "chat":
            obj["choices"] = [{"index": 0, "delta": body, "logprobs": None, "finish_reason": finish}]
        else:
            obj["choices"] = [{"index": 0, "text": body.get("content", ""), "finish_reason": finish}]
        if decoy == "after":
            obj["x"] = {"content": "w"}
        if usage is not None or draw(st.booleans()):
            obj["usage"] = usage
        return obj

    events = []
    if api == "chat":
        events.append(chunk({"role": "assistant", "content": ""}))
    for _ in range(draw(st.integers(0, 12))):
        kinds = ["plain", "plain", "plain", "any", "reasoning", "empty", "time", "broken", "nan", "extra"]
        kind = draw(st.sampled_from(kinds))
        if kind == "time":
            created += 1  # llama.cpp stamps each chunk with the current second
            continue
        if kind == "extra":  # a second choice although n = 1 was asked
            two = chunk({"content": draw(PLAIN_TEXT)})
            two["choices"] = [*two["choices"], dict(two["choices"][0], index=1)]
            events.append(two)
            continue
        if kind == "nan":  # a Python server's NaN, put in after encoding, as "<BAD>" is
            events.append(chunk({"content": draw(PLAIN_TEXT), "logprob": "<NAN>"}))
            continue
        if kind == "reasoning":
            events.append(chunk({"reasoning_content": draw(PLAIN_TEXT), "content": draw(ANY_TEXT)}))
            continue
        # "broken": bytes no JSON encoder writes (a raw control character, bad UTF-8),
        # put in after encoding; both paths must then read them (leniently) the same way.
        broken = st.sampled_from(["a<CTL>", "<BAD>b"])
        content = {"plain": PLAIN_TEXT, "any": ANY_TEXT, "empty": st.just(""), "broken": broken}[kind]
        events.append(chunk({"content": draw(content)}))
    events.append(chunk({}, finish="length"))
    count = st.one_of(st.integers(0, 20), st.sampled_from([-5, 3_000_000_000, 2.5, "12", True]))
    usage = {"prompt_tokens": draw(count), "completion_tokens": draw(count)}
    usage["completion_tokens_details"] = {"reasoning_tokens": draw(count)}
    events.append(chunk(None, usage=usage))
    framed = [b"data: " + dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    framed = [e.replace(b"<CTL>", b"\x01").replace(b"<BAD>", b"\xff").replace(b'"<NAN>"', b"NaN") for e in framed]
    return api, framed


def facts(api: str, reads: list[bytes], learn: bool, cap: int = 1 << 20) -> tuple[object, ...]:
    """What a tally makes of the reads, including the error it stops at, if any."""
    t = StreamTally(api, keep_text=True, max_event_bytes=cap)
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
        t.done,
        t.chunk_ns,
        t.chunk_tokens,
        t.text,
        t.finish_reason,
        t.completion_tokens,
        t.reconcile(),
        t.t_first_content,
        (t.prompt_tokens, t.cached_tokens, t.reasoning_tokens),
        t.problems,  # after reconcile, which may add one
    )


@settings(max_examples=150, deadline=None)
@given(case=server_streams(), data=st.data())
def test_template_path_matches_full_decode(case: tuple[str, list[bytes]], data: st.DataObject) -> None:
    api, events = case
    stream = b"".join(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    splits = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    # whole events grouped into reads, as a server writing back to back delivers them
    bounds = sorted(set(data.draw(st.lists(st.integers(0, len(events)), max_size=6))) | {0, len(events)})
    grouped = [b"".join(events[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    for reads in (events, splits, grouped):
        assert facts(api, reads, learn=True) == facts(api, reads, learn=False)


def test_a_read_that_starts_with_another_chunk_of_the_same_length_is_decoded() -> None:
    # "refusal" is as long as "content": sliced where the template's body lies, this
    # chunk gives plain text, yet it carries no output. Only the prefix proves that.
    refusal = b'data: {"id":"c","choices":[{"index":0,"delta":{"refusal":"no"},"finish_reason":null}]}\n\n'
    reads = [_framed(b"a"), _framed(b"b"), refusal + _framed(b"c") + _framed(b"d")]
    with_template = facts("chat", reads, learn=True)
    assert with_template == facts("chat", reads, learn=False)
    assert with_template[5] == "abcd"  # the text kept: the refusal is not output


@pytest.mark.parametrize("over", [0, 1])
def test_the_size_cap_holds_for_template_events_however_they_are_read(over: int) -> None:
    big = _framed(b"x" * 300)
    cap = len(big) - 2 - over  # the event's lines, without the blank line, against the cap
    lead = [_framed(b"a"), _framed(b"b")]
    for reads in ([*lead, big], [*lead, big[:100], big[100:]], [*lead, _framed(b"c") + big]):
        with_template = facts("chat", reads, learn=True, cap=cap)
        assert with_template == facts("chat", reads, learn=False, cap=cap)
        assert (with_template[0] is not None) == bool(over)  # over the cap: an error, in every split


def _counting_loads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    import loadgen.client.protocol.tally as tally_mod

    calls: list[bytes] = []

    def counting(b: bytes) -> object:
        calls.append(b)
        return orjson.loads(b)

    monkeypatch.setattr(tally_mod, "_loads", counting)
    return calls


def test_template_path_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_loads(monkeypatch)
    reads = sse(*[vllm_chunk({"content": f" w{i}"}, None) for i in range(50)], b"[DONE]")
    t = tally_of("chat", reads, keep_text=True)
    assert len(t.chunk_ns) == 50 and t.text == "".join(f" w{i}" for i in range(50))
    assert len(calls) <= 4  # the first chunk and [DONE] (the probe decode is template.py's)
    calls.clear()
    t = tally_of("chat", [b"".join(reads)])  # one read of many events: the payload template
    assert len(t.chunk_ns) == 50 and len(calls) <= 4
    calls.clear()
    # the first read teaches the template; the next holds 48 whole events, taken in one piece
    t = tally_of("chat", [reads[0], b"".join(reads[1:49]), *reads[49:]])
    assert len(t.chunk_ns) == 50 and len(set(t.chunk_ns)) == 3 and len(calls) <= 4


def test_a_foreign_event_takes_the_full_path_and_the_events_after_it_the_template(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting_loads(monkeypatch)
    chunks = [vllm_chunk({"content": f" w{i}"}, None) for i in range(20)]
    odd = vllm_chunk({"content": 'say "hi"'}, None)  # escaped quotes: not the template's plain text
    reads = [*sse(chunks[0], chunks[1]), b"".join(sse(chunks[2], odd, *chunks[3:]))]
    t = tally_of("chat", reads, keep_text=True)
    assert t.text == ' w0 w1 w2say "hi"' + "".join(f" w{i}" for i in range(3, 20)) and len(t.chunk_ns) == 21
    assert len(calls) == 2  # the chunk that taught the template, and the foreign one


def _template_read(bodies: list[bytes], lead: int = 2) -> list[bytes]:
    """``lead`` events alone (the template is learned from them), then the rest in one read with the end."""
    framed = [
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + b + b'"},"finish_reason":null}]}\n\n'
        for b in bodies
    ]
    tail = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    return [*framed[:lead], b"".join(framed[lead:]) + tail]


@pytest.mark.parametrize("lead", [0, 1, 2])
@pytest.mark.parametrize(
    "case",
    [
        [b" w%d" % i for i in range(30)],
        [b" w%d" % i if i % 7 else b"" for i in range(30)],  # empty bodies: events without output
        [b"\xc3\xa9t\xc3\xa9 %d" % i for i in range(30)],  # non-ASCII, whole characters
        [b" w%d" % i for i in range(14)] + [b"\xc3", b"\xa9"] + [b" w%d" % i for i in range(14)],  # one cut in two
        [b" w%d" % i for i in range(14)] + [b'say \\"hi\\"'] + [b" w%d" % i for i in range(14)],  # an escape
        [b" w%d" % i for i in range(14)] + [b"tab\x01"] + [b" w%d" % i for i in range(14)],  # a raw control byte
    ],
    ids=["plain", "empties", "non-ascii", "split-char", "escaped", "control"],
)
def test_many_template_events_in_one_read_count_as_decoded_one_by_one(case: list[bytes], lead: int) -> None:
    reads = _template_read(case, lead)
    assert facts("chat", reads, learn=True) == facts("chat", reads, learn=False)
    end = reads[-1].index(b'data: {"id":"c","choices":[{"index":0,"delta":{}')
    apart = [*reads[:-1], reads[-1][:end], reads[-1][end:]]  # the end in a read of its own
    assert apart[-1].startswith(b"data: {") and apart[-2].endswith(b"\n\n")
    for read in (apart, [b"".join(reads)]):  # and all of it as one read, as it comes with the headers
        assert facts("chat", read, learn=True) == facts("chat", read, learn=False)


def test_a_read_of_many_template_events_is_counted_in_one_go(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []
    real = StreamTally._bodies

    def spy(self: StreamTally, bodies: list[bytes], t_ns: int) -> bool:
        runs.append(len(bodies))
        return real(self, bodies, t_ns)

    monkeypatch.setattr(StreamTally, "_bodies", spy)
    reads = _template_read([b" w%d" % i for i in range(30)], lead=2)
    t = tally_of("chat", [b"".join(reads)])  # with the learning events: the parser's payloads
    assert runs == [29] and len(t.chunk_ns) == 30
    runs.clear()
    end = reads[-1].index(b'data: {"id":"c","choices":[{"index":0,"delta":{}')
    t = tally_of("chat", [*reads[:-1], reads[-1][:end], reads[-1][end:]])  # a read of template events only
    assert runs == [28] and len(t.chunk_ns) == 30 and t.done


def _framed(body: bytes) -> bytes:
    return b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + body + b'"},"finish_reason":null}]}\n\n'


@pytest.mark.parametrize("place", ["first", "last"])
def test_an_event_where_prefix_and_suffix_overlap_is_not_a_template_event(place: str) -> None:
    # The template's prefix ends with the quote its suffix starts with, so this
    # event starts with the one and ends with the other, yet holds no body: it is
    # not JSON, and must fail as it does when decoded, wherever it lies in a read.
    short = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"},"finish_reason":null}]}\n\n'
    pair = [short, _framed(b"wwwwww")] if place == "first" else [_framed(b"wwwwww"), short]
    reads = [_framed(b"a"), _framed(b"b"), b"".join(pair)]
    with_template = facts("chat", reads, learn=True)
    assert with_template == facts("chat", reads, learn=False)
    assert with_template[0] is not None and "non-JSON" in str(with_template[0])


def test_chunks_without_content_do_not_use_up_the_tries_at_learning(monkeypatch: pytest.MonkeyPatch) -> None:
    # A reasoning model thinks for longer than the stream's budget of tries, then
    # answers: the answer's chunks must still be counted off a template.
    calls = _counting_loads(monkeypatch)
    thinking = [vllm_chunk({"reasoning_content": f" r{i}"}, None) for i in range(100)]
    answer = [vllm_chunk({"content": f" w{i}"}, None) for i in range(30)]
    t = tally_of("chat", sse(*thinking, *answer, b"[DONE]"))
    assert len(t.chunk_ns) == 130
    assert len(calls) <= 100 + 3  # every reasoning chunk, and the first answer chunk


def test_multi_line_events_are_counted_off_the_payload_template(monkeypatch: pytest.MonkeyPatch) -> None:
    # JSON split over two data lines: the payload holds a line end, so only the
    # parser can frame these events, and the template applies to its payloads.
    def event(i: int) -> bytes:
        return b'data: {"id":"c","choices":[{"index":0,"delta":{"content":" w%d"}}],\ndata: "x":1}\n\n' % i

    stream = [event(i) for i in range(40)] + [b"data: [DONE]\n\n"]
    calls = _counting_loads(monkeypatch)
    t = tally_of("chat", stream, keep_text=True)
    assert t.text == "".join(f" w{i}" for i in range(40)) and t.done
    assert len(calls) <= 3
    whole = b"".join(stream)
    for reads in (stream, [whole], [whole[i : i + 50] for i in range(0, len(whole), 50)]):
        assert facts("chat", reads, learn=True) == facts("chat", reads, learn=False)
