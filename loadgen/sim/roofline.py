"""Roofline timing model of a continuous-batching inference engine (vLLM-like).

One engine step schedules, in this order: every running sequence (decodes take 1
token; unfinished chunked prefills take what the budget leaves after reserving one
token per later decode), then new requests FCFS while KV blocks are free, fewer than
``max_num_seqs`` run, and the ``max_batch_tokens`` budget lasts. Its duration is

    max(FLOPs / (peak x MFU), bytes / (HBM bandwidth x MBU)) + all-reduce + overhead

and every token it produces is stamped at the step's END. Timing runs on a virtual
model clock ``t_model``: a step starts at max(previous step end, first admitted
arrival) and the loop sleeps until the absolute end time, so sleep jitter never
accumulates. At that instant the step's tokens are emitted, and written to their
sockets there and then (the server's sink). If the loop cannot keep up, model times
are NOT shifted to real time: lateness is counted (``late_steps_total``,
``max_lateness_seconds``, ``behind()``), a step being late when the last of its
tokens went out more than ``late_threshold_s`` after the step's end.
docs/simulator.md derives every term and lists where each constant comes from.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..timing import sleep_until
from .model import COALESCE_NS, Clock, SimRequest
from .prefix_cache import PrefixCache, block_hashes
from .profiles import DTYPE_BYTES, KV_DTYPES, WEIGHT_DTYPES, GpuProfile, ModelProfile
from .profiles import gpu as load_gpu
from .profiles import model as load_model

__all__ = ["RooflineModel", "CapacityError", "Saturation", "offline_throughput"]

ACT_BYTES = 2  # activations exchanged by the TP all-reduce are BF16
# The engine loop's wait for a step's end: no asyncio timer within 2 ms of it (they wake up to
# ~1.2 ms late, later when a loop turn runs long); over that stretch, kernel naps of <= 0.1 ms with
# the server's I/O run between them (timing.py), and over the last 0.25 ms one kernel sleep to the
# instant, so that no loop turn (a request's HTTP parsing, its handler) starts just before the step's
# writes are due. Lands ~0.03 ms late (p50), and a process that sleeps rather than spins is the one the
# OS scheduler favours on a shared core.
_SPIN_NS, _NAP_NS, _HOLD_NS = 2_000_000, 100_000, 250_000
# How far past a step's end the server's front-end work may run it, in all; and how much front-end
# work goes between two steps even when it does not fit (``headroom``).
_FRONTEND_SLACK_NS, _FRONTEND_GAP_NS = 250_000, 1_000_000
# A loop that is behind yields to the event loop at least this often; and a step in flight this far
# past its end means the loop is far behind: front-end work is no longer held back for it.
_BEHIND_YIELD_NS = _FAR_BEHIND_NS = 5_000_000


_sched_yield = getattr(os, "sched_yield", lambda: None)


def _fine_timer_slack() -> None:
    """Ask Linux for 1 us of timer slack on this thread instead of the default 50 us: the engine
    loop's kernel naps before a step's end (``_NAP_NS``) then wake within ~10 us of when asked,
    not ~60 us, and that is lateness every step would carry. A no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in ns
    except (OSError, AttributeError):
        pass


def _collect_young() -> None:
    """Run the garbage collector's youngest pass now, just after a step's tokens went out, if it
    is due soon: left to its allocation trigger it runs at any moment, and on a slow core a pass
    takes a millisecond or more, which in a step's write burst makes the step late. Older passes
    (one in ten) are left to the collector's own trigger and policy."""
    if gc.isenabled():
        c0, c1, _ = gc.get_count()
        t0, t1, _ = gc.get_threshold()
        if c0 > t0 // 2 and c1 + 1 < t1:
            gc.collect(0)


class CapacityError(ValueError):
    """The configuration cannot run: weights do not fit, TP does not divide heads, ..."""


@dataclass(frozen=True)
class Saturation:
    """Steady state of a saturated engine for one fixed request shape (an estimate)."""

    concurrency: int  # sequences running at once
    bound: str  # "max_num_seqs" or "kv_cache": which limit sets the concurrency
    itl_s: float  # time between a sequence's tokens
    requests_per_s: float
    output_tokens_per_s: float


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


class RooflineModel:
    """A TimingModel whose step times come from a roofline of ``gpu`` x ``model``.

    Defaults: ``mfu`` 0.5 and ``mbu`` 0.8 are typical achieved fractions of peak for
    large GEMMs and for decode (memory-bound) kernels; ``step_overhead_s`` 0.5 ms is the
    per-step CPU/launch cost of an engine with CUDA graphs; ``max_num_seqs`` 256,
    ``max_batch_tokens`` 8192, ``kv_util`` 0.9 and ``block_size`` 16 are vLLM's defaults.
    ``num_gpu_blocks_override`` fixes the KV pool size (as vLLM's option does) for tests.
    """

    def __init__(
        self,
        gpu: GpuProfile | str,
        model: ModelProfile | str,
        *,
        tp: int = 1,
        max_num_seqs: int = 256,
        max_batch_tokens: int = 8192,
        kv_util: float = 0.9,
        prefix_cache: bool = True,
        mfu: float = 0.5,
        mbu: float = 0.8,
        step_overhead_s: float = 0.0005,
        block_size: int = 16,
        weight_dtype: str | None = None,
        kv_dtype: str = "bf16",
        clock: Clock = time.perf_counter_ns,
        num_gpu_blocks_override: int | None = None,
        late_threshold_s: float = 0.002,
    ):
        self.gpu = load_gpu(gpu) if isinstance(gpu, str) else gpu
        self.model = load_model(model) if isinstance(model, str) else model
        self.weight_dtype = weight_dtype or self.model.weight_dtype
        self.kv_dtype = kv_dtype
        self.tp, self.max_num_seqs, self.max_batch_tokens = tp, max_num_seqs, max_batch_tokens
        self.kv_util, self.mfu, self.mbu, self.block_size = kv_util, mfu, mbu, block_size
        self.step_overhead_s = step_overhead_s
        self.prefix_caching = prefix_cache
        self.clock = clock
        self.late_threshold_ns = int(late_threshold_s * 1e9)
        self._validate()
        self._constants()
        blocks = num_gpu_blocks_override or self._fit_blocks()
        self.pool = PrefixCache(blocks)
        self.max_model_len = min(self.model.max_context, blocks * block_size)
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._seqs: dict[SimRequest, _Seq] = {}
        self._t_model = 0
        self._wakeup = asyncio.Event()
        # the step in flight (its end on the model clock), for ``headroom``; set after each step
        self._next_end: int | None = None
        self._stepped = asyncio.Event()
        self._slack_left = 0  # overrun of the step in flight still allowed to front-end work
        self._gap_used = 0  # front-end work let through since the last step ended
        self._frontend_waits = 0
        self._frontend_wait_ns = 0
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        self._c = dict.fromkeys(("prompt", "gen", "ok", "preempt", "queries", "hits", "late", "steps"), 0)
        self._max_late_ns = self._last_late_ns = 0

    # ---- configuration ------------------------------------------------------------------
    def _validate(self) -> None:
        m = self.model
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise CapacityError(f"weight_dtype {self.weight_dtype!r} not one of {WEIGHT_DTYPES}")
        if self.kv_dtype not in KV_DTYPES:
            raise CapacityError(f"kv_dtype {self.kv_dtype!r} not one of {KV_DTYPES}")
        if self.tp < 1 or m.num_heads % self.tp:
            raise CapacityError(f"tp={self.tp} must divide {m.name}'s {m.num_heads} heads")
        if self.max_batch_tokens < self.max_num_seqs:
            raise CapacityError("max_batch_tokens must be >= max_num_seqs (one decode token each)")
        for k in ("kv_util", "mfu", "mbu"):
            if not 0 < getattr(self, k) <= 1:
                raise CapacityError(f"{k} must be in (0, 1], got {getattr(self, k)}")
        if self.block_size < 1 or self.max_num_seqs < 1 or self.step_overhead_s < 0:
            raise CapacityError("block_size, max_num_seqs must be >= 1; step_overhead_s >= 0")

    def _constants(self) -> None:
        """Precompute per-unit costs (seconds per token, per context token) for the hot path."""
        m, g, tp = self.model, self.gpu, self.tp
        wb, kb = DTYPE_BYTES[self.weight_dtype], DTYPE_BYTES[self.kv_dtype]
        bw = g.hbm_tb_s * 1e12 * self.mbu
        peak_w = g.peak_flops(self.weight_dtype) * self.mfu
        peak_a = g.peak_flops("bf16") * self.mfu  # attention math runs in BF16
        sw = m.sliding_window
        swl, window = (sw.layers, sw.window) if sw else (0, 0)
        full = m.layers - swl
        if m.mla:  # one latent per token, replicated on every TP rank
            a = m.mla
            kv_layer = (a.kv_lora_rank + a.qk_rope_head_dim) * kb
            att_dec = 2 * m.num_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)  # absorbed
            att_pre = 2 * m.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
        else:  # KV heads split over ranks; replicated when fewer heads than ranks
            kv_layer = 2 * math.ceil(m.num_kv_heads / tp) * m.head_dim * kb
            att_dec = att_pre = 4 * m.num_heads * m.head_dim
        self.kv_bytes_per_token = kv_layer * full  # per GPU, full-attention layers
        self._swa_bytes_per_token = kv_layer * swl
        self.weight_bytes_per_gpu = m.params_total_b * 1e9 * wb / tp
        self._lin = (2 * m.params_active_b * 1e9 / tp / peak_w
                     + 4 * m.num_heads * m.head_dim * swl * window / tp / peak_a)
        self._att_dec = att_dec * full / tp / peak_a
        self._att_pre = att_pre * full / tp / peak_a
        self._kv = self.kv_bytes_per_token / bw
        self._swa_mem = self._swa_bytes_per_token * window / bw
        self._w_dense = m.dense_params * wb / tp / bw
        self._w_exp = m.expert_params * wb / tp / bw
        self._experts = m.moe.experts if m.moe else 0
        self._miss = 1 - m.moe.experts_per_token / m.moe.experts if m.moe else 1.0
        collectives = 2 * m.layers if tp > 1 else 0  # after attention and after the MLP
        self._comm0 = collectives * g.allreduce_latency_us * 1e-6
        self._comm1 = (collectives * 2 * (tp - 1) / tp * m.hidden_size * ACT_BYTES
                       / (g.interconnect_gb_s * 1e9))

    def _fit_blocks(self) -> int:
        usable = self.gpu.hbm_gib * 2**30 * self.kv_util
        sw = self.model.sliding_window
        reserve = 0.0
        if sw:  # sliding layers hold at most window + one block per running sequence
            reserve = self.max_num_seqs * (sw.window + self.block_size) * self._swa_bytes_per_token
        free = usable - self.weight_bytes_per_gpu - reserve
        per_block = self.kv_bytes_per_token * self.block_size
        if free < per_block * 64:
            tp = self.tp * 2
            while tp <= 64 and (self.weight_bytes_per_gpu * self.tp / tp > usable * 0.95
                                or self.model.num_heads % tp):
                tp *= 2
            raise CapacityError(
                f"{self.model.name} ({self.weight_dtype}, "
                f"{self.weight_bytes_per_gpu * self.tp / 1e9:.1f} GB of weights) "
                f"does not fit on tp={self.tp} x {self.gpu.name} "
                f"({usable / 1e9:.1f} GB usable at kv_util {self.kv_util}): needs tp >= {tp}")
        return int(free // per_block)

    # ---- the roofline -------------------------------------------------------------------
    def _step_s(self, tokens: int, dec_ctx: int, pre_attn: int, kv_tokens: int) -> float:
        """One step's seconds.

        tokens: tokens computed (decodes + prefill chunks); dec_ctx: sum over decode
        tokens of the context they attend to; pre_attn: the same sum for prefill tokens;
        kv_tokens: KV-cache tokens read or written (full-attention layers).
        """
        compute = tokens * self._lin + dec_ctx * self._att_dec + pre_attn * self._att_pre
        weights = self._w_dense
        if self._experts:  # expected distinct experts hit by `tokens` uniform top-k picks
            weights += self._w_exp * self._experts * (1.0 - self._miss**tokens)
        memory = weights + kv_tokens * self._kv + tokens * self._swa_mem
        return max(compute, memory) + self._comm0 + tokens * self._comm1 + self.step_overhead_s

    def step_time_s(self, decode_contexts: list[int], prefill_tokens: int = 0,
                    prefill_context: int = 0) -> float:
        """Seconds for one step: decodes at these contexts (tokens already cached) plus one
        prefill chunk of ``prefill_tokens`` following ``prefill_context`` cached tokens."""
        n, c = prefill_tokens, prefill_context
        dec = sum(decode_contexts) + len(decode_contexts)
        return self._step_s(len(decode_contexts) + n, dec, n * c + n * (n + 1) // 2,
                            dec + (c + n if n else 0))

    def decode_step_s(self, batch: int, context: int) -> float:
        """Seconds for a step of ``batch`` decodes, each after ``context`` cached tokens."""
        ctx = batch * (context + 1)
        return self._step_s(batch, ctx, 0, ctx)

    def prefill_time_s(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill one prompt alone on an idle engine (zero-load TTFT)."""
        t, c, left = 0.0, cached_tokens, max(1, prompt_tokens - cached_tokens)
        while left > 0:
            n = min(left, self.max_batch_tokens)
            t += self._step_s(n, 0, n * c + n * (n + 1) // 2, c + n)
            c, left = c + n, left - n
        return t

    def kv_capacity_tokens(self) -> int:
        """Tokens the KV pool holds (full-attention layers; whole blocks)."""
        return self.pool.num_blocks * self.block_size

    def saturation_estimate(self, input_tokens: int, output_tokens: int) -> Saturation:
        """Max sustained throughput for fixed-shape requests: the capacity a sweep should find.

        Concurrency is max_num_seqs or what the KV pool holds at the average footprint
        (input + output/2 tokens, half a block of rounding), whichever binds. In one
        cycle of ``output_tokens`` decode steps every running sequence is replaced once,
        and each replacement's prefill adds its marginal cost to the decode step it joins
        (chunked by the budget). Prefills arrive in lumps, so averaging them into every
        step (max() of averages) would overstate throughput.
        """
        avg = input_tokens + output_tokens / 2
        kv_seqs = int(self.pool.num_blocks / (avg / self.block_size + 0.5))
        b = max(1, min(self.max_num_seqs, kv_seqs))
        bound = "max_num_seqs" if b == self.max_num_seqs and kv_seqs >= b else "kv_cache"
        ctx = int(avg)
        t_dec = self.decode_step_s(b, ctx)
        dec = b * (ctx + 1)
        extra, c, left = 0.0, 0, max(1, input_tokens)
        while left > 0:
            n = min(left, max(1, self.max_batch_tokens - b))
            extra += self._step_s(b + n, dec, n * c + n * (n + 1) // 2, dec + c + n) - t_dec
            c, left = c + n, left - n
        out = max(1, output_tokens)
        cycle = out * t_dec + b * extra
        return Saturation(b, bound, cycle / out, b / cycle, b * out / cycle)

    def describe(self) -> dict[str, Any]:
        """The configuration and derived capacities, for logs, /v1/models and report headers."""
        return {
            "gpu": self.gpu.name, "model": self.model.name, "tp": self.tp,
            "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype,
            "weights_gb_per_gpu": round(self.weight_bytes_per_gpu / 1e9, 2),
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token,
            "kv_capacity_tokens": self.kv_capacity_tokens(), "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs, "max_batch_tokens": self.max_batch_tokens,
            "mfu": self.mfu, "mbu": self.mbu, "step_overhead_s": self.step_overhead_s,
            "prefix_cache": self.prefix_caching, "block_size": self.block_size,
        }

    # ---- TimingModel --------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            _fine_timer_slack()  # this thread runs the engine loop
            self._stepped.clear()
            self._task = asyncio.get_running_loop().create_task(self._loop())
            self._task.add_done_callback(self._on_done)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            self.error = task.exception()
        self._next_end = None  # nothing will step again: release whoever waits for headroom
        self._stepped.set()

    async def headroom(self, need_ns: int) -> None:
        """Wait, if need be, until front-end work estimated at ``need_ns`` fits before the next step ends.

        The server's request handling (parsing, tokenizing, a stream's first and last writes) runs
        on the engine loop's core: a burst of it just before a step ends (a wave of requests ending
        and starting together) would make every token of that step late. The server calls this
        first, so that work fills the gaps between steps the way a real server's front end works
        beside its engine, and a burst is admitted over the next steps instead of stalling one.
        Work that would run past the step's end goes ahead while the step's small overrun
        allowance lasts (a lone arrival is never held back), and all of it goes while the loop is
        far behind (it catches up by coalescing writes, see server.py); when less than a millisecond of
        work went between two steps, work held back goes whether it fits or not, so that steps
        shorter than ``need_ns`` still admit at a steady pace.
        """
        waited_from = 0
        while True:
            end = self._next_end
            if end is None:
                break
            left = end - self.clock()
            if left < -_FAR_BEHIND_NS:
                break  # the loop is far behind: holding work back would not put it on time
            over = need_ns - left
            if over <= 0:
                self._gap_used += need_ns
                break
            if over <= self._slack_left:
                self._slack_left -= over
                self._gap_used += need_ns
                break
            if waited_from and self._gap_used < _FRONTEND_GAP_NS:
                self._gap_used += need_ns
                break
            waited_from = waited_from or self.clock()
            await self._stepped.wait()
        if waited_from:
            self._frontend_waits += 1
            self._frontend_wait_ns += self.clock() - waited_from

    def submit(self, req: SimRequest) -> None:
        """Queue a request; raises ValueError if it can never fit (check ``max_model_len``)."""
        if self.error is not None:
            raise RuntimeError("the simulated engine's loop has died") from self.error
        p = len(req.prompt_ids)
        if p + req.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({p}) + max_tokens ({req.max_tokens}) exceeds "
                             f"max_model_len ({self.max_model_len}) tokens")
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

    def stats(self) -> dict[str, float]:
        c = self._c
        return {
            "num_requests_running": len(self._running),
            "num_requests_waiting": len(self._waiting),
            "kv_cache_usage_perc": self.pool.num_used / self.pool.num_blocks,
            "prefix_cache_queries_total": c["queries"],
            "prefix_cache_hits_total": c["hits"],
            "prompt_tokens_total": c["prompt"],
            "generation_tokens_total": c["gen"],
            "num_preemptions_total": c["preempt"],
            "request_success_total": c["ok"],
            "late_steps_total": c["late"],
            "steps_total": c["steps"],
            "max_lateness_seconds": self._max_late_ns / 1e9,
            "frontend_waits_total": self._frontend_waits,
            "frontend_wait_seconds_total": self._frontend_wait_ns / 1e9,
        }

    def behind(self) -> bool:
        """True when the last step's tokens went out later than its model end time + threshold."""
        return self._last_late_ns > self.late_threshold_ns

    def reset_prefix_cache(self) -> int:
        """Drop unreferenced cached blocks (between sweep points); returns how many."""
        return self.pool.reset()

    # ---- the engine ---------------------------------------------------------------------
    async def _loop(self) -> None:
        yielded = self.clock()
        while True:
            start = self._next_start()
            plan = None if start is None else self._schedule(start)
            if plan is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            end = start + int(plan.seconds * 1e9)
            self._next_end, self._slack_left = end, _FRONTEND_SLACK_NS
            now = self.clock()
            writes: list[Callable[[], None]] = []
            if now < end:  # to ~0.1 ms: no timer can be late past `end` (timing.py)
                writes = self._prepare(plan)  # while there is time: the step's writes, ready to go
                await sleep_until(end - _HOLD_NS, self.clock, spin_ns=_SPIN_NS, nap_ns=_NAP_NS)
                left = end - self.clock()
                if left > 0:
                    time.sleep(left / 1e9)
                yielded = self.clock()
            elif now - yielded > _BEHIND_YIELD_NS:
                # Behind: steps run back to back to catch up, but the server's I/O (new requests,
                # and the writes of tokens that were emitted late, coalesced) still runs this often.
                await asyncio.sleep(0)
                yielded = self.clock()
            # the model's clock stays at ``end`` (no drift); the ground truth is when tokens really
            # went out: stamped now, then written to their sockets, first the prepared writes (one
            # call each), then, in _complete's bookkeeping, the others by the server's sink. A step
            # far behind gets no prepared writes: its tokens go the sink's way (coalesced, server.py).
            emitted = written = self.clock()
            if writes and emitted - end <= COALESCE_NS:
                for write in writes:
                    write()
                written = self.clock()
            else:
                writes = []
            # A step is late when its tokens went out (the last of them was handed to its socket)
            # more than the threshold after the modelled instant. (Tokens emitted more than
            # COALESCE_NS late are written later still, coalesced: their step counts late anyway.)
            if self._complete(plan, end, emitted_ns=emitted) > len(writes) or not writes:
                written = self.clock()  # a sink may have written in the bookkeeping
            late = written - end
            self._last_late_ns = late
            self._c["steps"] += 1
            if late > self._max_late_ns:
                self._max_late_ns = late
            if late > self.late_threshold_ns:
                self._c["late"] += 1
            # The writes just woke the streams' readers. One that shares this core (a client not
            # pinned elsewhere) was queued behind this loop; let it run now rather than after the
            # next step is planned: it halves the client-side delay of loopback tokens (p99).
            _sched_yield()
            self._next_end, self._gap_used = None, 0
            self._stepped.set()  # front-end work held back for headroom: the next gap starts now
            self._stepped.clear()
            _collect_young()

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

    def _prepare(self, plan: _Plan) -> list[Callable[[], None]]:
        """The writes of the tokens this step will emit, made ready before its end by the requests'
        ``prepare`` (the server's direct streams), to be called first thing at the end."""
        writes = []
        for s in plan.items:
            r = s.req
            prepare = r.prepare
            if (prepare is not None and not s.done and r.max_tokens > 0
                    and s.computed + s.step_tokens == s.prompt_len + r.emitted):
                write = prepare()
                if write is not None:
                    writes.append(write)
        return writes

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


def offline_throughput(gpu: GpuProfile | str, model: ModelProfile | str, input_tokens: int,
                       output_tokens: int, num_requests: int, **options: Any) -> dict[str, float]:
    """Simulate an offline benchmark (all requests queued at t=0, like ``trtllm-bench
    throughput``) in virtual time; return output tok/s (total and per GPU), mean TTFT/ITL."""
    options.setdefault("prefix_cache", False)  # benchmark prompts are random tokens
    sim = RooflineModel(gpu, model, **options)
    reqs = [SimRequest(str(i), [i] * input_tokens, output_tokens, 0) for i in range(num_requests)]
    for r in reqs:
        sim.submit(r)
    end = sim.simulate()
    out = sum(r.emitted for r in reqs)
    itl = [(r.emit_ns[-1] - r.emit_ns[0]) / (r.emitted - 1) for r in reqs if r.emitted > 1]
    return {
        "output_tokens_per_s": out / (end / 1e9),
        "output_tokens_per_s_per_gpu": out / (end / 1e9) / sim.tp,
        "mean_ttft_s": sum(r.emit_ns[0] for r in reqs) / len(reqs) / 1e9,
        "mean_itl_s": sum(itl) / len(itl) / 1e9 if itl else 0.0,
    }
