"""Prompt text for traces that record their prefix structure as hash-id blocks.

Mooncake and agent traces carry no text, only one hash id per block of tokens:
two requests with the same leading ids shared that prefix on the recording
server. To replay that reuse the text of a block must be a pure function of
(seed, scope, id, size), so the same id gives the same bytes in every request,
in every worker process, and a prefix cache on the endpoint can hit it exactly
as it did in the trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from loadgen.workload.text import Memo, TextSource, rng

__all__ = ["Blocks"]

_TAG_BLOCK = 21
_BLOCK_CACHE = 2048  # built blocks kept per worker (a hot prefix is built once)


class Blocks:
    """Text for hash-id blocks: block (scope, id) is a pure function of the seed, so
    equal ids give equal text in every request and the prefix is shared."""

    def __init__(self, ts: TextSource, seed: int) -> None:
        self.ts, self.seed = ts, seed
        self._memo = Memo(_BLOCK_CACHE)

    def _block(self, scope: int, hid: int, m: int) -> str:
        return self._memo.get((scope, hid, m), lambda: self.ts.words(m, rng(self.seed, _TAG_BLOCK, scope, hid, m)))

    def text(
        self,
        scope: int,
        ids: npt.NDArray[np.int64] | Sequence[int],
        n: int,
        block: int,
        fill: Callable[[], np.random.Generator],
    ) -> str:
        """``n`` tokens: whole blocks, a partial last block (its own text, keyed by its
        size), then unique filler if the ids cover fewer than ``n`` tokens."""
        full = min(len(ids), n // block)
        parts = [self._block(scope, int(h), block) for h in ids[:full]]
        rest = n - full * block
        if rest and full < len(ids):
            parts.append(self._block(scope, int(ids[full]), rest))
            rest = 0
        if rest:
            parts.append(self.ts.words(rest, fill()))
        return "".join(parts)
