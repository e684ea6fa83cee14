"""The continuous-batching scheduler of the simulated engine, in model time.

It decides *what* each step computes, apart from *when* it runs, so that the same decisions drive
both the real-time loop (``engine_loop.py``) and ``simulate``, which runs steps back to back in
virtual time for tests, docs and offline estimates. ``_schedule`` plans a step the way vLLM's V1
scheduler does (running sequences first, chunked prefills within the token budget, new requests
FCFS while KV blocks last, the newest preempted when they run out); ``_complete`` applies a
finished step (KV grows, full prompt blocks enter the prefix cache, tokens are emitted).

Admission has two policies (``admission``): ``vllm`` admits a request when the blocks of its first
chunk fit (vLLM V1: KV grows on demand, and when it runs out the newest running sequence is
preempted and later recomputed; ``kv_watermark`` keeps that share of the pool free at admission,
as vLLM V0's block manager did with 1 %); ``reserve`` admits one only when the blocks of its whole
sequence (prompt + max_tokens) fit and holds them from the start, so nothing is ever preempted
(TensorRT-LLM's default capacity scheduler, GUARANTEED_NO_EVICT).

In virtual time (``bulk_decode``) running sequences that only decode are kept as counts and sums
(``decode_set.DecodeSet``) instead of being walked every step: a step is priced from their totals,
the blocks they need that step are taken in one allocation, and one is touched only when it emits
its last token. The walk over every running sequence is the same code as ever, and runs whenever
the totals could differ from it: a step whose blocks do not all fit (someone is preempted) syncs
every sequence and walks them all. Prefills are walked every step, as before. A run of steps
with nothing but steady decodes and nobody waiting is priced and applied in one tight loop
(``quiet_steps``) until one of them has anything else to do.

A prompt's block names are a ``prefix_cache.BlockChain``: hashed as far as a lookup reads them.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from bisect import bisect_left
from collections import deque

from loadgen.sim.decode_set import SteadyDecodes, by_order
from loadgen.sim.model import SimRequest
from loadgen.sim.prefix_cache import BlockChain
from loadgen.sim.sequences import Batch, Seq, StepPlan
from loadgen.sim.step_cost import StepCost

__all__ = ["BatchScheduler"]


class BatchScheduler(SteadyDecodes, StepCost):
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
        hashes = BlockChain(req.prompt_ids, self.block_size) if self.prefix_caching else ()
        s = Seq(req, max(1, p), hashes, ready_ns=req.arrival_ns)  # an empty prompt still has a BOS token
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
            if s.steady:
                self._settle(s)
            self._running.remove(s)
            if self._dset is not None and s in self._slow:
                self._slow.remove(s)
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

    def quiet_steps(self, start: int, bound: int) -> int:
        """In bulk decode, run back to back from ``start`` the steps in which nothing happens but
        counts: every running sequence a steady decode, nobody waiting, none's last token and the
        blocks they cross into all free; each while it starts before ``bound`` (the next arrival).
        Each is the step ``step_at`` and ``finish_at`` would give, with no plan built: a low-load
        engine spends most of its steps this way. Returns the model clock after them (``start``
        when none could run: the next step has something to decide)."""
        ds = self._dset
        if ds is None or self._slow or self._waiting or not ds.n:
            return start
        # The members stay the same throughout: their count, summed context (``ds.context``), buckets
        # and first last token; ``ds.crossings`` is called only where a member joins a bucket.
        ends, pool, n, base, buckets, later, bs = ds.ends, self.pool, ds.n, ds.base, ds.buckets, ds.later, ds.bs
        step_s = self._step_s
        t = start
        g = g0 = len(ends)
        last = ds.next_last()
        while t < bound and g < last:  # (at ``last``, someone's last token: an ordinary step)
            need = ds.crossings(g) if later and later[0][0] <= g else buckets[g % bs]
            if need and not pool.allocate(need):  # someone would be preempted: the walk decides who
                break
            ctx = base + n * (g + 1)
            t += int(step_s(n, ctx, 0, ctx, n) * 1e9)
            ends.append(t)
            g += 1
        steps = g - g0
        if steps:
            self._t_model = t
            self._c["gen"] += n * steps
            self._c["steps"] += steps  # never late: virtual time (``finish_at``)
        return t

    def _next_start(self) -> int | None:
        if self._running:
            return self._t_model
        if self._waiting:
            return max(self._t_model, self._waiting[0].ready_ns)
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
        self.pool.release(s.hashes, s.committed)
        self.pool.free(s.blocks - s.committed)
        s.blocks, s.committed, s.computed = 0, 0, 0

    def _schedule(self, start: int) -> StepPlan | None:
        """Choose this step's work (allocating blocks, preempting, admitting) and its cost.

        Running sequences go first; new requests are admitted only in a step that preempted
        nobody (a preempted sequence is first in the queue, and must not be readmitted at once)."""
        batch = Batch(self.max_batch_tokens)
        ds, steady, walked = self._dset, 0, True
        if ds is None:
            preempted = self._continue_running(batch)
        else:
            steady = self._continue_steady(batch, ds)
            walked = steady < 0
            preempted = self._continue_running(batch) if walked else False
            steady = max(steady, 0)
        if not preempted:
            self._admit(start, batch)
        if not batch.items and not steady:
            return None
        b = batch
        seconds = self._step_s(b.tokens, b.dec_ctx, b.pre_attn, b.kv, b.dec)
        if self.spec_tokens and b.dec_seqs:  # the draft: spec_tokens passes, each a share of a plain decode step
            plain = self._step_s(b.dec_seqs, b.dec_plain, 0, b.dec_plain, b.dec_seqs) - self.step_overhead_s
            seconds += self.spec_tokens * self.spec_draft_cost * plain
        return StepPlan(b.items, seconds, steady, walked)

    def _continue_running(self, batch: Batch) -> bool:
        """Give each running sequence its tokens this step, in order: a decode one, a prefill what the
        budget leaves after one token for every decode behind it. Returns whether any was preempted.

        Runs once per step over every running sequence, so it is kept tight (locals, no calls in the
        common case): a sequence asks the pool for blocks only when its tokens cross a block boundary."""
        running, bs, items, spec = self._running, self.block_size, batch.items, self.spec_tokens
        budget, tokens, dec_ctx, pre_attn, kv, dec = batch.budget, 0, 0, 0, 0, 0
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
                if spec:  # the token to decode and up to spec_tokens drafts after it, verified at once
                    need += min(spec, s.req.max_tokens - s.req.emitted - 1)
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
                dec += 1
            elif c == s.prompt_len + s.req.emitted - 1:  # a speculative decode: 1 + (n - 1) drafts
                s.drafts = n - 1
                dec_ctx += n * c + n * (n + 1) // 2
                dec += n
                batch.dec_seqs += 1
                batch.dec_plain += c + 1
            else:
                pre_attn += n * c + n * (n + 1) // 2
            tokens += n
            kv += c + n
            i += 1
        batch.budget, batch.tokens, batch.dec_ctx, batch.pre_attn, batch.kv = budget, tokens, dec_ctx, pre_attn, kv
        batch.dec = dec
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

    def _admit(self, start: int, batch: Batch) -> None:
        """Admit waiting requests that arrived by ``start``, first come first served, while the budget,
        ``max_num_seqs`` and the KV pool allow; a prefix-cache hit is KV already there. The first that
        does not fit waits, and everyone behind it (no overtaking, as in vLLM)."""
        waiting, running, pool, bs = self._waiting, self._running, self.pool, self.block_size
        reserve = self.admission == "reserve"
        keep = int(self.kv_watermark * pool.num_blocks)  # blocks admission leaves free
        while waiting and batch.budget > 0 and len(running) < self.max_num_seqs:
            s = waiting[0]
            if s.ready_ns > start:
                break
            total = s.prompt_len + s.req.emitted
            hit, lru = pool.lookup(s.hashes, (total - 1) // bs)
            c = hit * bs
            if s.req.kv_ready > c:  # KV that came from elsewhere (a prefill pool): nothing to compute
                c = min(s.req.kv_ready, total - 1)
            n = min(total - c, batch.budget)
            held = s.prompt_len + s.req.max_tokens if reserve else c + n  # tokens whose blocks it takes now
            new = -(-held // bs) - hit
            if new + lru + keep > pool.num_free:
                break
            waiting.popleft()
            if hit:
                pool.acquire(s.hashes, hit)
            pool.allocate(new)
            if s.lost > c:  # readmitted after a preemption: what the cache did not keep is computed again
                self._c["recomputed"] += s.lost - c
            s.lost = 0
            s.committed, s.blocks, s.computed = hit, hit + new, c
            self._c["queries"] += total
            self._c["hits"] += hit * bs
            r = s.req
            if r.queue_wait_ns is None:
                r.queue_wait_ns = start - r.arrival_ns
                r.prefill_start_ns = start
                r.cached_tokens = c
            self._admissions += 1
            s.order = self._admissions
            running.append(s)
            if self._dset is not None:
                self._slow.append(s)
            batch.add_prefill(s, n, c)

    def _accepted(self, s: Seq) -> int:
        """How many of ``s``'s drafts this step accepts: each, in order, with probability
        ``spec_acceptance`` until the first rejected (drawn from the request's own stream)."""
        rng = s.rng
        if rng is None:
            rng = s.rng = random.Random(zlib.crc32(s.req.rid.encode()))
        k, a = 0, self.spec_acceptance
        while k < s.drafts and rng.random() < a:
            k += 1
        return k

    def _preempt(self, s: Seq) -> None:
        s.lost = s.computed
        s.req.kv_ready = 0  # KV that came from elsewhere is gone too: computed here when readmitted
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
        bs, gen, sinks = self.block_size, plan.steady, 0
        finished: list[Seq] = []
        ds, seqs = self._dset, plan.items
        if ds is not None:  # bulk decode: the steady decodes that end this step go in running order too
            ds.ends.append(stamp)
            ending = ds.finishing(len(ds.ends) - 1)
            if ending:
                seqs = sorted([*seqs, *ending], key=by_order)
        for s in seqs:
            if s.done:  # cancelled during the step
                continue
            r = s.req
            if s.steady:  # its last token: all its tokens are recorded now
                self._settle(s)
            else:
                extra = 0
                if s.drafts:  # speculative: the decoded token's KV and the accepted drafts' are kept
                    extra = self._accepted(s)
                    s.drafts = 0
                    computed = s.computed = s.computed + 1 + extra
                else:
                    computed = s.computed = s.computed + s.step_tokens
                full = computed // bs  # prompt blocks now fully computed: into the cache, in order
                if s.committed < full and s.committed < len(s.hashes):
                    full = min(full, len(s.hashes))
                    self.pool.commit_many(s.hashes, s.committed, full)
                    s.committed = full
                if computed - extra == s.prompt_len + r.emitted:
                    if r.prefill_end_ns is None:
                        r.prefill_end_ns = stamp
                    if r.max_tokens > 0:  # with accepted drafts: them, then the verifier's own next token
                        gen += 1 + extra
                        if r.sink is not None:
                            sinks += 1
                        r.emit(1 + extra, stamp, end)
                    else:
                        r.emit(0, stamp, end)
            if r.finished:
                s.done = True
                finished.append(s)
                self._free(s)
                self._seqs.pop(r, None)
                self._c["ok"] += 1
        self._c["gen"] += gen
        if finished:
            running = self._running
            if len(finished) * 8 < len(running):  # a few of many: each found by its admission order
                for s in finished:
                    i = bisect_left(running, s.order, key=by_order)
                    assert running[i] is s
                    del running[i]
            else:
                self._running = [s for s in running if not s.done]
        if ds is not None:
            self._steady_up(plan, ds)
        return sinks
