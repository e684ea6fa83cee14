"""The simulator's block pool and prefix cache: chained hashes, refcounts, LRU eviction."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.sim.prefix_cache import BlockChain, PrefixCache, block_hashes

BS = 4


def test_hashes_cover_full_blocks_only():
    assert len(block_hashes(list(range(11)), BS)) == 2
    assert block_hashes([1, 2, 3], BS) == []


def test_equal_prefixes_share_blocks_until_first_difference():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], BS)
    b = block_hashes([1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12], BS)
    assert a[0] == b[0]
    # Block 1 differs; block 2 has equal tokens but a different parent: chained.
    assert a[1] != b[1] and a[2] != b[2]


def test_hashes_are_stable_across_calls_and_depend_on_position():
    ids = [7] * 8
    assert block_hashes(ids, BS) == block_hashes(list(ids), BS)
    h = block_hashes(ids, BS)
    assert h[0] != h[1]  # same tokens, different parent


def test_lookup_counts_leading_hits_and_free_ones():
    pc = PrefixCache(10)
    h = block_hashes(list(range(12)), BS)
    assert pc.lookup(h) == (0, 0)
    assert pc.allocate(3)
    for x in h:
        pc.commit(x)
    assert pc.lookup(h) == (3, 0)  # cached and referenced
    assert pc.lookup(h, limit=2) == (2, 0)
    pc.release(h)
    assert pc.lookup(h) == (3, 3)  # cached, free: acquiring costs capacity
    assert pc.lookup([h[0], 999, h[2]]) == (1, 1)  # stops at the first miss


def test_refcounts_keep_shared_blocks_in_use():
    pc = PrefixCache(4)
    h = block_hashes(list(range(8)), BS)
    assert pc.allocate(2)
    for x in h:
        pc.commit(x)
    pc.acquire(h)  # a second sequence shares both blocks
    assert pc.num_used == 2
    pc.release(h)
    assert pc.num_used == 2 and pc.num_free == 2
    pc.release(h)
    assert pc.num_used == 0 and pc.num_free == 4 and pc.num_cached == 2


def test_commit_of_an_already_cached_hash_frees_the_duplicate():
    pc = PrefixCache(4)
    (h,) = block_hashes([1, 2, 3, 4], BS)
    assert pc.allocate(2)  # two sequences each computed the same block
    pc.commit(h)
    pc.commit(h)
    assert pc.num_used == 1
    pc.release([h])
    pc.release([h])
    assert pc.num_used == 0 and pc.num_cached == 1


def test_eviction_is_lru_and_tail_first_within_a_prompt():
    pc = PrefixCache(4)
    a = block_hashes(list(range(8)), BS)
    b = block_hashes(list(range(100, 108)), BS)
    assert pc.allocate(4)
    for x in a + b:
        pc.commit(x)
    pc.release(a)  # freed first: evicted first, tail block a[1] before head a[0]
    pc.release(b)
    assert pc.allocate(1)
    assert pc.lookup(a) == (1, 1)  # a[1] evicted, a[0] kept
    assert pc.allocate(1)
    assert pc.lookup(a) == (0, 0)
    assert pc.lookup(b) == (2, 2)
    assert pc.evictions == 2


def test_acquire_takes_free_cached_blocks_out_of_the_lru():
    pc = PrefixCache(3)
    h = block_hashes(list(range(8)), BS)
    assert pc.allocate(2)
    for x in h:
        pc.commit(x)
    pc.release(h)
    pc.acquire(h[:1])  # reuse the head block
    assert pc.num_free == 2
    assert pc.allocate(2)  # evicts h[1], never the acquired h[0]
    assert pc.lookup(h) == (1, 0)
    assert not pc.allocate(1)


def test_allocation_fails_cleanly_when_full():
    pc = PrefixCache(2)
    assert pc.allocate(2)
    assert not pc.allocate(1)
    pc.free(1)
    assert pc.allocate(1)
    with pytest.raises(ValueError):
        pc.free(3)
    with pytest.raises(ValueError):
        PrefixCache(0)


def test_reset_drops_only_unreferenced_blocks():
    pc = PrefixCache(4)
    a, b = block_hashes([1] * 4, BS), block_hashes([2] * 4, BS)
    assert pc.allocate(2)
    pc.commit(a[0])
    pc.commit(b[0])
    pc.release(a)
    assert pc.reset() == 1
    assert pc.lookup(a) == (0, 0) and pc.lookup(b) == (1, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3)), max_size=40))
def test_capacity_is_conserved_under_any_interleaving(ops):
    """Sequences of 1-3 blocks drawn from 6 shared prompts come and go; the pool never
    over- or under-counts: used + free == total, and releasing everything frees all."""
    pc = PrefixCache(8)
    prompts = [block_hashes([p] * 12, BS) for p in range(6)]
    held: list[list[int]] = []
    for p, n in ops:
        hashes = prompts[p][:n]
        hit, lru = pc.lookup(hashes)
        if n - hit + lru <= pc.num_free:
            pc.acquire(hashes[:hit])
            assert pc.allocate(n - hit)
            for x in hashes[hit:]:
                pc.commit(x)
            held.append(hashes)
        elif held:
            pc.release(held.pop(0))
        assert pc.num_used + pc.num_free == pc.num_blocks
        assert 0 <= pc.num_used <= pc.num_blocks
    for h in held:
        pc.release(h)
    assert pc.num_used == 0 and pc.num_free == 8


class _PerBlock:
    """The pool kept block by block (a dict of refcounts, an ``OrderedDict`` LRU): the plain
    statement of the bookkeeping ``PrefixCache`` does with runs, to check it against."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks, self.anon, self.evictions = num_blocks, 0, 0
        self.ref: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.anon - len(self.ref)

    def figures(self) -> tuple[int, int, int, int]:
        return self.anon + len(self.ref), self.num_free, len(self.ref) + len(self.lru), self.evictions

    def lookup(self, hashes: list[int], limit: int | None = None) -> tuple[int, int]:
        hit = free = 0
        for h in hashes[: len(hashes) if limit is None else limit]:
            if h not in self.ref and h not in self.lru:
                break
            hit, free = hit + 1, free + (h in self.lru)
        return hit, free

    def acquire(self, hashes: list[int]) -> None:
        for h in hashes:
            if h in self.lru:
                del self.lru[h]
            self.ref[h] = self.ref.get(h, 0) + 1

    def allocate(self, n: int) -> bool:
        if n > self.num_free:
            return False
        for _ in range(n - (self.num_free - len(self.lru))):
            self.lru.popitem(last=False)
            self.evictions += 1
        self.anon += n
        return True

    def commit_many(self, hashes: list[int]) -> None:
        self.anon -= len(hashes)
        for h in hashes:
            self.lru.pop(h, None)
            self.ref[h] = self.ref.get(h, 0) + 1

    def release(self, hashes: list[int]) -> None:
        for h in reversed(hashes):
            self.ref[h] -= 1
            if not self.ref[h]:
                del self.ref[h]
                self.lru[h] = None

    def free(self, n: int) -> None:
        self.anon -= n

    def reset(self) -> int:
        n = len(self.lru)
        self.lru.clear()
        return n


# prompts of 6 blocks: pairs share their first two, all share none further
_IDS = [[p // 2] * 8 + [p] * 16 for p in range(6)]
_PROMPTS = [block_hashes(ids, BS) for ids in _IDS]
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, 5), st.integers(1, 6), st.integers(1, 6)),
        st.tuples(st.just("commit"), st.integers(0, 9), st.integers(1, 6), st.just(0)),
        st.tuples(st.just("release"), st.integers(0, 9), st.just(0), st.just(0)),
        st.tuples(st.just("reset"), st.just(0), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_OPS, st.integers(6, 30))
def test_runs_give_every_hit_count_and_eviction_the_per_block_bookkeeping_gives(ops, blocks):
    """Sequences admitted as the scheduler admits them (a cached prefix acquired, blocks allocated
    for the rest, committed a chunk at a time, some of them the same blocks as another's still
    being computed), released in any order, the cache reset now and then: both pools agree. The
    pool is handed each prompt as the scheduler hands it, a lazy ``BlockChain`` and ranges of it."""
    pc, ref = PrefixCache(blocks), _PerBlock(blocks)
    held: list[list[Any]] = []  # [hashes, chain, blocks to commit, committed, allocated]
    for op, a, b, c in ops:
        if op == "admit":
            hashes, chain = _PROMPTS[a][:b], BlockChain(_IDS[a][: b * BS], BS)
            got = pc.lookup(chain, c)
            assert got == ref.lookup(hashes, c)
            hit, free = got
            need = len(hashes) - hit
            if need + free <= pc.num_free:
                pc.acquire(chain, hit)
                ref.acquire(hashes[:hit])
                assert pc.allocate(need) and ref.allocate(need)
                held.append([hashes, chain, hit, hit, need])
        elif op == "commit" and held:
            s = held[a % len(held)]
            lo, hi = s[3], min(s[3] + b, len(s[0]))
            pc.commit_many(s[1], lo, hi)
            ref.commit_many(s[0][lo:hi])
            s[3] = hi
        elif op == "release" and held:
            hashes, chain, hit, committed, allocated = held.pop(a % len(held))
            pc.release(chain, committed)
            ref.release(hashes[:committed])
            anonymous = allocated - (committed - hit)  # allocated blocks not (yet) committed
            pc.free(anonymous)
            ref.free(anonymous)
        elif op == "reset":
            assert pc.reset() == ref.reset()
        assert (pc.num_used, pc.num_free, pc.num_cached, pc.evictions) == ref.figures()
        for p in _PROMPTS:
            assert pc.lookup(p) == ref.lookup(p)


class _Reads(list[int]):
    """Token ids that note which of them were read (as slices: all ``BlockChain`` takes)."""

    read: set[int]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            self.read.update(range(*i.indices(len(self))))
        return super().__getitem__(i)


def _reads(ids: list[int]) -> _Reads:
    out = _Reads(ids)
    out.read = set()
    return out


def test_a_block_chain_is_block_hashes_read_in_any_order():
    ids = [(7 * i) % 13 for i in range(4 * BS + 3)]
    want = block_hashes(ids, BS)
    assert len(BlockChain(ids, BS)) == len(want) == 4
    for order in ([3, 0, 2, 1], [0, 1, 2, 3], [-1, -4]):
        chain = BlockChain(ids, BS)
        assert [chain[i] for i in order] == [want[i] for i in order]
    chain = BlockChain(ids, BS)
    assert chain[1:3] == want[1:3] and chain[:] == want and list(chain) == want and chain[::2] == want[::2]
    with pytest.raises(IndexError):
        BlockChain(ids, BS)[4]


def test_a_fresh_prompt_is_hashed_no_further_than_the_head_of_its_last_chunk():
    """A prompt nobody shares: looked up (a miss at its first block), its blocks committed in two
    chunks, released and evicted. Its tokens are read only as far as the head of its second chunk
    (a block's name covers every block before it): naming a block is what reaching it does."""
    pc = PrefixCache(64)
    ids = _reads(list(range(40)))  # 10 blocks
    chain = BlockChain(ids, BS)
    assert pc.lookup(chain) == (0, 0)
    assert pc.allocate(10)
    pc.commit_many(chain, 0, 6)
    pc.commit_many(chain, 6, 10)
    assert pc.num_cached == 10
    pc.release(chain, 10)
    assert pc.lookup(chain) == (10, 10)  # its own chain: found whole, not read again
    assert set(range(BS)) <= ids.read <= set(range(7 * BS))  # up to block 6, its second run's head
    assert pc.allocate(64) and pc.num_cached == 0 and pc.evictions == 10


def test_another_prompt_sharing_a_run_reads_as_far_as_they_agree():
    pc = PrefixCache(64)
    a = list(range(24))  # 6 blocks
    b = a[:10] + [99] * 14  # agrees on 2 full blocks (and 2 tokens of the third)
    first = BlockChain(a, BS)
    assert pc.allocate(6)
    pc.commit_many(first, 0, 6)
    pc.release(first, 6)
    second = BlockChain(_reads(b), BS)
    assert pc.lookup(second) == (2, 2)
    pc.acquire(second, 2)
    assert pc.lookup(BlockChain(a, BS)) == (6, 4)  # its head two held now, its other four still free
