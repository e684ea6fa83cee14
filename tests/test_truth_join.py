"""Joining records to the simulator's truth, on hand-made lines (no run, no clock): chunk by chunk,
a header taken for output shifts every later chunk, a spread count is wrong where the server's was not."""

from __future__ import annotations

import orjson
import pyarrow as pa

from loadgen.sim.truth import timing_error

MS = 1_000_000


def _join(tmp_path, truth: dict, chunk_ns: list[int], chunk_tokens: list[int], status: str = "ok"):
    path = tmp_path / "truth.jsonl"
    path.write_bytes(orjson.dumps({"rid": "run-1", "emit_ns": truth["written_ns"], **truth}) + b"\n")
    records = pa.table(
        {
            "run_id": ["run"],
            "request": [1],
            "status": [status],
            "chunk_ns": [chunk_ns],
            "chunk_tokens": [chunk_tokens],
        }
    )
    return timing_error(records, path)


def test_multi_token_chunks_compare_by_chunk_and_by_token(tmp_path):
    """Server: chunks of 3, 1, 2 tokens at 10, 20, 30 ms. Client: each seen 1 ms late, counts spread 2, 2, 2."""
    truth = {"written_ns": [10 * MS] * 3 + [20 * MS] + [30 * MS] * 2, "chunk_tokens": [3, 1, 2]}
    err = _join(tmp_path, truth, [11 * MS, 21 * MS, 31 * MS], [2, 2, 2])
    assert err.first_token.tolist() == [1.0] and err.chunk.tolist() == [1.0, 1.0, 1.0]
    assert err.count.tolist() == [-1, 1, 0] and err.wrong_counts() == 2 / 3
    assert err.percentiles()["count"][0] == 1.0
    assert err.matched == 1 and err.chunks_mismatched == 0  # the token total is right, per token not quite
    assert err.token.tolist() == [1.0, 1.0, 11.0, 1.0, 1.0, 1.0]


def test_a_header_counted_as_output_shows_as_a_ttft_and_chunk_error(tmp_path):
    """The server wrote 3 argument tokens at 50, 60, 70 ms; the client also counted the header it sent
    at receipt (0 ms) as a chunk: TTFT 50 ms early, every chunk a gap early, one chunk too many."""
    truth = {"written_ns": [50 * MS, 60 * MS, 70 * MS]}  # a truth file without chunk_tokens: one token each
    err = _join(tmp_path, truth, [0, 50 * MS, 60 * MS, 70 * MS], [1, 1, 1, 1])
    assert err.first_token.tolist() == [-50.0] and err.chunk.tolist() == [-50.0, -10.0, -10.0]
    assert err.chunks_mismatched == 1 and err.mismatched == 1 and err.matched == 0


def test_requests_that_did_not_end_ok_are_left_out(tmp_path):
    err = _join(tmp_path, {"written_ns": [5 * MS]}, [6 * MS], [1], status="timeout")
    assert err.first_token.size == err.chunk.size == 0 and err.matched == err.mismatched == 0
