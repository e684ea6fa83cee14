"""Joining a run's records to the simulator's ground truth: loadgen's own timing error.

The simulator's ``--truth`` file has, per request, the instant it wrote each
token to the socket, on the same CLOCK_MONOTONIC as the client's
``perf_counter_ns``. The difference between the client's stamp of a chunk and
that instant is what loadgen adds (event-loop wake-up, parsing) plus loopback
delivery: the error of every figure loadgen reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

__all__ = ["TimingError", "timing_error"]


@dataclass(frozen=True)
class TimingError:
    """Per-sample errors in ms (client minus server); ``matched`` requests compared."""

    first_token: np.ndarray  # TTFT error: first chunk seen - first token written
    token: np.ndarray  # every token: seen - written
    itl: np.ndarray  # measured gap - true gap
    matched: int
    mismatched: int  # ok requests whose chunk count differs from the tokens written

    def percentiles(self) -> dict[str, tuple[float, float]]:
        def p(a: np.ndarray) -> tuple[float, float]:
            return (float(np.median(a)), float(np.percentile(a, 99))) if a.size else (float("nan"),) * 2

        return {"ttft": p(self.first_token), "token": p(self.token), "itl": p(np.abs(self.itl))}


def timing_error(records: pa.Table, truth_path: Path) -> TimingError:
    """Compare each ok request's chunk stamps with the tokens the simulator wrote for it."""
    by_rid = {t["rid"]: t for t in map(orjson.loads, Path(truth_path).read_bytes().splitlines())}
    rec = records.select(["run_id", "request", "status", "chunk_ns", "chunk_tokens"]).to_pydict()
    first: list[float] = []
    token: list[np.ndarray] = []
    itl: list[np.ndarray] = []
    matched = mismatched = 0
    for run_id, req, status, chunks, counts in zip(
        rec["run_id"], rec["request"], rec["status"], rec["chunk_ns"], rec["chunk_tokens"], strict=True
    ):
        t = by_rid.get(f"{run_id}-{req}")
        if status != "ok" or t is None:
            continue
        seen = np.repeat(np.asarray(chunks, dtype=np.int64), np.asarray(counts, dtype=np.int64))
        wrote = np.asarray(t.get("written_ns") or t["emit_ns"], dtype=np.int64)
        if len(seen) != len(wrote) or not len(seen):
            mismatched += 1
            continue
        matched += 1
        first.append(seen[0] - wrote[0])
        token.append(seen - wrote)
        itl.append(np.diff(seen) - np.diff(wrote))
    return TimingError(np.asarray(first) / 1e6, _ms(token), _ms(itl), matched, mismatched)


def _ms(parts: list[np.ndarray]) -> np.ndarray:
    """Nanosecond arrays joined, in ms (empty when there are none)."""
    return np.concatenate(parts) / 1e6 if parts else np.empty(0)
