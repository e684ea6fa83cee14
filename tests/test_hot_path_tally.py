"""The tally's hot-path shortcuts change no result (issue 18).

- A route's streams share the content template one of them learned (``template.Learned``): a
  stream takes it up at its first decoded content chunk, if that chunk fits it, instead of
  probing again. Every figure a tally gives is the same with the sharing as without it,
  whatever the next stream sends: the same chunks, chunks of another id, chunks that fit the
  template's bytes but whose text is escaped, reasoning, a finish on a content chunk.
- The per-chunk times and counts are held compactly (``array``) and read out as lists.
"""

from __future__ import annotations

from typing import Any

from loadgen.client.protocol.tally import StreamTally
from loadgen.client.protocol.template import Learned


def _chunk(content: str, *, rid: str = "a", finish: str | None = None, key: str = "content") -> bytes:
    fr = "null" if finish is None else f'"{finish}"'
    return (
        b'data: {"id":"%s","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"%s":"%s"},'
        b'"finish_reason":%s}]}\n\n' % (rid.encode(), key.encode(), content.encode(), fr.encode())
    )


TAIL = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}\n\ndata: [DONE]\n\n'
ROLE = b'data: {"id":"a","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'


def _figures(tally: StreamTally, reads: list[bytes]) -> tuple[Any, ...]:
    for t, data in enumerate(reads, start=1):
        tally.feed(data, 1000 * t)
    tally.close()
    counted = tally.reconcile()
    return (
        tally.chunk_ns,
        tally.chunk_tokens,
        counted,
        tally.events,
        tally.t_first_content,
        tally.finish_reason,
        tally.completion_tokens,
        tally.text,
        tally.end,
        tally.problems,
    )


STREAMS = {
    "alike": [ROLE, _chunk(" w1"), _chunk(" w2"), _chunk(" w3") + _chunk(" w4"), _chunk("", finish="stop"), TAIL],
    "another id": [_chunk(" x", rid="b"), _chunk(" y", rid="b"), TAIL],
    "escaped text": [_chunk(' \\"q\\"'), _chunk(" \\n"), _chunk(" plain"), TAIL],
    "reasoning first": [_chunk(" think", key="reasoning_content"), _chunk(" so"), _chunk(" w"), TAIL],
    "finish on content": [_chunk(" w1"), _chunk(" last", finish="length"), TAIL],
    "one read": [b"".join([_chunk(f" w{i}") for i in range(12)]) + TAIL],
}


def test_every_figure_is_the_same_with_the_route_template_shared_as_without() -> None:
    for keep_text in (False, True):
        learned = Learned()
        first = _figures(StreamTally("chat", keep_text=keep_text, learned=learned), STREAMS["alike"])
        assert learned.template is not None  # the first stream taught the route
        assert first == _figures(StreamTally("chat", keep_text=keep_text), STREAMS["alike"])
        for name, reads in STREAMS.items():
            shared = _figures(StreamTally("chat", keep_text=keep_text, learned=learned), reads)
            alone = _figures(StreamTally("chat", keep_text=keep_text), reads)
            assert shared == alone, name


def test_a_stream_takes_up_the_route_template_at_its_first_decoded_content_chunk() -> None:
    learned = Learned()
    _figures(StreamTally("chat", learned=learned), STREAMS["alike"])
    taught = learned.template
    t = StreamTally("chat", learned=learned)
    t.feed(_chunk(" w1"), 5)
    assert t._tpl is taught and t.t_first_content == 5 and t.chunk_ns == [5]
    other = StreamTally("chat", learned=learned)
    other.feed(_chunk(" x", rid="b"), 6)  # another id: a template of its own, now the route's
    assert other._tpl is not None and other._tpl is not taught and learned.template is other._tpl


def test_counts_other_than_one_are_kept_beside_the_ones() -> None:
    running = [
        b'data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":1,"completion_tokens":%d}}'
        b"\n\n" % c
        for c in (1, 2, 5, 6)
    ]
    t = StreamTally("chat")
    for k, data in enumerate(running):
        t.feed(data, k)
    assert t.chunk_ns == [0, 1, 2, 3] and t.chunk_tokens == [1, 1, 3, 1]
    assert type(t.chunk_ns) is list and t.t_output == 0
