"""The simulator's KV block pool, with a vLLM-style automatic prefix cache.

KV memory is ``num_blocks`` blocks of ``block_size`` tokens. A full block of prompt
tokens is named by a hash chained over every earlier block (block i's hash covers
block i-1's hash and its own tokens), so two prompts share block i exactly when they
agree on all tokens up to the end of block i. Partial blocks are never cached.

A block is in one of three states:

* anonymous: held by one sequence, not findable by hash (generated tokens, partial
  blocks, prompt blocks not yet fully computed);
* cached and referenced: findable by hash, ``refcount`` sequences use it;
* cached and free: findable by hash, used by nobody, kept on an LRU list. It still
  counts as free capacity: allocation evicts the least recently freed first.

Only counts and hashes are kept (no block ids): the simulator needs capacity and hit
accounting, not addresses, and this keeps every operation O(blocks touched).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["block_hashes", "PrefixCache", "ROOT_HASH"]

# Parent of the first block. A fixed integer (not ``None``, whose hash varies per
# process before Python 3.12) so hashes are the same on every run.
ROOT_HASH = 0x5EED_CAFE


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """Chained hashes of each FULL block of ``token_ids`` (a trailing partial block is skipped).

    Python's tuple-of-int hash is deterministic (no per-process salt for ints), fast,
    and 64-bit; a collision would only mis-credit a cache hit in a simulation.
    """
    out = []
    h = parent
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        h = hash((h, *token_ids[i : i + block_size]))
        out.append(h)
    return out


class PrefixCache:
    """Block accounting: anonymous blocks, cached blocks with refcounts, LRU of free ones.

    With caching disabled the engine simply never calls ``commit``, and this is a plain
    counter of used blocks.
    """

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._anon = 0  # anonymous blocks in use
        self._ref: dict[int, int] = {}  # cached, referenced: hash -> refcount
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, free: oldest first
        self.evictions = 0

    @property
    def num_used(self) -> int:
        """Blocks some sequence holds (what vLLM reports as KV-cache usage)."""
        return self._anon + len(self._ref)

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: never used, or cached but evictable."""
        return self.num_blocks - self._anon - len(self._ref)

    @property
    def num_cached(self) -> int:
        """Blocks findable by hash, referenced or not."""
        return len(self._ref) + len(self._lru)

    def lookup(self, hashes: Sequence[int], limit: int | None = None) -> tuple[int, int]:
        """(leading blocks of ``hashes`` that are cached, how many of those are free).

        The second number is the capacity that acquiring them costs: a free cached block
        becomes a used one. No state changes, so a failed admission leaves nothing behind.
        """
        n = len(hashes) if limit is None else min(limit, len(hashes))
        hit = free = 0
        for h in hashes[:n]:
            if h in self._ref:
                hit += 1
            elif h in self._lru:
                hit += 1
                free += 1
            else:
                break
        return hit, free

    def acquire(self, hashes: Sequence[int]) -> None:
        """Take a reference on each cached block (all must be cached: see ``lookup``)."""
        for h in hashes:
            r = self._ref.get(h)
            if r is None:
                del self._lru[h]  # KeyError here is a caller bug: not cached
                self._ref[h] = 1
            else:
                self._ref[h] = r + 1

    def allocate(self, n: int) -> bool:
        """Take ``n`` anonymous blocks, evicting free cached ones (LRU first) if needed."""
        if n > self.num_free:
            return False
        never_used = self.num_blocks - self._anon - len(self._ref) - len(self._lru)
        for _ in range(n - never_used):
            self._lru.popitem(last=False)
            self.evictions += 1
        self._anon += n
        return True

    def free(self, n: int) -> None:
        """Give back ``n`` anonymous blocks."""
        if n > self._anon:
            raise ValueError(f"freeing {n} anonymous blocks, only {self._anon} in use")
        self._anon -= n

    def commit(self, h: int) -> None:
        """A held anonymous block is now a fully computed prompt block named ``h``.

        If ``h`` is already cached (another sequence computed the same prefix at the same
        time) the duplicate is freed and a reference to the existing block taken instead.
        The caller now holds ``h`` (release it later) instead of one anonymous block.
        """
        self._anon -= 1
        r = self._ref.get(h)
        if r is not None:
            self._ref[h] = r + 1
            return
        self._lru.pop(h, None)
        self._ref[h] = 1

    def commit_many(self, hashes: Sequence[int]) -> None:
        """``commit`` of each of ``hashes`` in order (a prefill chunk's newly full prompt blocks)."""
        ref, lru = self._ref, self._lru
        self._anon -= len(hashes)
        for h in hashes:
            r = ref.get(h)
            if r is None:
                lru.pop(h, None)
                ref[h] = 1
            else:
                ref[h] = r + 1

    def release(self, hashes: Sequence[int]) -> None:
        """Drop one reference on each of ``hashes`` (a sequence's cached blocks, in order).

        Blocks whose count reaches zero join the LRU list in REVERSE order, so a prompt's
        tail is evicted before its head: the head is the part other prompts share.
        """
        ref, lru = self._ref, self._lru
        for h in reversed(hashes):
            r = ref[h] - 1
            if r:
                ref[h] = r
            else:
                del ref[h]
                lru[h] = None

    def reset(self) -> int:
        """Forget every free cached block (like vLLM's ``/reset_prefix_cache``); return count.

        Lets a sweep start each load point cold, so cache state does not flatter later points.
        """
        n = len(self._lru)
        self._lru.clear()
        return n
