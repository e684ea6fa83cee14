"""Every token's instant in a virtual run, kept as spans rather than one integer per token.

A token goes out at the end of an engine step, so its instant is that step's end. A steady
decode (``decode_set``) emits one token at each of a run of consecutive steps of its engine: that
is one span, ``(request, source, start, count)``, whose instants are the engine's step ends
``ends[start:start + count]`` (source k > 0). Tokens emitted one step at a time (a first token, a
walked decode, a speculative chunk of several tokens at once) are spans of source 0, the log's own
list of instants. ``TokenLog.flatten`` turns the spans into each request's instants in order, as
one flat array with offsets (what the records' ``chunk_ns`` column is), with numpy: no Python work
per token anywhere in the run.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["TokenLog"]

I64 = npt.NDArray[np.int64]


class TokenLog:
    """The spans of every token emitted in a run (the module note), in the order they were emitted."""

    __slots__ = ("seq", "src", "start", "count", "stamps", "sources", "_ids")

    def __init__(self) -> None:
        self.seq: list[int] = []  # the request (its ``seq``) of each span
        self.src: list[int] = []  # where its instants are: 0 ``stamps``, k > 0 ``sources[k]``
        self.start: list[int] = []
        self.count: list[int] = []
        self.stamps: list[int] = []  # instants of tokens emitted one step at a time
        self.sources: list[list[int]] = [self.stamps]  # an engine's step ends (``DecodeSet.ends``)
        self._ids: dict[int, int] = {}  # id(an engine's ends) -> its source number

    def emit(self, seq: int, stamp: int, k: int) -> None:
        """``k`` tokens of request ``seq`` at ``stamp``."""
        stamps = self.stamps
        self.seq.append(seq)
        self.src.append(0)
        self.start.append(len(stamps))
        self.count.append(k)
        if k == 1:
            stamps.append(stamp)
        else:
            stamps.extend([stamp] * k)

    def span(self, seq: int, ends: list[int], g0: int, g1: int) -> None:
        """Request ``seq``'s tokens at ``ends[g0:g1]`` (one each): an engine's step ends, a list that
        only grows (its earlier entries never change)."""
        src = self._ids.get(id(ends))
        if src is None:
            src = self._ids[id(ends)] = len(self.sources)
            self.sources.append(ends)
        self.seq.append(seq)
        self.src.append(src)
        self.start.append(g0)
        self.count.append(g1 - g0)

    def flatten(self, order: I64) -> tuple[I64, I64]:
        """(offsets, instants): request ``order[i]``'s tokens are ``instants[offsets[i]:offsets[i + 1]]``,
        in the order they were emitted. ``order`` holds distinct request numbers (``seq``); a span
        of a request not in it is left out."""
        n = len(order)
        offsets = np.zeros(n + 1, np.int64)
        if not self.seq or not n:
            return offsets, np.zeros(0, np.int64)
        seq = np.array(self.seq, np.int64)
        pos = np.full(int(max(seq.max(), order.max())) + 1, -1, np.int64)
        pos[order] = np.arange(n, dtype=np.int64)
        at = pos[seq]
        keep = at >= 0
        sizes = np.array([len(s) for s in self.sources], np.int64)
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        values = np.concatenate([np.array(s, np.int64) for s in self.sources])
        first = base[np.array(self.src, np.int64)] + np.array(self.start, np.int64)
        count = np.array(self.count, np.int64)
        by = np.argsort(at[keep], kind="stable")  # by request, each one's spans in emission order
        at, first, count = at[keep][by], first[keep][by], count[keep][by]
        np.cumsum(np.bincount(at, weights=count, minlength=n).astype(np.int64), out=offsets[1:])
        some = count > 0
        first, count = first[some], count[some]
        if not len(count):
            return offsets, np.zeros(0, np.int64)
        # Token p of span k is values[first[k] + p - (its start in the output)]: each next token's index
        # is one on from the last, but where a span starts. One array of steps, summed in place (a run's
        # tokens are tens of millions: each array of them costs its memory's first touch).
        starts = np.cumsum(count) - count
        index = np.ones(int(starts[-1] + count[-1]), np.int64)
        index[0] = first[0]
        index[starts[1:]] = first[1:] - (first[:-1] + count[:-1] - 1)
        np.cumsum(index, out=index)
        return offsets, values[index]
