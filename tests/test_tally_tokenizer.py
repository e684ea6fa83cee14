"""Per-chunk token counts from a tokenizer, where a server sends no running usage.

A chunk can carry several tokens (speculative decoding, stream intervals): spreading
the final usage evenly over chunks gets most of them wrong, and ITL with them. With
the server's tokenizer the tally counts each chunk's text: the whole text tokenized
once, each token in the chunk its text ends in, then reconciled with the final usage
(token_counts.by_tokenizer). Running usage, where sent, still comes first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from chunks import Json, sse, tally_of, usage_chunk, vllm_chunk

from loadgen.client.protocol import chunk_texts
from loadgen.client.protocol.tally import StreamTally
from loadgen.client.protocol.token_counts import by_tokenizer
from loadgen.untrusted import MAX_TOKEN_COUNT
from loadgen.workload.tokenizer import BUILTIN, WORDS, HFTokenizer, count_pieces

# Chunks of 2, 3, 1 and 4 words: one builtin token per word and per punctuation mark.
PIECES = [" the old", " man sat on", " a", " bench, then left"]
TRUE = [2, 3, 1, 4]


def _stream(pieces: Sequence[str], usage: int | None = None, finish: Json | None = None) -> list[bytes]:
    events: list[bytes | Json] = [vllm_chunk({"role": "assistant", "content": ""}, None)]
    events += [vllm_chunk({"content": p}, None) for p in pieces]
    events.append(finish or vllm_chunk({}, None, finish="stop"))
    if usage is not None:
        events.append(usage_chunk(usage))
    return sse(*events, b"[DONE]")


def _tally(reads: list[bytes], keep_text: bool = False, learn: bool = True) -> StreamTally:
    t = StreamTally("chat", keep_text=keep_text, tokenizer=BUILTIN)
    if not learn:
        t._learns = 0  # never learn a template: every chunk is decoded
    for i, data in enumerate(reads):
        t.feed(data, 1000 * (i + 1))
    t.close()
    return t


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    """A tiny byte-level BPE (GPT-2 style), trained here, offline."""
    tokenizers = pytest.importorskip("tokenizers")
    g = np.random.default_rng(0)
    corpus = [" ".join(g.choice(WORDS, 20)) for _ in range(300)]
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    tk.train_from_iterator(
        corpus, tokenizers.trainers.BpeTrainer(vocab_size=400, show_progress=False, initial_alphabet=alphabet)
    )
    path: Path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tk.save(str(path))
    return HFTokenizer(path)


def test_count_pieces_counts_a_token_that_straddles_pieces_once() -> None:
    pieces = [" hel", "lo wor", "ld", "!", "", "  "]
    assert count_pieces(BUILTIN, pieces) == [0, 1, 1, 1, 0, 0]  # "hello" ends in piece 2, "world" in 3
    assert sum(count_pieces(BUILTIN, pieces)) == BUILTIN.count("".join(pieces)) == 3
    assert count_pieces(BUILTIN, []) == []


def test_hf_count_pieces_gives_back_the_tokens_each_chunk_was_made_of(hf: HFTokenizer) -> None:
    """Chunks cut at token boundaries, as a server streams them (2-4 tokens each, a
    character's bytes held back until it is whole): the counts are exactly the tokens
    each chunk was decoded from."""
    text = hf.words(60, np.random.default_rng(3)) + ', w\u00f6rld \U0001f600 {"city": 1}'
    ids = hf.encode(text)
    pieces: list[str] = []
    true: list[int] = []
    i, sizes = 0, [2, 3, 4, 1] * 40
    while i < len(ids):
        k = sizes[len(pieces)]
        while "\ufffd" in hf.decode(ids[i : i + k]):  # a detokenizer holds back a cut character
            k += 1
        pieces.append(hf.decode(ids[i : i + k]))
        true.append(len(ids[i : i + k]))
        i += k
    assert "".join(pieces) == text  # a byte-level BPE decodes back to the text
    assert count_pieces(hf, pieces) == true
    # counting each piece alone overcounts where a token straddles two: the whole text is counted once
    assert sum(count_pieces(hf, [" the wor", "ld"])) == hf.count(" the world")


def test_a_tokenizer_without_count_pieces_counts_each_piece() -> None:
    class Words:
        name = "words"

        def encode(self, text: str) -> list[int]:
            return list(range(self.count(text)))

        def decode(self, ids: Sequence[int]) -> str:
            return " w" * len(ids)

        def count(self, text: str) -> int:
            return len(text.split())

        def words(self, n: int, rng: np.random.Generator) -> str:
            return " w" * n

    assert count_pieces(Words(), [" a b", " c", ""]) == [2, 1, 0]


@pytest.mark.parametrize("learn", [True, False], ids=["template", "decoded"])
def test_multi_token_chunks_get_their_own_counts(learn: bool) -> None:
    t = _tally(_stream(PIECES), keep_text=True, learn=learn)
    assert t.chunk_ns == [2000, 3000, 4000, 5000]
    assert t.reconcile() == (TRUE, 10, "tokenizer")
    assert t.text == "".join(PIECES)
    # the same stream without a tokenizer: one per chunk, nothing better to go on
    assert tally_of("chat", _stream(PIECES)).reconcile() == ([1, 1, 1, 1], 4, "chunks")


def test_reads_of_many_events_keep_each_chunks_text_apart() -> None:
    pieces = [" a b", " c"] * 8 + [" d e f"]
    truth = [2, 1] * 8 + [3]
    reads = _stream(pieces, usage=sum(truth))
    one = StreamTally("chat", tokenizer=BUILTIN)  # one read: the template counts a run of events in one go
    one.feed(b"".join(reads[:3]), 1)  # the role chunk and two chunks teach the template
    one.feed(b"".join(reads[3:]), 2)
    one.close()
    assert one.reconcile() == (truth, 27, "tokenizer")
    whole = b"".join(reads)
    bytewise = _tally([whole[i : i + 7] for i in range(0, len(whole), 7)])
    assert bytewise.reconcile() == (truth, 27, "tokenizer")


def test_usage_equal_to_the_tokenizer_keeps_its_counts() -> None:
    assert _tally(_stream(PIECES, usage=10)).reconcile() == (TRUE, 10, "tokenizer")


def test_usage_above_the_tokenizer_spreads_the_surplus_and_keeps_the_total() -> None:
    # e.g. an end-of-sequence token the text does not show
    assert _tally(_stream(PIECES, usage=12)).reconcile() == ([2, 4, 1, 5], 12, "tokenizer")


def test_usage_below_the_tokenizer_takes_the_excess_in_proportion() -> None:
    # a tokenizer that is not quite the server's: the total is the server's, the shape the tokenizer's
    counts, total, source = _tally(_stream(PIECES, usage=7)).reconcile()
    assert (total, source) == (7, "tokenizer") and sum(counts) == 7
    assert counts == [1, 2, 1, 3] and min(counts) >= 1


def test_usage_below_one_per_chunk_keeps_the_tokenizer_counts() -> None:
    # an under-reporting server: the record keeps its usage beside these counts
    t = _tally(_stream(PIECES, usage=2))
    assert t.reconcile() == (TRUE, 10, "tokenizer") and t.completion_tokens == 2


def test_running_usage_comes_before_the_tokenizer() -> None:
    reads = sse(
        vllm_chunk({"role": "assistant", "content": ""}, 0),
        vllm_chunk({"content": " the old"}, 3),  # the server says 3 (its tokenizer is not ours)
        vllm_chunk({"content": " man"}, 4),
        vllm_chunk({}, 4, finish="stop"),
        b"[DONE]",
    )
    assert _tally(reads).reconcile() == ([3, 1], 4, "usage_per_chunk")


def test_a_chunk_inside_a_token_that_ends_later_still_counts_one() -> None:
    # " hel" then "lo": one token re-tokenized, but two chunks sent: each carried a token
    assert _tally(_stream([" hel", "lo", " world"], usage=3)).reconcile() == ([1, 1, 1], 3, "tokenizer")
    assert _tally(_stream([" hel", "lo", " world"])).reconcile() == ([1, 1, 1], 3, "tokenizer")


def test_reasoning_and_tool_arguments_are_counted_too() -> None:
    reads = sse(
        vllm_chunk({"role": "assistant", "content": ""}, None),
        vllm_chunk({"reasoning_content": " I should look"}, None),
        vllm_chunk(
            {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
            None,
        ),
        vllm_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "'}}]}, None),
        vllm_chunk({"tool_calls": [{"index": 0, "function": {"arguments": {"an": "object"}}}]}, None),
        vllm_chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'Paris"}'}}]}, None),
        vllm_chunk({}, None, finish="tool_calls"),
        b"[DONE]",
    )
    t = _tally(reads)
    assert t.chunk_ns == [2000, 4000, 5000, 6000]  # the header counts nothing
    # builtin: '{' '"' 'city' '"' ':' '"' | (an object: no text, still a chunk) | 'Paris' '"' '}'
    assert t.reconcile() == ([3, 6, 1, 3], 13, "tokenizer")


def test_past_the_cap_on_kept_text_it_counts_as_without_a_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunk_texts, "MAX_TOKENIZED_CHARS", 20)
    assert _tally(_stream(PIECES[:2])).reconcile() == ([2, 3], 5, "tokenizer")  # 19 characters
    t = _tally(_stream(PIECES, usage=10), keep_text=True)
    assert t.reconcile() == ([2, 3, 2, 3], 10, "usage")  # the final usage spread evenly, as without one
    assert t.text == "".join(PIECES)  # the kept text is another matter: all of it


def test_a_failing_tokenizer_is_a_problem_and_the_stream_counts_without_it() -> None:
    class Broken:
        name = "broken"

        def encode(self, text: str) -> list[int]:
            raise RuntimeError("no")

        def decode(self, ids: Sequence[int]) -> str:
            return ""

        def count(self, text: str) -> int:
            raise RuntimeError("no")

        def words(self, n: int, rng: np.random.Generator) -> str:
            return ""

    t = StreamTally("chat", tokenizer=Broken())
    for i, data in enumerate(_stream(PIECES, usage=8)):
        t.feed(data, i)
    t.close()
    assert t.reconcile() == ([2, 2, 2, 2], 8, "usage")
    assert t.problems == ["the tokenizer failed on the output (RuntimeError): counted without it"]


def test_lone_surrogates_read_leniently_are_counted() -> None:
    reads = _stream([" the"])[:2] + [b'data: {"choices":[{"index":0,"delta":{"content":" a\\ud800b"}}],"x":NaN}\n\n']
    t = _tally([*reads, b"data: [DONE]\n\n"])
    counts, total, source = t.reconcile()
    assert source == "tokenizer" and counts[0] == 1 and len(counts) == 2 and total == sum(counts)


@pytest.mark.parametrize(
    ("tokenized", "usage", "expected"),
    [
        ([2, 0, 3], None, ([2, 1, 3], 6)),  # a chunk counts at least 1
        ([2, 1, 3], 6, ([2, 1, 3], 6)),
        ([2, 1, 3], 9, ([3, 2, 4], 9)),  # surplus spread evenly
        ([1, 1, 1, 1], 5, ([1, 1, 1, 2], 5)),
        ([5, 1, 3], 6, ([3, 1, 2], 6)),  # deficit taken from the parts above 1 in proportion
        ([5, 1, 3], 3, ([1, 1, 1], 3)),
        ([5, 1, 3], 2, ([5, 1, 3], 9)),  # below one per chunk: the tokenizer's counts
        ([], None, ([], 0)),
        ([], 4, ([], 0)),
        ([1], MAX_TOKEN_COUNT, ([MAX_TOKEN_COUNT], MAX_TOKEN_COUNT)),
        ([MAX_TOKEN_COUNT, 1], None, ([1, 1], 2)),  # an impossible sum is never recorded
    ],
)
def test_by_tokenizer_rule(tokenized: list[int], usage: int | None, expected: tuple[list[int], int]) -> None:
    counts, total, _ = by_tokenizer(tokenized, usage)
    assert (counts, total) == expected
    assert all(1 <= c <= MAX_TOKEN_COUNT for c in counts) and sum(counts) == total <= MAX_TOKEN_COUNT


def test_by_tokenizer_sources() -> None:
    assert by_tokenizer([2, 1], None).source == by_tokenizer([2, 1], 7).source == "tokenizer"
    assert by_tokenizer([], None).source == "none" and by_tokenizer([], 3).source == "usage"
    assert by_tokenizer([MAX_TOKEN_COUNT, 1], None).source == "chunks"
