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
accounting, not addresses, and this keeps every operation O(blocks touched). A prompt's names
may be a ``BlockChain``, which hashes a block only when it is first read: most never are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import accumulate, count
from typing import overload

__all__ = ["block_hashes", "BlockChain", "PrefixCache", "ROOT_HASH"]

# Parent of the first block. A fixed integer (not ``None``, whose hash varies per
# process before Python 3.12) so hashes are the same on every run.
ROOT_HASH = 0x5EED_CAFE


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH, first: int = 0) -> list[int]:
    """Chained hashes of each FULL block of ``token_ids`` (a trailing partial block is skipped):
    block i's is ``parent + sum(hash((j, tokens of block j)) for j <= i)``, so it names the whole
    prefix up to its end, positions included. ``first``: the position of ``token_ids``' first
    block in its prompt, and ``parent`` the hash of the block before it (a chain resumed).

    Python's tuple-of-int hash is deterministic (no per-process salt for ints), fast, and
    64-bit, so two different prefixes share a name with odds of about 2^-64, and a collision
    would only mis-credit a cache hit in a simulation. It is all done in C: ``zip`` cuts the
    full blocks, ``map`` hashes them with their positions, ``accumulate`` sums them (exact,
    Python ints do not wrap).
    """
    if len(token_ids) // block_size == 1:  # one block (a lookup's first, most often): its sum term alone
        return [parent + hash((first, tuple(token_ids[:block_size])))]
    blocks = zip(*[iter(token_ids)] * block_size, strict=False)
    out = list(accumulate(map(hash, zip(count(first), blocks)), initial=parent))
    del out[0]
    return out


class BlockChain(Sequence[int]):
    """``block_hashes(token_ids, block_size)``, each hash computed when it is first read.

    Most of a prompt's block names are never read: a lookup stops at the first block not cached
    (for a fresh prompt, its first), and the pool keeps a sequence's committed blocks as a range of
    its chain (``_Run``), naming only the range's head until another prompt's lookup or an acquire
    reaches inside it. Hashing a 512-token prompt's 32 blocks cost more than the rest of its
    bookkeeping; this hashes one. The ids must not change while the chain is in use."""

    __slots__ = ("_ids", "_bs", "_n", "_known")

    def __init__(self, token_ids: Sequence[int], block_size: int) -> None:
        self._ids, self._bs = token_ids, block_size
        self._n = len(token_ids) // block_size  # full blocks
        self._known: list[int] = []  # the hashes of the first blocks, as far as they were read

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        known = self._known
        if isinstance(i, slice):
            lo, hi, step = i.indices(self._n)
            if hi > len(known):
                self._upto(hi)
            return known[lo:hi:step]
        if i < 0:
            i += self._n
        if i >= len(known):
            if not 0 <= i < self._n:
                raise IndexError("block index out of range")
            self._upto(i + 1)
        return known[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self[:])

    def _upto(self, k: int) -> None:
        """Hash blocks up to ``k`` (exclusive), after those already known: ``block_hashes``'s sums, resumed."""
        known, bs = self._known, self._bs
        start = len(known)
        known.extend(block_hashes(self._ids[start * bs : k * bs], bs, known[-1] if known else ROOT_HASH, start))


class _Run:
    """Prompt blocks one sequence committed together and nobody else has used: held by it (each
    block's refcount 1), or free, as one entry of the LRU list (its deep end evicted first). The
    blocks are ``chain[lo:hi]`` of the committer's hashes (a ``BlockChain`` reads only what is asked)."""

    __slots__ = ("chain", "lo", "hi", "head", "free")

    def __init__(self, chain: Sequence[int], lo: int, hi: int, head: int) -> None:
        self.chain, self.lo, self.hi = chain, lo, hi  # in chain order: ``head`` (chain[lo]) is the ``_heads`` key
        self.head = head
        self.free = False

    def hashes(self, m: int) -> list[int]:
        """The run's first ``m`` block names."""
        return list(self.chain[self.lo : self.lo + m])

    def matches(self, hashes: Sequence[int], i: int, m: int) -> bool:
        """Whether the run's first ``m`` blocks are ``hashes[i:i + m]``."""
        return (self.chain is hashes and self.lo == i) or self.hashes(m) == list(hashes[i : i + m])


class PrefixCache:
    """Block accounting: anonymous blocks, cached blocks with refcounts, LRU of free ones.

    With caching disabled the engine simply never calls ``commit``, and this is a plain
    counter of used blocks.

    Most prompt blocks are used by one sequence only: committed together, freed together and
    evicted in turn. Those are kept as runs (``_Run``), found by their first block's hash, and a
    free run is one entry of the LRU list, so a request's blocks cost a few dict operations
    instead of several per block. A block another sequence takes (``acquire``, a duplicate
    ``commit``) leaves its run for the per-block dicts, the run shrinking from its head; an
    eviction trims a free run from its tail. Every count, hit and eviction is what per-block
    bookkeeping gives: a held sequence's blocks are a prefix of its chain, so a run is only ever
    entered at its head, and a run's blocks are freed, and evicted, in the order their blocks
    would be one by one.
    """

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._anon = 0  # anonymous blocks in use
        self._ref: dict[int, int] = {}  # cached, referenced, outside runs: hash -> refcount
        self._lru: OrderedDict[int | _Run, None] = OrderedDict()  # cached, free (blocks and runs): oldest first
        self._heads: dict[int, _Run] = {}  # every run, by its first block's hash
        self._refd = 0  # cached blocks referenced (in ``_ref`` and in held runs)
        self._free_cached = 0  # cached blocks free (on the LRU list, runs counted by their blocks)
        self.evictions = 0

    @property
    def num_used(self) -> int:
        """Blocks some sequence holds (what vLLM reports as KV-cache usage)."""
        return self._anon + self._refd

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: never used, or cached but evictable."""
        return self.num_blocks - self._anon - self._refd

    @property
    def num_cached(self) -> int:
        """Blocks findable by hash, referenced or not."""
        return self._refd + self._free_cached

    def lookup(self, hashes: Sequence[int], limit: int | None = None) -> tuple[int, int]:
        """(leading blocks of ``hashes`` that are cached, how many of those are free).

        The second number is the capacity that acquiring them costs: a free cached block
        becomes a used one. No state changes, so a failed admission leaves nothing behind.
        """
        n = len(hashes) if limit is None else min(limit, len(hashes))
        ref, lru, heads = self._ref, self._lru, self._heads
        i = free = 0
        while i < n:
            h = hashes[i]
            if h in ref:
                i += 1
            elif h in lru:
                i += 1
                free += 1
            else:
                run = heads.get(h)
                if run is None:
                    break
                size = run.hi - run.lo
                k = m = min(size, n - i)
                if not run.matches(hashes, i, k):  # they part within the run: where
                    m = 0
                    for a, b in zip(run.hashes(k), hashes[i : i + k], strict=True):
                        if a != b:
                            break
                        m += 1
                i += m
                if run.free:
                    free += m
                if m < size:
                    break
        return i, free

    def acquire(self, hashes: Sequence[int], n: int | None = None) -> None:
        """Take a reference on each cached block of ``hashes[:n]`` (all must be cached: see ``lookup``)."""
        ref, lru, heads = self._ref, self._lru, self._heads
        i, n = 0, len(hashes) if n is None else n
        while i < n:
            h = hashes[i]
            r = ref.get(h)
            if r is not None:
                ref[h] = r + 1
                i += 1
            elif h in lru:
                del lru[h]
                ref[h] = 1
                self._refd += 1
                self._free_cached -= 1
                i += 1
            else:
                run = heads[h]  # KeyError here is a caller bug: not cached
                m = min(run.hi - run.lo, n - i)
                if not run.matches(hashes, i, m):
                    raise KeyError(f"acquiring blocks that are not cached after {h:#x}")
                taken = run.hashes(m)
                self._behead(run, m)
                if run.free:  # off the LRU list, held once
                    ref.update(dict.fromkeys(taken, 1))
                    self._refd += m
                    self._free_cached -= m
                else:  # shared with the run's holder
                    ref.update(dict.fromkeys(taken, 2))
                i += m

    def _behead(self, run: _Run, m: int) -> None:
        """``run`` without its first ``m`` blocks (they are going to the per-block dicts)."""
        heads = self._heads
        del heads[run.head]
        run.lo += m
        if run.lo < run.hi:
            run.head = run.chain[run.lo]
            heads[run.head] = run
        elif run.free:
            del self._lru[run]

    def allocate(self, n: int) -> bool:
        """Take ``n`` anonymous blocks, evicting free cached ones (LRU first) if needed."""
        if n > self.num_free:
            return False
        evict = n - (self.num_blocks - self._anon - self._refd - self._free_cached)
        if evict > 0:
            self._free_cached -= evict
            self.evictions += evict
            lru = self._lru
            while evict > 0:
                key, _ = lru.popitem(last=False)
                if isinstance(key, int):
                    evict -= 1
                    continue
                size = key.hi - key.lo
                if size <= evict:
                    del self._heads[key.head]
                    evict -= size
                else:  # its tail goes; the rest stays first in line
                    key.hi -= evict
                    lru[key] = None
                    lru.move_to_end(key, last=False)
                    evict = 0
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
        self.commit_many([h])

    def commit_many(self, hashes: Sequence[int], lo: int = 0, hi: int | None = None) -> None:
        """``commit`` of each of ``hashes[lo:hi]`` in order (a prefill chunk's newly full prompt
        blocks). ``hashes`` is kept, not copied, where the blocks become a run: it must not change."""
        hi = len(hashes) if hi is None else hi
        if lo >= hi:
            return
        ref, lru, heads = self._ref, self._lru, self._heads
        self._anon -= hi - lo
        h = hashes[lo]
        if h not in ref and h not in lru and h not in heads:
            # None cached yet: a new run, held by the caller. (A cached block's parent is cached:
            # deeper blocks are freed no earlier and evicted first. So if the first of a chain's
            # next blocks is not cached, none of them is.)
            heads[h] = _Run(hashes, lo, hi, h)
            self._refd += hi - lo
            return
        for h in hashes[lo:hi]:  # one at a time: some are cached already
            r = ref.get(h)
            if r is not None:
                ref[h] = r + 1
                continue
            run_of = heads.get(h)
            if run_of is not None:  # the head of someone's run: it leaves the run
                self._behead(run_of, 1)
                if run_of.free:
                    ref[h] = 1
                    self._refd += 1
                    self._free_cached -= 1
                else:
                    ref[h] = 2
                continue
            if h in lru:
                del lru[h]
                self._free_cached -= 1
            ref[h] = 1
            self._refd += 1

    def release(self, hashes: Sequence[int], n: int | None = None) -> None:
        """Drop one reference on each of ``hashes[:n]`` (a sequence's cached blocks, in order).

        Blocks whose count reaches zero join the LRU list in REVERSE order, so a prompt's
        tail is evicted before its head: the head is the part other prompts share.
        """
        ref, heads = self._ref, self._heads
        freed: list[int | _Run] = []
        blocks = 0
        i, n = 0, len(hashes) if n is None else n
        while i < n:
            h = hashes[i]
            r = ref.get(h)
            if r is not None:
                if r > 1:
                    ref[h] = r - 1
                else:
                    del ref[h]
                    freed.append(h)
                    blocks += 1
                i += 1
                continue
            run = heads[h]  # KeyError here is a caller bug: not held
            size = run.hi - run.lo
            if run.free or i + size > n or not run.matches(hashes, i, size):
                raise KeyError(f"releasing blocks that are not held after {h:#x}")
            run.free = True
            freed.append(run)
            blocks += size
            i += size
        lru = self._lru
        for x in reversed(freed):
            lru[x] = None
        self._refd -= blocks
        self._free_cached += blocks

    def reset(self) -> int:
        """Forget every free cached block (like vLLM's ``/reset_prefix_cache``); return count.

        Lets a sweep start each load point cold, so cache state does not flatter later points.
        """
        n = self._free_cached
        for key in self._lru:
            if isinstance(key, _Run):
                del self._heads[key.head]
        self._lru.clear()
        self._free_cached = 0
        return n
