"""Joining a run's records to the simulator's ground truth: loadgen's own timing error.

The simulator's ``--truth`` file has, per request, the instant it wrote each
token to the socket (``written_ns``), on the same CLOCK_MONOTONIC as the client's
``perf_counter_ns``, and how many tokens each output-carrying SSE event carried
(``chunk_tokens``; absent in files from before it was written: one token an event).
The difference between the client's stamp of a chunk and that instant is what
loadgen adds (event-loop wake-up, parsing) plus loopback delivery: the error of
every figure loadgen reports. The difference between the tokens the client gives
a chunk and the tokens the server put in it is the error of its per-chunk counts
(what ITL is computed from when chunks carry several tokens).

Chunks are compared in order, over the chunks both sides have: a client that takes
a chunk without output (a tool call's header) for output is off by a whole gap on
every later chunk, which is what it reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

__all__ = ["TimingError", "timing_error"]


@dataclass(frozen=True)
class TimingError:
    """Per-sample errors (client minus server): times in ms, counts in tokens."""

    first_token: np.ndarray  # TTFT error, per ok request: t_first (else the first chunk seen) - first token written
    token: np.ndarray  # every token of a request whose token total is right: seen - written
    itl: np.ndarray  # same requests, every gap: measured gap - true gap
    chunk: np.ndarray  # every output chunk, in order: seen - written (the instant its first token went out)
    count: np.ndarray  # every output chunk, in order: tokens recorded - tokens the server wrote in it
    matched: int  # ok requests with as many tokens recorded as written
    mismatched: int  # ok requests whose recorded token total differs from the tokens written
    chunks_mismatched: int = 0  # ok requests with another number of output chunks than the server wrote

    def percentiles(self) -> dict[str, tuple[float, float]]:
        """p50 and p99 of each: TTFT, token and chunk arrival errors signed; ITL and count errors absolute."""

        def p(a: np.ndarray) -> tuple[float, float]:
            return (float(np.median(a)), float(np.percentile(a, 99))) if a.size else (float("nan"),) * 2

        return {
            "ttft": p(self.first_token),
            "token": p(self.token),
            "itl": p(np.abs(self.itl)),
            "chunk": p(self.chunk),
            "count": p(np.abs(self.count)),
        }

    def wrong_counts(self) -> float:
        """The share of output chunks given another number of tokens than the server wrote in them."""
        return float(np.count_nonzero(self.count)) / self.count.size if self.count.size else float("nan")


def timing_error(records: pa.Table, truth_path: Path) -> TimingError:
    """Compare each ok request's chunk stamps and counts with what the simulator wrote for it."""
    by_rid = {t["rid"]: t for t in map(orjson.loads, Path(truth_path).read_bytes().splitlines())}
    rec = records.select(["run_id", "request", "status", "chunk_ns", "chunk_tokens"]).to_pydict()
    # TTFT as the metrics take it: the record's t_first (the first output-carrying chunk)
    t_first = records.column("t_first").to_pylist() if "t_first" in records.column_names else None
    first: list[float] = []
    token: list[np.ndarray] = []
    itl: list[np.ndarray] = []
    chunk: list[np.ndarray] = []
    count: list[np.ndarray] = []
    matched = mismatched = chunks_mismatched = 0
    for i, (run_id, req, status, chunks, counts) in enumerate(
        zip(rec["run_id"], rec["request"], rec["status"], rec["chunk_ns"], rec["chunk_tokens"], strict=True)
    ):
        t = by_rid.get(f"{run_id}-{req}")
        if status != "ok" or t is None:
            continue
        seen_chunks = np.asarray(chunks, dtype=np.int64)
        seen_counts = np.asarray(counts, dtype=np.int64)
        wrote = np.asarray(t.get("written_ns") or t["emit_ns"], dtype=np.int64)
        true_counts, true_chunks = _true_chunks(t, wrote)
        n = min(len(seen_chunks), len(true_chunks))
        if n:
            t0 = t_first[i] if t_first is not None and t_first[i] is not None else seen_chunks[0]
            first.append(t0 - true_chunks[0])
            chunk.append(seen_chunks[:n] - true_chunks[:n])
            count.append(seen_counts[:n] - true_counts[:n])
        chunks_mismatched += len(seen_chunks) != len(true_chunks)
        seen = np.repeat(seen_chunks, np.maximum(seen_counts, 0))
        if len(seen) != len(wrote) or not len(seen):
            mismatched += 1
            continue
        matched += 1
        token.append(seen - wrote)
        itl.append(np.diff(seen) - np.diff(wrote))
    return TimingError(
        np.asarray(first) / 1e6,
        _ms(token),
        _ms(itl),
        _ms(chunk),
        _joined(count),
        matched,
        mismatched,
        chunks_mismatched,
    )


def _true_chunks(t: dict[str, Any], wrote: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of each output chunk the server wrote, and the instant each was written."""
    counts = np.asarray(t.get("chunk_tokens") or [1] * len(wrote), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if counts.size else counts
    if counts.sum() != len(wrote):  # a truth line that does not add up: compare nothing of it by chunk
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return counts, wrote[starts]


def _ms(parts: list[np.ndarray]) -> np.ndarray:
    """Nanosecond arrays joined, in ms (empty when there are none)."""
    return _joined(parts) / 1e6


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0)
