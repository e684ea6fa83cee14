"""Output tokens by when their chunks arrived in a window, and the interval of output tok/s.

A summary's throughput counts the tokens whose chunks arrived in the measurement window (of
every request, and of the ok ones); the interval of output tok/s cuts the same window into
``BATCHES`` batches and counts each batch's tokens (batch means). Both come from one walk over
the chunks (``window_tokens``, once per table and window), not one each: a run of a million
requests has over a hundred million chunks.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.analysis.chunk_walk import chunk_blocks
from loadgen.analysis.columns import Cols, Floats
from loadgen.analysis.distributions import t_ppf
from loadgen.analysis.window import Window

__all__ = ["BATCHES", "WindowTokens", "window_tokens", "throughput_ci"]

BATCHES = 8  # batch means for the throughput interval
# chunks per block of the walk: its figures are integer counts (any blocks give the same), and a
# quarter of a million keeps a block's temporaries in cache
_BLOCK = 1 << 18


class WindowTokens(NamedTuple):
    """The output tokens whose chunks arrived in a window: of every request, of ok requests, and
    per batch (``BATCHES`` equal parts of the window; chunks, not tokens, where the records do
    not list a token count for every chunk)."""

    every: int
    ok: int
    per_batch: Floats


def window_tokens(table: pa.Table, w: Window) -> WindowTokens:
    """``WindowTokens`` of ``table``'s chunks in ``w`` (once per table and window)."""
    c = Cols.of(table)
    return c.once(("window_tokens", w), lambda: _walk(c, w, _listed(table) == c.chunks))


def _listed(table: pa.Table) -> int:
    """How many per-chunk token counts the records list."""
    return int(pc.sum(pc.list_value_length(table.column("chunk_tokens"))).as_py() or 0)


def _walk(c: Cols, w: Window, tokens: bool) -> WindowTokens:
    edges = np.linspace(w.start_ns, w.end_ns, BATCHES + 1)
    starts = [_first_at_or_above(float(e)) for e in edges[1:]]  # a chunk at ns is in batch #(starts <= ns)
    per = np.zeros(BATCHES)
    every = ok = 0
    for b in chunk_blocks(c, size=_BLOCK):
        inwin = w.contains(b.ns)
        tok_in = np.where(inwin, b.tok, 0)
        got = int(tok_in.sum())
        every += got
        has, sums = b.request_sums(tok_in)  # each such request's tokens in the window, summed
        ok += int(sums[c.ok[b.row0 + has]].sum())
        lo, hi = int(b.ns.min()), int(b.ns.max())
        batch = sum(lo >= s for s in starts)
        if batch == sum(hi >= s for s in starts):  # the block's chunks all in one batch (or past the last)
            if batch < BATCHES:
                per[batch] += got if tokens else int(inwin.sum())
            continue
        # np.histogram's bins: edges[i] <= ns < edges[i + 1] (as floats); ns < end_ns leaves out the last edge
        at = np.searchsorted(edges, b.ns[inwin].astype(np.float64), side="right") - 1
        keep = (at >= 0) & (at < BATCHES)
        weights = b.tok[inwin][keep].astype(np.float64) if tokens else None
        per += np.bincount(at[keep], weights=weights, minlength=BATCHES)
    return WindowTokens(every, ok, per)


def _first_at_or_above(edge: float) -> int:
    """The least integer ns whose float is >= ``edge`` (a batch's edge: ns is at or past it)."""
    n = math.ceil(edge)
    while float(n - 1) >= edge:
        n -= 1
    while float(n) < edge:
        n += 1
    return n


def throughput_ci(table: pa.Table, w: Window, confidence: float = 0.95) -> tuple[float, float]:
    """Output tok/s interval by batch means: the window cut into 8 batches, Student t over them.

    Token arrivals are autocorrelated (a batch of sequences decodes together), so a
    per-token or per-second interval would be too narrow; 8 long batches are nearly
    independent once each is longer than a request's lifetime.
    """
    if table.num_rows == 0 or w.length_s <= 0:
        return (math.nan, math.nan)
    per = window_tokens(table, w).per_batch / (w.length_s / BATCHES)
    m, sd = float(per.mean()), float(per.std(ddof=1))
    half = float(t_ppf(0.5 + confidence / 2, BATCHES - 1)) * sd / math.sqrt(BATCHES)
    return (max(0.0, m - half), m + half)
