"""The lean wire's response parser (client/wire/parser.py) on byte literals: any split of an
answer gives the same head, body and end; every bound and every broken framing is refused."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from loadgen.client.wire.parser import MAX_CHUNK_LINE_BYTES, MAX_HEAD_BYTES, MAX_LINE_BYTES, ParseError, ResponseParser

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENTS = [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]
CHUNKED = HEAD + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"
WITH_EXTENSIONS = HEAD + b"f;name=value\r\n" + EVENTS[0][:15] + b"\r\n0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n"
LENGTH = b"HTTP/1.1 503 Busy\r\nContent-Length: 11\r\nRetry-After: 2\r\n\r\nhello world"


class Seen:
    """What the parser handed on (a parser.Sink, which takes the body once the head came)."""

    def __init__(self, parser: ResponseParser | None = None) -> None:
        self.heads: list[tuple[int, dict[str, str]]] = []
        self.pieces: list[bytes] = []
        self.times: list[int] = []
        self.ends = 0
        self.parser = parser

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.heads.append((status, headers))
        assert self.parser is not None
        self.parser.on_body = self.body

    def body(self, data: bytes, t: int) -> None:
        assert self.heads and not self.ends, "body outside an answer"
        self.pieces.append(data)
        self.times.append(t)

    def end(self) -> None:
        self.ends += 1


def parse(reads: Iterable[bytes]) -> tuple[Seen, ResponseParser, bytes]:
    """Each read fed with its index as its time."""
    seen = Seen()
    parser = seen.parser = ResponseParser(seen)
    parser.expect()
    extra = b""
    for t, data in enumerate(reads):
        extra += parser.feed(data, t)
    return seen, parser, extra


def splits(data: bytes, every: int = 1) -> Iterable[list[bytes]]:
    """``data`` cut in two at every offset (or every ``every``-th: a long literal), then byte by byte."""
    for i in range(0, len(data) + 1, every):
        yield [data[:i], data[i:]]
    yield [data[i : i + 1] for i in range(len(data))]


@pytest.mark.parametrize("answer", [CHUNKED, WITH_EXTENSIONS, LENGTH], ids=["chunked", "extensions-trailers", "length"])
def test_an_answer_split_anywhere_parses_the_same(answer: bytes) -> None:
    whole, parser, extra = parse([answer])
    assert whole.ends == 1 and parser.done and extra == b""
    for reads in splits(answer):
        seen, parser, extra = parse(reads)
        assert seen.heads == whole.heads and seen.ends == 1 and extra == b""
        assert b"".join(seen.pieces) == b"".join(whole.pieces)
    assert b"".join(parse([CHUNKED])[0].pieces) == b"".join(EVENTS)
    assert b"".join(parse([WITH_EXTENSIONS])[0].pieces) == EVENTS[0][:15]


def test_one_read_of_one_chunk_is_handed_on_as_one_piece_with_its_time() -> None:
    seen, _, _ = parse([HEAD, b"%x\r\n%s\r\n" % (len(EVENTS[0]), EVENTS[0]), b"0\r\n\r\n"])
    assert seen.pieces == [EVENTS[0]] and seen.times == [1]
    seen, _, _ = parse([HEAD + b"3\r\nabc\r\n", b"2\r", b"\nde\r\n0\r\n\r\n"])
    assert seen.pieces == [b"abc", b"de"] and seen.times == [0, 2]


def test_the_whole_chunks_of_one_read_are_handed_on_as_one_piece() -> None:
    burst = b"3\r\nabc\r\n2\r\nde\r\n1\r\nf\r\n4\r\nghij"  # the last chunk cut by the read's end
    seen, _, _ = parse([HEAD, burst, b"\r\n0\r\n\r\n"])
    assert seen.pieces == [b"abcdef", b"ghij"] and seen.times == [1, 1] and seen.ends == 1


def test_an_answers_last_read_of_whole_chunks_and_the_last_chunk_is_one_piece_and_the_end() -> None:
    seen, parser, extra = parse([HEAD, b"3\r\nabc\r\n", b"2\r\nde\r\n", b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"])
    assert seen.pieces == [b"abc", b"de", b"abcde"] and seen.times == [1, 2, 3]
    assert seen.ends == 1 and parser.done and extra == b""
    # a payload that itself ends like the last chunk is still a payload: the answer goes on
    seen, parser, _ = parse([HEAD, b"7\r\nab\r\n0\r\n\r\n"])
    assert seen.pieces == [b"ab\r\n0\r\n"] and seen.ends == 0 and not parser.done


def test_the_head_gives_status_headers_and_whether_the_connection_is_kept() -> None:
    seen, parser, _ = parse([LENGTH])
    assert seen.heads == [(503, {"content-length": "11", "retry-after": "2"})]
    assert parser.keep_alive
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    old = b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"
    old_kept = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"
    assert [parse([a])[1].keep_alive for a in (closing, old, old_kept)] == [False, False, True]


def test_an_interim_answer_is_skipped_and_a_204_has_no_body() -> None:
    seen, parser, extra = parse([b"HTTP/1.1 100 Continue\r\n\r\n" + LENGTH])
    assert [s for s, _ in seen.heads] == [503] and b"".join(seen.pieces) == b"hello world"
    seen, parser, extra = parse([b"HTTP/1.1 204 No Content\r\n\r\nnext"])
    assert seen.ends == 1 and seen.pieces == [] and extra == b"next"  # what follows is not its body


def test_a_body_without_length_runs_until_the_close() -> None:
    seen, parser, _ = parse([b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", b"data: x\n\n"])
    assert parser.until_close and not parser.keep_alive and seen.ends == 0
    parser.eof()
    assert seen.ends == 1 and seen.pieces == [b"data: x\n\n"]


@pytest.mark.parametrize(
    "answer,says",
    [
        (CHUNKED[: len(HEAD) + 5], "last chunk"),
        (LENGTH[:-3], "3 bytes of the body still owed"),
        (HEAD[:20], "before the answer's head"),
    ],
    ids=["chunked", "length", "head"],
)
def test_a_close_before_the_answer_ended_is_an_error_saying_how_far_it_got(answer: bytes, says: str) -> None:
    _, parser, _ = parse([answer])
    with pytest.raises(ParseError, match=says) as e:
        parser.eof()
    assert e.value.in_body == (says != "before the answer's head")


def test_a_header_line_over_its_bound_is_refused_before_the_head_ends() -> None:
    start = b"HTTP/1.1 200 OK\r\nX-Huge: "
    with pytest.raises(ParseError, match=f"longer than {MAX_LINE_BYTES}") as e:
        parse([start, b"x" * MAX_LINE_BYTES])  # no blank line yet: refused as it grows
    assert not e.value.in_body
    with pytest.raises(ParseError, match=f"line is longer than {MAX_LINE_BYTES}"):  # the line, not the head
        parse([start + b"x" * (1 << 20) + b"\r\n\r\n"])
    ok_line = start + b"x" * (MAX_LINE_BYTES - len(start) + 2)
    seen, _, _ = parse([ok_line + b"\r\nContent-Length: 0\r\n\r\n"])
    assert seen.ends == 1


def test_a_head_over_its_bound_is_refused() -> None:
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(MAX_HEAD_BYTES // 100))
    with pytest.raises(ParseError, match=f"head is longer than {MAX_HEAD_BYTES}"):
        parse([b"HTTP/1.1 200 OK\r\n" + many])


@pytest.mark.parametrize(
    "body,says",
    [
        (b"zz\r\n", "bad chunk size"),
        (b"-1\r\n", "bad chunk size"),
        (b"\r\n", "bad chunk size"),
        (b"3\nabc", "bad chunk-size line"),
        (b"3\r\nabcX", "not followed by CRLF"),
        (b"3\r\nabc\rX", "not followed by CRLF"),
        (b"1" * (MAX_CHUNK_LINE_BYTES + 1), "chunk-size line longer"),
        (b"0\r\nX-T: " + b"t" * MAX_LINE_BYTES, "trailer line is longer"),
    ],
    ids=["not-hex", "negative", "empty", "bare-lf", "no-crlf", "cr-then-junk", "long-size-line", "long-trailer"],
)
def test_broken_chunked_framing_is_refused_at_every_split(body: bytes, says: str) -> None:
    for reads in splits(HEAD + body, every=1 if len(body) < 100 else 97):
        with pytest.raises(ParseError, match=says) as e:
            parse(reads)
        assert e.value.in_body


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",
    ],
    ids=["http2", "not-http", "short-status", "not-a-header", "two-lengths", "negative-length"],
)
def test_a_head_that_is_not_http_1_is_refused(head: bytes) -> None:
    with pytest.raises(ParseError) as e:
        parse([head])
    assert not e.value.in_body


def test_bytes_after_the_answer_are_given_back() -> None:
    seen, parser, extra = parse([CHUNKED + b"HTTP/1.1 200"])
    assert seen.ends == 1 and extra == b"HTTP/1.1 200"
