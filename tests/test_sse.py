"""SSE framing: every variant servers send, the size cap, and split invariance."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.client.protocol.sse import BadStream, SSEError, SSEParser


def parse_whole(stream: bytes, **kw: int) -> list[bytes]:
    p = SSEParser(**kw)
    return p.feed(stream) + p.close()


def parse_pieces(pieces: list[bytes], **kw: int) -> list[bytes]:
    p = SSEParser(**kw)
    out: list[bytes] = []
    for piece in pieces:
        out += p.feed(piece)
    return out + p.close()


def bytewise(stream: bytes) -> list[bytes]:
    return [stream[i : i + 1] for i in range(len(stream))]


SNOWMAN = "\u2603 caf\u00e9 \U0001f600".encode()

CASES = [
    ("lf", b"data: a\n\ndata: b\n\n", [b"a", b"b"]),
    ("crlf", b"data: a\r\n\r\ndata: b\r\n\r\n", [b"a", b"b"]),
    ("lone cr", b"data: a\r\rdata: b\r\r", [b"a", b"b"]),
    ("mixed line ends", b"data: a\r\n\ndata: b\r\rdata: c\n\r\n", [b"a", b"b", b"c"]),
    ("comment block", b": keep-alive\n\ndata: a\n\n", [b"a"]),
    ("comment inside event", b"data: a\n: note\ndata: b\n\n", [b"a\nb"]),
    ("bare comment colon", b":\n\ndata: a\n\n", [b"a"]),
    ("multi-line data", b"data: a\ndata: b\ndata: c\n\n", [b"a\nb\nc"]),
    ("no space after colon", b"data:a\n\ndata:b\n\n", [b"a", b"b"]),
    ("only one space removed", b"data:  a\n\n", [b" a"]),
    ("mixed data styles", b"data:a\n\ndata: b\n\ndata:c\n\n", [b"a", b"b", b"c"]),
    ("no-space value with space", b"data:a\n\ndata:  b\n\n", [b"a", b" b"]),
    ("colon in value", b'data: {"a":"b:c"}\n\n', [b'{"a":"b:c"}']),
    ("done is a payload", b"data: x\n\ndata: [DONE]\n\n", [b"x", b"[DONE]"]),
    ("ends without done", b"data: x\n\ndata: y\n\n", [b"x", b"y"]),
    ("last event unterminated", b"data: x\n\ndata: y\n", [b"x", b"y"]),
    ("last line unterminated", b"data: x\n\ndata: y", [b"x", b"y"]),
    ("last line unterminated crlf", b"data: x\r\n\r\ndata: y\r\n", [b"x", b"y"]),
    (
        "unknown fields",
        b"event: message\nid: 7\nretry: 3000\nfoo: bar\nbaz\ndata: a\n\n",
        [b"a"],
    ),
    ("event without data", b"event: ping\nid: 1\n\ndata: a\n\n", [b"a"]),
    ("empty data field", b"data:\n\ndata\n\n", [b"", b""]),
    ("field name is exact", b"data : a\nDATA: b\ndata: c\n\n", [b"c"]),
    ("blank lines around", b"\n\n\ndata: a\n\n\n\n\ndata: b\n\n\n", [b"a", b"b"]),
    ("bom", b"\xef\xbb\xbfdata: a\n\n", [b"a"]),
    ("bom only at start", b"data: a\n\n\xef\xbb\xbfdata: b\n\n", [b"a"]),
    ("utf-8", b"data: " + SNOWMAN + b"\n\n", [SNOWMAN]),
    ("empty stream", b"", []),
    ("only comments", b": a\n: b\n\n:c\n", []),
]


@pytest.mark.parametrize("stream, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_framing(stream: bytes, expected: list[bytes]) -> None:
    assert parse_whole(stream) == expected
    assert parse_pieces(bytewise(stream)) == expected


def test_crlf_split_across_reads_is_one_line_end() -> None:
    # A CR ending one read and the LF starting the next are one line end: reading
    # them as two would insert a blank line and cut the event in two.
    assert parse_pieces([b"data: a\r", b"\ndata: b\r\n\r\n"]) == [b"a\nb"]
    assert parse_pieces([b"data: a\r", b"\n", b"\r", b"\n"]) == [b"a"]
    assert parse_pieces([b"data: a\r", b"", b"\n\r\n"]) == [b"a"]


def test_lone_cr_at_read_end_still_ends_the_line() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r\r") == [b"a"]
    assert p.feed(b"data: b\r\r") == [b"b"]


def test_events_are_returned_as_soon_as_complete() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\n") == []
    assert p.feed(b"\ndata: b\n\ndata: c") == [b"a", b"b"]
    assert p.feed(b"\n\n") == [b"c"]
    assert p.close() == []


def test_utf8_character_split_between_reads() -> None:
    stream = b"data: " + SNOWMAN + b"\n\n"
    for cut in range(len(stream) + 1):
        assert parse_pieces([stream[:cut], stream[cut:]]) == [SNOWMAN], cut


def test_close_resets_for_reuse() -> None:
    p = SSEParser()
    assert p.feed(b"data: a") == []
    assert p.close() == [b"a"]
    assert p.feed(b"data: b\n\n") == [b"b"]


@pytest.mark.parametrize(
    "pieces",
    [
        [b"data: " + b"x" * 20 + b"\n\n"],  # whole event in one read
        [b"data: " + b"x" * 20],  # an unterminated line
        [b"data: xxxx\n"] * 5,  # a multi-line event growing across reads
        [b"data: ok\n\ndata: " + b"x" * 20 + b"\n\ndata: ok\n\n"],  # big one among small
        [b": " + b"x" * 20 + b"\n\n"],  # comments count: they are held in memory too
        [b"data: " + b"x" * 20 + b"\r\n\r\n"],
    ],
)
def test_size_cap(pieces: list[bytes]) -> None:
    with pytest.raises(SSEError, match="longer than 16 bytes"):
        parse_pieces(pieces, max_event_bytes=16)
    with pytest.raises(SSEError):
        parse_pieces(bytewise(b"".join(pieces)), max_event_bytes=16)


def test_size_cap_is_inclusive_and_split_independent() -> None:
    event = b"data: " + b"x" * 10  # 16 bytes of event, cap 16: allowed
    for stream in (event + b"\n\n", event + b"\r\n\r\n", event + b"\n", event):
        assert parse_whole(stream, max_event_bytes=16) == [b"x" * 10]
        assert parse_pieces(bytewise(stream), max_event_bytes=16) == [b"x" * 10]
    assert parse_whole(b"\n\n\n" + event + b"\n\n\n", max_event_bytes=16) == [b"x" * 10]


def test_sse_error_is_a_bad_stream() -> None:
    assert issubclass(SSEError, BadStream)
    with pytest.raises(ValueError):
        SSEParser(max_event_bytes=0)


# ---- property: any split of the byte stream gives the same payloads ----------------

LINE_ENDS = [b"\n", b"\r\n", b"\r"]
text_value = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12).map(
    lambda s: s.encode("utf-8")
)
json_value = st.sampled_from(
    [b'{"choices":[{"delta":{"content":" hi"}}]}', b"[DONE]", b'{"x":"\xc3\xa9\xf0\x9f\x98\x80"}']
)
value = st.one_of(text_value, json_value)
comment = text_value.map(lambda v: b":" + v)
other_field = st.sampled_from([b"event: message", b"id: 42", b"retry: 1000", b"id", b"foo:bar"])


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """A serialized stream and the payloads the spec says it carries."""
    eol = draw(st.sampled_from(LINE_ENDS))
    events = draw(st.lists(st.lists(value, max_size=3), max_size=6))
    out = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    expected = []
    for i, lines in enumerate(events):
        for _ in range(draw(st.integers(0, 2))):  # blank lines before the event
            out.append(eol)
        body = []
        for v in lines:
            if draw(st.booleans()):
                body.append(draw(st.one_of(comment, other_field)))
            bare = draw(st.booleans()) and not v.startswith(b" ")
            body.append((b"data:" if bare else b"data: ") + v)
        if draw(st.booleans()):
            body.append(draw(comment))
        if not body:
            continue
        last = i == len(events) - 1
        # The last event may end without its blank line, or without any line end.
        ending = draw(st.sampled_from([2, 1, 0])) if last else 2
        out.append(eol.join(body) + eol * ending)
        if lines:
            expected.append(b"\n".join(lines))
    return b"".join(out), expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=sse_streams(), data=st.data())
def test_any_split_gives_the_same_payloads(case: tuple[bytes, list[bytes]], data: st.DataObject) -> None:
    stream, expected = case
    assert parse_whole(stream) == expected
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert parse_pieces(pieces) == expected


@settings(max_examples=60, deadline=None)
@given(case=sse_streams())
def test_bytewise_feed_gives_the_same_payloads(case: tuple[bytes, list[bytes]]) -> None:
    stream, expected = case
    assert parse_pieces(bytewise(stream)) == expected


def outcome(pieces: list[bytes], cap: int) -> list[bytes] | str:
    try:
        return parse_pieces(pieces, max_event_bytes=cap)
    except SSEError:
        return "too big"


@settings(max_examples=100, deadline=None)
@given(case=sse_streams(), cap=st.integers(1, 40), data=st.data())
def test_size_cap_does_not_depend_on_the_split(case: tuple[bytes, list[bytes]], cap: int, data: st.DataObject) -> None:
    stream, _ = case
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert outcome(pieces, cap) == outcome([stream], cap)
