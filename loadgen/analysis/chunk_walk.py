"""The chunks of a run walked in blocks of whole requests, and the per-chunk figures of DESIGN.md.

A run of a million requests has over a hundred million chunks, so no figure holds a per-chunk
temporary of the whole run: ``chunk_blocks`` hands out the chunks of a run of whole requests at a
time (views of the records' Arrow buffers), and ITL and ICL (``itl_icl_blocks``) and the per-row
token sums (``chunk_tokens``) are computed block by block. A block numbers its requests from 0
(``ChunkBlock.owner``, computed only for the figures that ask for it: the ITL and ICL of a block
whose every chunk carries tokens need only where each request's chunks start).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loadgen.analysis.columns import Cols, Floats, Ints, Mask, Tokens

__all__ = ["ChunkBlock", "chunk_blocks", "gaps", "itl_icl", "itl_icl_blocks", "chunk_tokens", "every_chunk_has_tokens"]

_BLOCK_CHUNKS = 1 << 21  # chunks per block of ``chunk_blocks``: a temporary ~16 MB, under loadgen.heap's 32


@dataclass(eq=False)
class ChunkBlock:
    """The chunks of a run of whole requests (``chunk_blocks``): ``lens`` holds, per request from
    ``row0`` on, how many of its chunks the block holds (0 for a request left out)."""

    row0: int
    ns: Ints
    tok: Tokens
    lens: Ints

    @cached_property
    def owner(self) -> Ints:
        """Per chunk: its request, numbered from 0 within the block (``row0`` is 0's row)."""
        owner: Ints = np.repeat(np.arange(self.lens.size, dtype=np.int64), self.lens)
        return owner

    def request_sums(self, values: NDArray[Any]) -> tuple[Ints, NDArray[Any]]:
        """The requests with chunks in the block (numbered as ``owner``'s) and the sum of the
        per-chunk ``values`` over each one's chunks: one pass, in C, a request without chunks left out."""
        (rows,) = np.nonzero(self.lens)
        return rows, np.add.reduceat(values, (np.cumsum(self.lens) - self.lens)[rows])

    def later(self) -> Mask:
        """Per chunk but the block's first: whether it follows a chunk of the same request
        (``owner[1:] == owner[:-1]``, from where each request's chunks start)."""
        out: Mask = np.ones(max(self.ns.size - 1, 0), dtype=bool)
        starts = np.cumsum(self.lens) - self.lens
        starts = starts[(starts > 0) & (starts < self.ns.size)]
        out[starts - 1] = False
        return out


def chunk_blocks(c: Cols, rows: Mask | None = None, size: int = _BLOCK_CHUNKS) -> Iterator[ChunkBlock]:
    """The chunks of the selected ``rows`` (all when None), in row order, in blocks of whole
    requests of about ``size`` chunks: what a per-chunk figure of the whole run walks instead
    of per-chunk arrays of it."""
    start = c.c_start
    sized = np.searchsorted(start, np.arange(0, c.chunks, size), side="right") - 1
    cuts = np.unique(np.concatenate([sized, [r for r, _, _ in c.c_parts], [c.n]]).astype(np.int64))
    part = 0
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        while part + 1 < len(c.c_parts) and c.c_parts[part + 1][0] <= a:
            part += 1
        base = int(start[c.c_parts[part][0]])  # a block lies in one part (cut at every part's first row)
        lo, hi = int(start[a]) - base, int(start[b]) - base
        lens = c.c_len[a:b]
        ns, tok = c.c_parts[part][1][lo:hi], c.c_parts[part][2][lo:hi]
        if rows is not None:
            sel = rows[a:b]
            if not sel.all():
                run = np.flatnonzero(sel)
                if run.size and run[-1] - run[0] + 1 == run.size:  # one run of rows (a window of sorted rows)
                    first, last = int(run[0]), int(run[-1]) + 1
                    lo_c, hi_c = int(start[a + first] - start[a]), int(start[a + last] - start[a])
                    ns, tok = ns[lo_c:hi_c], tok[lo_c:hi_c]
                else:
                    keep = np.repeat(sel, lens)
                    ns, tok = ns[keep], tok[keep]
                lens = np.where(sel, lens, 0)
        if ns.size:
            yield ChunkBlock(a, ns, tok, lens)


def gaps(owner: Ints, ns: Ints) -> tuple[Ints, Mask]:
    """(gap to the previous chunk of the same request, mask of chunks that have one)."""
    has_prev = np.zeros(owner.size, dtype=bool)
    has_prev[1:] = owner[1:] == owner[:-1]
    gap = np.zeros(ns.size, dtype=np.int64)
    gap[1:] = np.diff(ns)
    return gap, has_prev


def every_chunk_has_tokens(c: Cols) -> bool:
    """Whether every chunk of the table carries tokens (then its ITL gaps are its ICL ones)."""
    return c.once("every_chunk_has_tokens", lambda: all(bool((tok > 0).all()) for _, _, tok in c.c_parts))


def itl_icl(c: Cols, rows: Mask) -> tuple[Floats, Floats]:
    """ITL: a chunk of k tokens arriving g after the previous token-carrying chunk
    gives k samples of g/k (zero-token chunks are skipped, so their time goes to
    the next token). ICL: raw gaps between consecutive output chunks. Every sample, in
    row order (``itl_icl_blocks`` gives them block by block, ITL as values and counts)."""
    itl: list[Floats] = []
    icl: list[Floats] = []
    for (v, k), gap in itl_icl_blocks(c, rows):
        itl.append(np.repeat(v, k))
        icl.append(gap)
    empty = np.zeros(0)
    return (np.concatenate(itl) if itl else empty), (np.concatenate(icl) if icl else empty)


def itl_icl_blocks(c: Cols, rows: Mask | None) -> Iterator[tuple[tuple[Floats, Tokens], Floats]]:
    """Per block of ``chunk_blocks``: ((ITL value g/k per token-carrying chunk with a previous
    one, its k: that many samples), ICL gaps), in ms, as ``itl_icl`` defines them."""
    every = every_chunk_has_tokens(c)
    for b in chunk_blocks(c, rows):
        if every:  # every chunk carries tokens: the ITL gaps are the ICL ones
            later = b.later()  # each chunk but a request's first: its gap to the one before
            icl = np.diff(b.ns)[later] / 1e6
            k = b.tok[1:][later]
            yield (icl / k, k), icl
            continue
        gap, has_prev = gaps(b.owner, b.ns)
        icl = gap[has_prev] / 1e6
        t = b.tok > 0
        gap, has_prev = gaps(b.owner[t], b.ns[t])
        k = b.tok[t][has_prev]
        yield (gap[has_prev] / 1e6 / k, k), icl


def chunk_tokens(c: Cols) -> Ints:
    """Per row: the tokens of its chunks, summed (once per table)."""

    def compute() -> Ints:
        out: Ints = np.zeros(c.n, dtype=np.int64)
        for b in chunk_blocks(c):
            rows, sums = b.request_sums(b.tok)  # (a request without chunks keeps its 0)
            out[b.row0 + rows] = sums
        return out

    return c.once("chunk_tokens", compute)
