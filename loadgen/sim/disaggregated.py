"""Disaggregated serving: a pool of prefill engines hands each prompt's KV cache to a pool of decode engines.

``DisaggregatedModel`` is one serving unit: ``prefills`` prefill engines (each a ``RooflineModel`` of
its own TP) and ``decodes`` decode engines, the first of which is the object itself, so that anything
that drives a ``RooflineModel`` step by step (the virtual-time loop, ``simulate``) drives the unit.
A request goes to the prefill engine holding the longest cached prefix of its prompt (the fewest
queued tokens on a tie: a KV-aware router's choice), which computes the prompt and its first token;
its KV then crosses to a decode engine (round robin) in

    transfer = prompt tokens x KV bytes per token (all layers, every head) / (prefill TP x kv_transfer_gb_s)
               + kv_transfer_latency_s

(each prefill GPU sends its shard over its own link), and arrives there as KV already computed
(``SimRequest.kv_ready``): the decode engine admits it, holding its blocks, and decodes the rest. The
first token's time is the prefill engine's; every later one the decode engine's. Steps run in the
order they start, whichever engine they are on: ``_next_start`` is the earliest of all engines',
``step_at`` plans that engine's step and ``finish_at`` applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.sim.engine_loop import EngineLoop
from loadgen.sim.model import SimRequest
from loadgen.sim.prefix_cache import BlockChain
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.scheduler import BatchScheduler
from loadgen.sim.sequences import StepPlan
from loadgen.sim.step_cost import CapacityError

__all__ = ["DisaggregatedModel"]


class DisaggregatedModel(RooflineModel):
    """Prefill and decode pools as one engine (module doc). ``decode`` and ``prefill`` are the keyword
    options of each pool's ``RooflineModel`` (``tp``, ``max_num_seqs``, ``weight_dtype``, ...)."""

    def __init__(
        self,
        gpu: str,
        model: str,
        *,
        prefill: dict[str, Any],
        decode: dict[str, Any],
        prefills: int = 1,
        decodes: int = 1,
        kv_transfer_gb_s: float = 50.0,
        kv_transfer_latency_s: float = 0.0005,
        prefill_gpu: str | None = None,
    ) -> None:
        if prefills < 1 or decodes < 1:
            raise CapacityError("a disaggregated unit needs at least one prefill and one decode engine")
        if not kv_transfer_gb_s > 0 or kv_transfer_latency_s < 0:
            raise CapacityError("kv_transfer_gb_s must be > 0 and kv_transfer_latency_s >= 0")
        # the decode pool holds KV sent to it: no prompt is ever looked up there, so it keeps no
        # prefix cache (a preempted request is recomputed whole, as it would be)
        decode = {"prefix_cache": False, **decode}
        super().__init__(gpu, model, **decode)
        self.prefill_pool = [RooflineModel(prefill_gpu or gpu, model, **prefill) for _ in range(prefills)]
        self.decode_pool: list[RooflineModel] = [self] + [
            RooflineModel(gpu, model, **decode) for _ in range(decodes - 1)
        ]
        self.engines: list[RooflineModel] = [*self.prefill_pool, *self.decode_pool]
        self.max_model_len = min(e.max_model_len for e in self.engines)
        p = self.prefill_pool[0]
        full_kv = p.kv_bytes_per_token * p.tp  # per GPU x GPUs: the whole model's KV of one token
        self._xfer_s_per_token = full_kv / (p.tp * kv_transfer_gb_s * 1e9)
        self._xfer_latency_s = kv_transfer_latency_s
        self.kv_transfer_gb_s = kv_transfer_gb_s
        self._proxy: dict[SimRequest, SimRequest] = {}  # prefill-side request -> the client's
        self._where: dict[SimRequest, RooflineModel] = {}  # the client's request -> its engine now
        self._next_decode = 0
        self._stepping: dict[int, RooflineModel] = {}  # id(plan) -> the engine that planned it
        self._short = 0  # requests of at most one token: done on their prefill engine

    @property
    def gpus(self) -> int:
        return sum(e.tp for e in self.engines)

    def transfer_s(self, prompt_tokens: int) -> float:
        """Seconds to move a prompt's KV from a prefill engine to a decode engine."""
        return prompt_tokens * self._xfer_s_per_token + self._xfer_latency_s

    # ---- requests -------------------------------------------------------------------------
    def submit(self, req: SimRequest) -> None:
        p = len(req.prompt_ids)
        if p + req.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({p}) + max_tokens ({req.max_tokens}) exceeds max_model_len ({self.max_model_len}) tokens"
            )
        proxy = SimRequest(req.rid, req.prompt_ids, 1, req.arrival_ns)
        engine = self._route_prefill(req.prompt_ids)
        self._proxy[proxy] = req
        self._where[req] = engine
        BatchScheduler.submit(engine, proxy)

    def _route_prefill(self, prompt: Sequence[int]) -> RooflineModel:
        pool = self.prefill_pool
        if len(pool) == 1:
            return pool[0]
        hashes = BlockChain(prompt, pool[0].block_size)

        def score(e: RooflineModel) -> tuple[int, int]:
            queued = sum(s.prompt_len - s.computed for s in e._waiting) + sum(
                s.prompt_len - s.computed for s in e._running
            )
            return (-e.pool.lookup(hashes)[0], queued)

        return min(pool, key=score)

    def cancel(self, req: SimRequest) -> None:
        engine = self._where.pop(req, None)
        req.cancelled = True
        if engine is None:
            return
        if engine in self.prefill_pool:
            for proxy, r in list(self._proxy.items()):
                if r is req:
                    BatchScheduler.cancel(engine, proxy)
                    del self._proxy[proxy]
        else:
            BatchScheduler.cancel(engine, req)
        req.notify()

    # ---- steps ----------------------------------------------------------------------------
    def _next_start(self) -> int | None:
        best: int | None = None
        for e in self.engines:
            t = BatchScheduler._next_start(e)
            if t is not None and (best is None or t < best):
                best = t
        return best

    def step_at(self, start: int) -> tuple[StepPlan, int] | None:
        for e in self.engines:
            if BatchScheduler._next_start(e) == start:
                step = EngineLoop.step_at(e, start)
                if step is not None:
                    self._stepping[id(step[0])] = e
                    return step
        return None

    def quiet_steps(self, start: int, bound: int) -> int:
        """None: the pools' steps interleave, each one through ``step_at`` (see ``BatchScheduler``)."""
        return start

    def finish_at(self, plan: StepPlan, end: int) -> None:
        engine = self._stepping.pop(id(plan))
        EngineLoop.finish_at(engine, plan, end)
        if engine in self.prefill_pool:
            for s in plan.items:
                if s.req.finished and s.req in self._proxy:
                    self._hand_over(s.req, end)

    def simulate(self, until_ns: int | None = None) -> int:
        end = 0
        while (start := self._next_start()) is not None:
            if until_ns is not None and start >= until_ns:
                break
            step = self.step_at(start)
            if step is None:
                break
            self.finish_at(*step)
            end = max(end, step[1])
        return end

    def _hand_over(self, proxy: SimRequest, end: int) -> None:
        """A prompt is done on its prefill engine: the first token goes out, the KV goes to a decode engine."""
        req = self._proxy.pop(proxy)
        req.queue_wait_ns, req.prefill_start_ns = proxy.queue_wait_ns, proxy.prefill_start_ns
        req.prefill_end_ns, req.cached_tokens = end, proxy.cached_tokens
        req.preemptions += proxy.preemptions
        if req.max_tokens <= 1:
            self._short += 1
            self._where.pop(req, None)
            req.emit(req.max_tokens, end, end)
            return
        req.emit(1, end, end)
        req.kv_ready = len(req.prompt_ids)
        engine = self.decode_pool[self._next_decode % len(self.decode_pool)]
        self._next_decode += 1
        self._where[req] = engine
        BatchScheduler.submit(engine, req)
        engine._c["prompt"] -= len(req.prompt_ids)  # counted once, by the prefill engine
        engine._seqs[req].ready_ns = end + int(self.transfer_s(len(req.prompt_ids)) * 1e9)

    # ---- figures --------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """The pools' counters summed (gauges too: requests running, waiting), KV usage the decode pool's mean."""
        per = [RooflineModel.stats(e) for e in self.engines]
        out = {k: float(sum(d[k] for d in per)) for k in per[0]}
        dec = [RooflineModel.stats(e) for e in self.decode_pool]
        out["kv_cache_usage_perc"] = sum(d["kv_cache_usage_perc"] for d in dec) / len(dec)
        out["max_lateness_seconds"] = max(d["max_lateness_seconds"] for d in per)
        out["request_success_total"] = float(sum(d["request_success_total"] for d in dec) + self._short)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "disaggregated": True,
            "prefill": {**self.prefill_pool[0].describe(), "engines": len(self.prefill_pool)},
            "decode": {**RooflineModel.describe(self), "engines": len(self.decode_pool)},
            "kv_transfer_gb_s": self.kv_transfer_gb_s,
            "gpus": self.gpus,
        }
