"""The continuous-batching scheduler of the simulated engine, in model time.

It decides *what* each step computes, apart from *when* it runs, so that the same decisions drive
both the real-time loop (``engine_loop.py``) and ``simulate``, which runs steps back to back in
virtual time for tests, docs and offline estimates. ``_schedule`` plans a step the way vLLM's V1
scheduler does (running sequences first, chunked prefills within the token budget, new requests
FCFS while KV blocks last, the newest preempted when they run out); ``_complete`` applies a
finished step (KV grows, full prompt blocks enter the prefix cache, tokens are emitted).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from loadgen.sim.model import SimRequest
from loadgen.sim.prefix_cache import block_hashes
from loadgen.sim.step_cost import StepCost

__all__ = ["BatchScheduler", "Seq", "StepPlan"]


@dataclass(eq=False, slots=True)
class Seq:
    """A request as the engine holds it: its prompt's block hashes, its KV, its progress."""

    req: SimRequest
    prompt_len: int
    hashes: list[int]  # chained hashes of the prompt's full blocks (empty: cache off)
    computed: int = 0  # tokens whose KV exists
    blocks: int = 0  # blocks held, cached + anonymous
    cached: list[int] = field(default_factory=list)  # hashes this sequence holds refs on
    committed: int = 0  # leading prompt blocks held as cached blocks
    done: bool = False
    step_tokens: int = 0  # tokens computed in the step planned last (set by _schedule)


@dataclass(slots=True)
class StepPlan:
    """One planned step: what it computes and what it costs."""

    items: list[Seq]  # the sequences computed this step (each one's tokens: ``step_tokens``)
    seconds: float


class _Batch:
    """A step being planned: the sequences in it, the token budget left, and the totals it is priced by."""

    __slots__ = ("items", "budget", "tokens", "dec_ctx", "pre_attn", "kv")

    def __init__(self, budget: int) -> None:
        self.items: list[Seq] = []
        self.budget = budget
        self.tokens = self.dec_ctx = self.pre_attn = self.kv = 0

    def add_prefill(self, s: Seq, n: int, c: int) -> None:
        """``n`` prompt tokens of ``s`` after ``c`` already computed (each attends to all before it)."""
        s.step_tokens = n
        self.items.append(s)
        self.budget -= n
        self.pre_attn += n * c + n * (n + 1) // 2
        self.tokens += n
        self.kv += c + n


class BatchScheduler(StepCost):
    """Queues, KV blocks and step planning of ``RooflineModel``; step costs from ``StepCost``."""

    # Set by ``RooflineModel.__init__``.
    _waiting: deque[Seq]
    _running: list[Seq]
    _seqs: dict[SimRequest, Seq]
    _t_model: int  # the model clock: the end of the last step
    _c: dict[str, int]  # counters for ``stats``
    _wakeup: asyncio.Event  # set on submit: the real-time loop waits on it while idle
    error: BaseException | None  # why the real-time loop died, if it did

    def submit(self, req: SimRequest) -> None:
        """Queue a request; raises ValueError if it can never fit (check ``max_model_len``)."""
        if self.error is not None:
            raise RuntimeError("the simulated engine's loop has died") from self.error
        p = len(req.prompt_ids)
        if p + req.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({p}) + max_tokens ({req.max_tokens}) exceeds max_model_len ({self.max_model_len}) tokens"
            )
        hashes = block_hashes(req.prompt_ids, self.block_size) if self.prefix_caching else []
        s = Seq(req, max(1, p), hashes)  # an empty prompt still has a BOS token to compute
        self._seqs[req] = s
        self._waiting.append(s)
        self._c["prompt"] += p
        self._wakeup.set()

    def cancel(self, req: SimRequest) -> None:
        req.cancelled = True
        s = self._seqs.pop(req, None)
        if s is None or s.done:
            return
        s.done = True
        if s.blocks:
            self._running.remove(s)
            self._free(s)
        else:
            self._waiting.remove(s)
        req.notify()

    def reset_prefix_cache(self) -> int:
        """Drop unreferenced cached blocks (between sweep points); returns how many."""
        return self.pool.reset()

    def simulate(self, until_ns: int | None = None) -> int:
        """Run steps in virtual time, without sleeping, until idle (or ``until_ns``).

        For tests, docs and offline estimates; never while ``start()``-ed. Returns t_model.
        """
        while (start := self._next_start()) is not None:
            if until_ns is not None and start >= until_ns:
                break
            plan = self._schedule(start)
            if plan is None:
                break
            self._complete(plan, start + int(plan.seconds * 1e9))
        return self._t_model

    def _next_start(self) -> int | None:
        if self._running:
            return self._t_model
        if self._waiting:
            return max(self._t_model, self._waiting[0].req.arrival_ns)
        return None

    def _grow(self, s: Seq, n: int) -> bool:
        need = -(-(s.computed + n) // self.block_size) - s.blocks
        if need <= 0:
            return True
        if not self.pool.allocate(need):
            return False
        s.blocks += need
        return True

    def _free(self, s: Seq) -> None:
        self.pool.release(s.cached)
        self.pool.free(s.blocks - len(s.cached))
        s.cached, s.blocks, s.committed, s.computed = [], 0, 0, 0

    def _schedule(self, start: int) -> StepPlan | None:
        """Choose this step's work (allocating blocks, preempting, admitting) and its cost.

        Running sequences go first; new requests are admitted only in a step that preempted
        nobody (a preempted sequence is first in the queue, and must not be readmitted at once)."""
        batch = _Batch(self.max_batch_tokens)
        if not self._continue_running(batch):
            self._admit(start, batch)
        if not batch.items:
            return None
        return StepPlan(batch.items, self._step_s(batch.tokens, batch.dec_ctx, batch.pre_attn, batch.kv))

    def _continue_running(self, batch: _Batch) -> bool:
        """Give each running sequence its tokens this step, in order: a decode one, a prefill what the
        budget leaves after one token for every decode behind it. Returns whether any was preempted.

        Runs once per step over every running sequence, so it is kept tight (locals, no calls in the
        common case): a sequence asks the pool for blocks only when its tokens cross a block boundary."""
        running, bs, items = self._running, self.block_size, batch.items
        budget, tokens, dec_ctx, pre_attn, kv = batch.budget, 0, 0, 0, 0
        decodes_left = 0
        for s in running:
            if s.prompt_len + s.req.emitted - s.computed == 1:
                decodes_left += 1
        preempted = False
        i = 0
        while i < len(running):
            s = running[i]
            c = s.computed
            need = s.prompt_len + s.req.emitted - c
            if need == 1:
                decodes_left -= 1
            n = budget - decodes_left
            if need < n:
                n = need
            if n <= 0:
                i += 1
                continue
            if c + n > s.blocks * bs:  # crosses into a block it does not hold yet
                held = len(running)
                lost, dropped = self._make_room(s, n)
                preempted = preempted or len(running) < held
                decodes_left -= dropped
                if lost:  # s itself was preempted: it was the last one
                    break
            s.step_tokens = n
            items.append(s)
            budget -= n
            if need == 1:
                dec_ctx += c + 1
            else:
                pre_attn += n * c + n * (n + 1) // 2
            tokens += n
            kv += c + n
            i += 1
        batch.budget, batch.tokens, batch.dec_ctx, batch.pre_attn, batch.kv = budget, tokens, dec_ctx, pre_attn, kv
        return preempted

    def _make_room(self, s: Seq, n: int) -> tuple[bool, int]:
        """Grow ``s`` by ``n`` tokens' blocks, preempting the newest running sequences until they fit
        (vLLM's recompute preemption). Returns whether ``s`` itself went, and how many of those that
        went were decodes (each had a token of the budget reserved for it)."""
        running, decodes = self._running, 0
        while not self._grow(s, n):
            victim = running.pop()
            self._preempt(victim)
            if victim is s:
                return True, decodes
            if victim.prompt_len + victim.req.emitted - victim.computed == 1:
                decodes += 1
        return False, decodes

    def _admit(self, start: int, batch: _Batch) -> None:
        """Admit waiting requests that arrived by ``start``, first come first served, while the budget,
        ``max_num_seqs`` and the KV pool allow; a prefix-cache hit is KV already there. The first that
        does not fit waits, and everyone behind it (no overtaking, as in vLLM)."""
        waiting, running, pool, bs = self._waiting, self._running, self.pool, self.block_size
        while waiting and batch.budget > 0 and len(running) < self.max_num_seqs:
            s = waiting[0]
            if s.req.arrival_ns > start:
                break
            total = s.prompt_len + s.req.emitted
            hit, lru = pool.lookup(s.hashes, (total - 1) // bs)
            c = hit * bs
            n = min(total - c, batch.budget)
            new = -(-(c + n) // bs) - hit
            if new + lru > pool.num_free:
                break
            waiting.popleft()
            pool.acquire(s.hashes[:hit])
            pool.allocate(new)
            s.cached, s.committed, s.blocks, s.computed = s.hashes[:hit], hit, hit + new, c
            self._c["queries"] += total
            self._c["hits"] += c
            r = s.req
            if r.queue_wait_ns is None:
                r.queue_wait_ns = start - r.arrival_ns
                r.prefill_start_ns = start
                r.cached_tokens = c
            running.append(s)
            batch.add_prefill(s, n, c)

    def _preempt(self, s: Seq) -> None:
        self._free(s)
        s.req.preemptions += 1
        self._c["preempt"] += 1
        self._waiting.appendleft(s)

    def _complete(self, plan: StepPlan, end: int, emitted_ns: int | None = None) -> int:
        """Apply a finished step: KV grows, full prompt blocks enter the cache, tokens go out
        (stamped ``emitted_ns``, the real instant, when it differs from the model's ``end``).

        Emitting calls the server's sink, which writes each token to its socket here unless it was
        written already (``_prepare``): this loop is the simulator's hot path (one pass per step
        over the batch). Returns how many emitted tokens went to a sink."""
        self._t_model = end
        stamp = end if emitted_ns is None else emitted_ns
        bs, finished, gen, sinks = self.block_size, False, 0, 0
        for s in plan.items:
            if s.done:  # cancelled during the step
                continue
            computed = s.computed = s.computed + s.step_tokens
            if s.committed < len(s.hashes):
                while s.committed < len(s.hashes) and (s.committed + 1) * bs <= computed:
                    h = s.hashes[s.committed]
                    self.pool.commit(h)
                    s.cached.append(h)
                    s.committed += 1
            r = s.req
            if computed == s.prompt_len + r.emitted:
                if r.prefill_end_ns is None:
                    r.prefill_end_ns = stamp
                if r.max_tokens > 0:
                    gen += 1
                    if r.sink is not None:
                        sinks += 1
                    r.emit(1, stamp, end)
                else:
                    r.emit(0, stamp, end)
                if r.finished:
                    s.done = finished = True
                    self._free(s)
                    self._seqs.pop(r, None)
                    self._c["ok"] += 1
        self._c["gen"] += gen
        if finished:
            self._running = [s for s in self._running if not s.done]
        return sinks
