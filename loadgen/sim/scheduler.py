"""The continuous-batching scheduler of the simulated engine, in model time.

Split from the simulated engine (``roofline.py``): this is the part that decides *what* each
step computes, apart from *when* it runs. ``_schedule`` plans a step the way vLLM's V1
scheduler does (running sequences first, chunked prefills within the token budget, new
requests FCFS while KV blocks last, the newest preempted when they run out); ``_complete``
applies a finished step (KV grows, full prompt blocks enter the prefix cache, tokens are
emitted). ``simulate`` runs these back to back in virtual time, for tests, docs and offline
estimates; the real-time loop (``engine_loop.py``) runs the same two on the clock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from loadgen.sim.model import SimRequest
from loadgen.sim.prefix_cache import block_hashes
from loadgen.sim.step_cost import StepCost

__all__ = ["BatchScheduler"]


@dataclass(eq=False, slots=True)
class _Seq:
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
class _Plan:
    items: list[_Seq]  # the sequences computed this step (each one's tokens: ``step_tokens``)
    seconds: float


class BatchScheduler(StepCost):
    """Queues, KV blocks and step planning of ``RooflineModel``; step costs from ``StepCost``."""

    # Set by ``RooflineModel.__init__``.
    _waiting: deque[_Seq]
    _running: list[_Seq]
    _seqs: dict[SimRequest, _Seq]
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
        s = _Seq(req, max(1, p), hashes)  # an empty prompt still has a BOS token to compute
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

    def _grow(self, s: _Seq, n: int) -> bool:
        need = -(-(s.computed + n) // self.block_size) - s.blocks
        if need <= 0:
            return True
        if not self.pool.allocate(need):
            return False
        s.blocks += need
        return True

    def _free(self, s: _Seq) -> None:
        self.pool.release(s.cached)
        self.pool.free(s.blocks - len(s.cached))
        s.cached, s.blocks, s.committed, s.computed = [], 0, 0, 0

    def _schedule(self, start: int) -> _Plan | None:
        """Choose this step's work (allocating blocks, preempting, admitting) and its cost.

        Runs once per step over every running sequence, so the decode case is kept tight: a
        sequence asks the pool for blocks only when its tokens cross a block boundary."""
        budget, items, running, bs = self.max_batch_tokens, [], self._running, self.block_size
        tokens = dec_ctx = pre_attn = kv = 0
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
                lost = False
                while not self._grow(s, n):  # preempt the newest (vLLM: recompute)
                    victim = running.pop()
                    lost = victim is s
                    preempted = True
                    if not lost and victim.prompt_len + victim.req.emitted - victim.computed == 1:
                        decodes_left -= 1
                    self._preempt(victim)
                    if lost:
                        break
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
        while not preempted and self._waiting and budget > 0 and len(running) < self.max_num_seqs:
            s = self._waiting[0]
            if s.req.arrival_ns > start:
                break
            total = s.prompt_len + s.req.emitted
            hit, lru = self.pool.lookup(s.hashes, (total - 1) // self.block_size)
            c = hit * self.block_size
            n = min(total - c, budget)
            new = -(-(c + n) // self.block_size) - hit
            if new + lru > self.pool.num_free:
                break
            self._waiting.popleft()
            self.pool.acquire(s.hashes[:hit])
            self.pool.allocate(new)
            s.cached, s.committed, s.blocks, s.computed = s.hashes[:hit], hit, hit + new, c
            self._c["queries"] += total
            self._c["hits"] += c
            r = s.req
            if r.queue_wait_ns is None:
                r.queue_wait_ns = start - r.arrival_ns
                r.prefill_start_ns = start
                r.cached_tokens = c
            running.append(s)
            s.step_tokens = n
            items.append(s)
            budget -= n
            pre_attn += n * c + n * (n + 1) // 2
            tokens += n
            kv += c + n
        if not items:
            return None
        return _Plan(items, self._step_s(tokens, dec_ctx, pre_attn, kv))

    def _preempt(self, s: _Seq) -> None:
        self._free(s)
        s.req.preemptions += 1
        self._c["preempt"] += 1
        self._waiting.appendleft(s)

    def _complete(self, plan: _Plan, end: int, emitted_ns: int | None = None) -> int:
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
