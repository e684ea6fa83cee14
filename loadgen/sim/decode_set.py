"""The scheduler's steady decodes as counts and sums: its fast path in virtual time.

Most of a busy engine's steps change nothing but counts: every running sequence decodes one
token, its context grows by one, and now and then one crosses into a new KV block or emits its
last token. ``BatchScheduler`` (``scheduler.py``) walks its running sequences one by one only
when something else happens (an admission's prefill, a preemption, the pool running short); a
sequence that only decodes is handed here and kept as arithmetic on the step index ``g``:

* its context at step ``g`` is ``computed + (g - g0)`` (``g0``: the first step it decoded here),
  so the step's summed context is ``base + n * (g + 1)`` over the ``n`` members;
* it needs a new block at the steps where its context reaches a block boundary: every
  ``block_size`` steps from its first crossing, counted in one bucket per step residue;
* it emits its last token at step ``g0 + tokens left - 1``: a heap of those steps.

A member's own fields (``computed``, ``blocks``, its request's tokens) stay as they were when it
joined until it leaves (``remove``): then they are brought up to date in one go, and its tokens'
instants are the step ends ``ends[g0:g + 1]``. Nothing here decides anything the per-sequence
walk would not: the scheduler falls back to the walk whenever the counts could differ from it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING

from loadgen.sim.model import SimRequest
from loadgen.sim.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from loadgen.sim.sequences import Batch, Seq, StepPlan

__all__ = ["DecodeSet", "SteadyDecodes", "by_order"]

# A member's admission order in the low bits of its heap key (a run admits fewer than 2**32 times).
_ORDER_BITS = 32


class DecodeSet:
    """Running sequences that only decode, as counts and sums over the step index (module note)."""

    __slots__ = ("bs", "n", "base", "buckets", "finish", "ending", "later", "ends")

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.ends: list[int] = []  # every step's end instant: step g's at index g (g = steps so far)
        self._reset()

    def _reset(self) -> None:
        self.n = 0  # members
        self.base = 0  # sum over members of (computed - g0): their context at step g is base + n * g
        self.buckets = [0] * self.bs  # members that need a new block at steps g = residue (mod block_size)
        # The step of each member's last token, as a heap of ints ``step << _ORDER_BITS | order`` (a
        # tuple's comparisons made a push and a pop cost 3x), and the member of each of them.
        self.finish: list[int] = []
        self.ending: dict[int, Seq] = {}
        self.later: list[tuple[int, int, Seq]] = []  # (first crossing, order, member): more than a block away

    def add(self, s: Seq, g: int) -> None:
        """``s`` decodes from step ``g`` on (it holds KV for its ``computed`` tokens, and one is left to compute)."""
        bs = self.bs
        s.steady, s.g0 = True, g
        self.n += 1
        self.base += s.computed - g
        last = g + s.req.max_tokens - s.req.emitted - 1
        key = last << _ORDER_BITS | s.order
        heapq.heappush(self.finish, key)
        self.ending[key] = s
        spare = s.blocks * bs - s.computed  # tokens it may still compute in the blocks it holds
        cross = g + spare  # the step whose token is the first past them
        s.bucket = -1
        if cross > last:  # it ends first (a reservation holds its whole sequence)
            s.g_x = -1
        elif spare < bs:
            s.g_x, s.bucket = cross, cross % bs
            self.buckets[s.bucket] += 1
        else:
            s.g_x = cross
            heapq.heappush(self.later, (cross, s.order, s))

    def context(self, g: int) -> int:
        """The members' summed context at step ``g``, each counting the token it computes: sum of (c + 1)."""
        return self.base + self.n * (g + 1)

    def crossings(self, g: int) -> int:
        """How many members need a new block for their token at step ``g``."""
        later = self.later
        while later and later[0][0] <= g:
            _, _, s = heapq.heappop(later)
            if s.steady and s.bucket < 0:  # (not a member any more: it left)
                s.bucket = s.g_x % self.bs
                self.buckets[s.bucket] += 1
        return self.buckets[g % self.bs]

    def finishing(self, g: int) -> list[Seq]:
        """The members whose last token is step ``g``'s, in running order (they are still members)."""
        out: list[Seq] = []
        fin, ending = self.finish, self.ending
        below = (g + 1) << _ORDER_BITS  # the keys of steps up to g
        while fin and fin[0] < below:
            s = ending.pop(heapq.heappop(fin))
            if s.steady:
                out.append(s)
        return out

    def next_last(self) -> int:
        """The earliest step a member emits its last token at (there is a member): entries of those
        that left on their own (cancelled) are dropped on the way."""
        fin, ending = self.finish, self.ending
        while not ending[fin[0]].steady:
            del ending[heapq.heappop(fin)]
        return fin[0] >> _ORDER_BITS

    def remove(self, s: Seq, g_last: int) -> int:
        """``s`` leaves after step ``g_last``: its ``computed`` and ``blocks`` are brought up to date,
        and the first step it decoded in here is returned (it emitted one token at each step from it
        to ``g_last``, at their ends ``ends[g0:g_last + 1]``)."""
        m = g_last - s.g0 + 1
        self.n -= 1
        self.base -= s.computed - s.g0
        if s.bucket >= 0:
            self.buckets[s.bucket] -= 1
        if 0 <= s.g_x <= g_last:
            s.blocks += 1 + (g_last - s.g_x) // self.bs
        s.computed += m
        s.steady = False
        if not self.n:  # what is left in the heaps is members that left: drop them (and their requests)
            self.finish.clear()
            self.ending.clear()
            self.later.clear()
        return s.g0

    def members(self) -> list[Seq]:
        """Every member, in running order."""
        return sorted((s for s in self.ending.values() if s.steady), key=by_order)

    def clear(self) -> None:
        """Forget every member (the caller removed each first)."""
        self._reset()


class SteadyDecodes:
    """The part of ``BatchScheduler`` that runs its steady decodes as a ``DecodeSet`` (bulk decode)."""

    # Set by ``RooflineModel.__init__`` (declared again in ``scheduler`` / ``step_cost``).
    spec_tokens: int
    block_size: int
    pool: PrefixCache
    _running: list[Seq]
    # Bulk decode (``bulk_decode``): the steady decodes, the running sequences that are not, and
    # how the driver records a steady decode's tokens when it leaves the set.
    _dset: DecodeSet | None = None
    _slow: list[Seq]
    _record: Callable[[SimRequest, list[int], int, int], None]
    _admissions: int = 0

    def bulk_decode(self, record: Callable[[SimRequest, list[int], int, int], None]) -> bool:
        """Keep steady decodes as counts and sums from now on (the module note): for a driver in
        virtual time, whose requests need their tokens only when they end. A steady decode's tokens
        are not emitted step by step: when it leaves the set (its last token, a preemption step, a
        cancel) ``record(req, ends, g0, g1)`` gets them all, one token at each of the instants
        ``ends[g0:g1]`` (the engine's step ends: a list that only grows, the same one every call),
        and must count them into ``req`` (``emitted``, ``finished`` at ``max_tokens``) as ``emit``
        would. Not with speculative decoding (a step's tokens per sequence are drawn): returns
        whether it is on."""
        if self.spec_tokens:
            return False
        if self._dset is None:
            self._dset = DecodeSet(self.block_size)
            self._slow = list(self._running)
        self._record = record
        return True

    def _continue_steady(self, batch: Batch, ds: DecodeSet) -> int:
        """``_continue_running`` for bulk decode: the steady decodes' tokens from their totals, the
        other running sequences (prefills) walked in order, as the walk would give them (each decode,
        wherever it runs, keeps one budget token). Returns the steady decodes counted, or -1 when the
        step's blocks do not all fit: then every sequence is synced and the caller walks them all."""
        g, bs, n_steady = len(ds.ends), self.block_size, ds.n
        slow = self._slow
        decodes = n_steady
        for s in slow:
            if s.prompt_len + s.req.emitted - s.computed == 1:
                decodes += 1
        budget = batch.budget - decodes
        need_blocks = ds.crossings(g)
        plan: list[tuple[Seq, int]] = []
        for s in slow:
            c = s.computed
            need = s.prompt_len + s.req.emitted - c
            if need == 1:
                n = 1
            else:
                n = need if need < budget else budget
                if n <= 0:
                    continue
                budget -= n
            more = -(-(c + n) // bs) - s.blocks
            if more > 0:
                need_blocks += more
            plan.append((s, n))
        if need_blocks > self.pool.num_free:  # someone would be preempted: the walk decides who
            self._unsteady_all()
            return -1
        self.pool.allocate(need_blocks)
        tokens = dec = n_steady
        dec_ctx = ds.context(g)
        pre_attn, kv, items = 0, dec_ctx, batch.items
        for s, n in plan:
            c = s.computed
            more = -(-(c + n) // bs) - s.blocks
            if more > 0:
                s.blocks += more
            s.step_tokens = n
            items.append(s)
            if n == 1 and s.prompt_len + s.req.emitted - c == 1:
                dec_ctx += c + 1
                dec += 1
            else:
                pre_attn += n * c + n * (n + 1) // 2
            tokens += n
            kv += c + n
        batch.budget -= tokens
        batch.tokens, batch.dec_ctx, batch.pre_attn, batch.kv, batch.dec = tokens, dec_ctx, pre_attn, kv, dec
        return n_steady

    def _settle(self, s: Seq) -> None:
        """Take ``s`` out of the steady decodes after the last step applied: its state and its tokens."""
        ds = self._dset
        assert ds is not None
        g1 = len(ds.ends)
        g0 = ds.remove(s, g1 - 1)
        if g0 < g1:
            self._record(s.req, ds.ends, g0, g1)

    def _unsteady_all(self) -> None:
        """Every steady decode back to the per-sequence walk (a step that may preempt)."""
        ds = self._dset
        assert ds is not None
        for s in ds.members():
            self._settle(s)
        ds.clear()
        self._slow = list(self._running)

    def _steady_up(self, plan: StepPlan, ds: DecodeSet) -> None:
        """After a step in bulk decode: the sequences now decoding join the steady ones."""
        g = len(ds.ends)
        for s in plan.items:
            if (
                not s.done
                and s.blocks
                and s.computed == s.prompt_len + s.req.emitted - 1
                and s.committed == len(s.hashes)
            ):
                ds.add(s, g)
        if plan.walked:
            self._slow = [s for s in self._running if not s.steady]
        else:
            self._slow = [s for s in self._slow if not s.done and not s.steady]


# The running list's order: admission order (a C-level key: sorts and bisects call it per probe).
by_order: Callable[[Seq], int] = attrgetter("order")
