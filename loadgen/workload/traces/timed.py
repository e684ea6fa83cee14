"""Timed trace replay: requests that arrive when the trace says, one request per session.

The Mooncake, Azure and BurstGPT traces record when each request arrived and how
long its prompt and answer were; they are read into one ``Requests`` table so
that replaying them is a single workload, ``RequestTrace``, whatever the file
looked like. The arrival times come with the workload (``offsets_ns()``) instead
of from an arrival spec, because the burstiness of real traffic is what these
traces are for; ``gap_stats`` summarises it for previews.

``offsets_ns()`` are int64 ns, sorted, divided by ``speed``, cut to
``[start, start + window)`` seconds of trace time, at most ``max_requests``,
starting at 0. Files are read once into arrays; sessions are built on demand.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from loadgen.errors import SpecError
from loadgen.workload.base import Base
from loadgen.workload.session import Session, Turn
from loadgen.workload.text import rng
from loadgen.workload.traces.blocks import Blocks

__all__ = ["Requests", "requests_from_times", "select", "ArrivalStats", "gap_stats", "RequestTrace"]

_TAG_UNIQUE = 23
_REUSE_CAP = 100_000  # requests scanned for block-reuse statistics


@dataclass(frozen=True)
class Requests:
    """One row per request, in file order; ``hash_ids`` of row r are
    ``hash_flat[hash_off[r]:hash_off[r + 1]]`` (flat arrays: a million-row trace
    stays two arrays, not a million lists)."""

    t_s: npt.NDArray[np.float64]
    input: npt.NDArray[np.int64]
    output: npt.NDArray[np.int64]
    hash_flat: npt.NDArray[np.int64] | None = None
    hash_off: npt.NDArray[np.int64] | None = None

    def hash_ids(self, r: int) -> npt.NDArray[np.int64] | None:
        if self.hash_flat is None or self.hash_off is None:
            return None
        return self.hash_flat[self.hash_off[r] : self.hash_off[r + 1]]


def requests_from_times(path: Path, t_ns: list[int], inp: list[int], out: list[int]) -> Requests:
    """A table from integer-ns arrival times (epoch times keep their digits), shifted to start at 0."""
    if not t_ns:
        raise SpecError(f"{path}: no requests in the trace (after filters)")
    ns = np.asarray(t_ns, dtype=np.int64)
    return Requests((ns - ns.min()) / 1e9, np.asarray(inp, np.int64), np.asarray(out, np.int64))


def select(
    t_s: npt.NDArray[np.float64], start_s: float, window_s: float | None, max_requests: int | None
) -> npt.NDArray[np.intp]:
    """Row indices to replay, in time order (ties keep file order)."""
    order = np.argsort(t_s, kind="stable")
    rel = t_s[order] - t_s[order[0]]
    keep = rel >= start_s
    if window_s is not None:
        keep &= rel < start_s + window_s
    idx: npt.NDArray[np.intp] = order[keep]
    return idx[:max_requests] if max_requests is not None else idx


class ArrivalStats(TypedDict):
    requests: int
    duration_s: float
    rate_per_s: float | None
    gap_cv: float | None  # coefficient of variation of the gaps: 1 for Poisson, > 1 bursty


def gap_stats(offsets_ns: npt.NDArray[np.int64]) -> ArrivalStats:
    """Duration, mean rate and burstiness (CV of inter-arrival gaps) of a schedule."""
    n = len(offsets_ns)
    dur = float(offsets_ns[-1] - offsets_ns[0]) / 1e9 if n else 0.0
    gaps = np.diff(offsets_ns) / 1e9
    cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else None
    return {"requests": n, "duration_s": dur, "rate_per_s": (n - 1) / dur if dur > 0 else None, "gap_cv": cv}


@dataclass(frozen=True, kw_only=True)
class RequestTrace(Base):
    """Timed single-request sessions (mooncake, azure, burstgpt)."""

    kind = "trace"
    format: str
    path: str
    table: Requests
    idx: npt.NDArray[np.intp]
    speed: float = 1.0
    start_s: float = 0.0
    window_s: float | None = None
    max_requests: int | None = None
    block_tokens: int = 512
    output_tokens: int | None = None
    max_output: int | None = None

    @cached_property
    def _blocks(self) -> Blocks:
        return Blocks(self.text, self.seed)

    @property
    def size(self) -> int | None:
        return len(self.idx)

    def offsets_ns(self) -> npt.NDArray[np.int64] | None:
        return self._offsets

    @cached_property
    def _offsets(self) -> npt.NDArray[np.int64]:
        t: npt.NDArray[np.float64] = self.table.t_s[self.idx]
        return np.rint((t - float(t[0])) * 1e9 / self.speed).astype(np.int64)

    def _build(self, j: int) -> Session:
        r = int(self.idx[j])
        n = max(1, int(self.table.input[r]))
        out = self.output_tokens or max(1, int(self.table.output[r]))
        if self.max_output:
            out = min(out, self.max_output)
        ids = self.table.hash_ids(r)
        fill = partial(rng, self.seed, _TAG_UNIQUE, r)
        if ids is not None and len(ids):
            text = self._blocks.text(0, ids, n, self.block_tokens, fill)
        else:
            text = self.text.words(n, fill())
        return Session(session=j, turns=(Turn(text=text, max_tokens=out, prompt_tokens=n),))

    @cached_property
    def reuse(self) -> dict[str, Any] | None:
        """Fraction of hash blocks seen in an earlier request, and in a leading run of
        seen blocks (what an unbounded prefix cache can hit)."""
        table = self.table
        if table.hash_flat is None or table.hash_off is None or not len(table.hash_flat):
            return None
        seen: set[int] = set()
        total = again = prefix = 0
        for r in self.idx[:_REUSE_CAP].tolist():
            ids = table.hash_flat[table.hash_off[r] : table.hash_off[r + 1]].tolist()
            hits = [h in seen for h in ids]
            total += len(ids)
            again += sum(hits)
            prefix += next((i for i, hit in enumerate(hits) if not hit), len(hits))
            seen.update(ids)
        return {
            "requests": min(len(self.idx), _REUSE_CAP),
            "blocks_seen_before": again / max(total, 1),
            "blocks_in_cached_prefix": prefix / max(total, 1),
        }

    def _describe(self) -> dict[str, Any]:
        inp, out = self.table.input[self.idx], self.table.output[self.idx]
        d: dict[str, Any] = {
            "format": self.format,
            "path": self.path,
            "rows": len(self.table.t_s),
            "speed": self.speed,
            "start_s": self.start_s,
            "window_s": self.window_s,
            "max_requests": self.max_requests,
            "output_tokens": self.output_tokens,
            "max_output": self.max_output,
            "mean_input": float(inp.mean()),
            "mean_output": float(out.mean()),
            "arrivals": gap_stats(self._offsets),
        }
        if self.format == "mooncake":
            d["block_tokens"] = self.block_tokens
            d["reuse"] = self.reuse
        return d
