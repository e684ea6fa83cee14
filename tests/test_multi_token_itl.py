"""ITL of streams whose chunks carry several tokens (speculative decoding, stream intervals):
with per-chunk counts from running usage or from a tokenizer, the ITL distribution is the
truth's; spreading the final usage evenly over the chunks is not (issue 15)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from fake_wire import Answer, FakeTransport, Read, plan, run

from loadgen.analysis.metrics import summarize
from loadgen.records import read_stream

SIZES = [2, 3, 4, 2, 4, 3, 2, 2, 4, 4, 3, 2, 3, 4, 2, 3] * 4  # tokens per chunk, 2-4
TOKEN_MS = 10.0  # the server makes one token each 10 ms and sends a chunk when it holds k of them


def _chunk(first: int, k: int, running: bool) -> bytes:
    text = "".join(f" w{first + j}" for j in range(k))
    event: dict[str, object] = {"choices": [{"index": 0, "delta": {"content": text}}]}
    if running:
        event["usage"] = {"prompt_tokens": 4, "completion_tokens": first + k}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def _answer(running: bool) -> Answer:
    reads, made = [], 0
    for k in SIZES:
        reads.append(Read(0.0 if made == 0 else k * TOKEN_MS, _chunk(made, k, running)))
        made += k
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": made}}
    reads.append(Read(0.0, b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"))
    return Answer(head_ms=50.0, reads=reads)


def _itl_p99(tmp_path: Path, running: bool, tokenizer: str | None = None) -> tuple[float, list[str]]:
    rec, _, _ = run(tmp_path, lambda c: FakeTransport(c, _answer(running)), plan([0, 2000, 4000]), tokenizer=tokenizer)
    assert rec["status"] == ["ok"] * 3
    s = summarize(read_stream(tmp_path / "r.arrows"))
    return s.itl.pct(99)[0], rec["output_tokens_source"]


@pytest.mark.parametrize(
    ("running", "tokenizer", "source"),
    [(True, None, "usage_per_chunk"), (False, "builtin", "tokenizer")],
    ids=["running usage", "tokenizer"],
)
def test_per_chunk_counts_give_the_true_itl_p99(
    tmp_path: Path, running: bool, tokenizer: str | None, source: str
) -> None:
    p99, sources = _itl_p99(tmp_path, running, tokenizer)
    assert sources == [source] * 3
    assert abs(p99 - TOKEN_MS) <= 0.05 * TOKEN_MS, f"ITL p99 {p99:.2f} ms against a true {TOKEN_MS} ms"


def test_the_final_usage_spread_over_the_chunks_bends_the_itl_p99(tmp_path: Path) -> None:
    """Why per-chunk counts matter: an even spread gives a 4-token chunk 3 tokens (and a
    2-token one 3), so ITL percentiles come out wrong in both tails."""
    p99, sources = _itl_p99(tmp_path, running=False)
    assert sources == ["usage"] * 3
    assert p99 > 1.2 * TOKEN_MS, f"ITL p99 {p99:.2f} ms: the spread was expected to bend it"
