"""What one engine step costs: the roofline of a GPU x model configuration.

The arithmetic stands apart from scheduling and timing so that it can be read, and checked
against docs/simulator.md, on its own. ``StepCost`` validates the configuration, precomputes
per-unit costs (seconds per token, per context token, per expert's weights) and sizes the KV
pool; ``_step_s`` then prices any step as

    max(FLOPs / (peak x MFU), bytes / (HBM bandwidth x MBU), layer floor) + all-reduce + overhead

The layer floor is the least a step can take however small: every layer launches and
synchronises its kernels (``layer_floor_s`` each; an MoE layer's routing, permutation and
grouped GEMMs add ``moe_layer_floor_s``), which is what keeps small-batch decode, and MoE
decode above all, from running faster than engines do.

It holds no queues and reads no clock: ``RooflineModel`` (``roofline.py``) sets the
configuration and the scheduler (``scheduler.py``) asks it what each step it plans costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from loadgen.errors import ConfigError
from loadgen.sim.prefix_cache import PrefixCache
from loadgen.sim.profiles import DTYPE_BYTES, KV_DTYPES, WEIGHT_DTYPES, GpuProfile, ModelProfile

__all__ = ["StepCost", "CapacityError", "Saturation", "ACT_BYTES"]

ACT_BYTES = 2  # activations exchanged by the TP all-reduce are BF16


class CapacityError(ConfigError):
    """The configuration cannot run: weights do not fit, TP does not divide heads, ..."""


@dataclass(frozen=True)
class Saturation:
    """Steady state of a saturated engine for one fixed request shape (an estimate)."""

    concurrency: int  # sequences running at once
    bound: str  # "max_num_seqs" or "kv_cache": which limit sets the concurrency
    itl_s: float  # time between a sequence's tokens
    requests_per_s: float
    output_tokens_per_s: float


class StepCost:
    """The roofline part of ``RooflineModel``: configuration checks, derived capacities and step times."""

    # The configuration, set by ``RooflineModel.__init__`` (the per-unit costs by ``_constants``).
    gpu: GpuProfile
    model: ModelProfile
    weight_dtype: str
    kv_dtype: str
    tp: int
    max_num_seqs: int
    max_batch_tokens: int
    kv_util: float
    mfu: float
    mbu: float
    block_size: int
    step_overhead_s: float
    admission: str  # "vllm" (first chunk's blocks; preempt and recompute) | "reserve" (whole sequence)
    kv_watermark: float  # share of the KV pool admission leaves free
    spec_tokens: int  # speculative decoding: draft tokens verified per decode step (0: off)
    spec_acceptance: float  # each draft token's chance to be accepted (given the ones before it were)
    spec_draft_cost: float  # one draft pass, as a share of a plain decode step of the batch
    layer_floor_s: float  # per layer and step: kernel launches and synchronisation
    moe_layer_floor_s: float  # more per MoE layer: routing, token permutation, grouped GEMM launches
    prefix_caching: bool
    pool: PrefixCache  # the KV block pool, of ``_fit_blocks()`` blocks
    max_model_len: int

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
        if self.layer_floor_s < 0 or self.moe_layer_floor_s < 0:
            raise CapacityError("layer_floor_s and moe_layer_floor_s must be >= 0")
        if self.admission not in ("vllm", "reserve"):
            raise CapacityError(f"admission {self.admission!r}: use vllm or reserve")
        if self.spec_tokens < 0 or not 0 <= self.spec_acceptance <= 1 or self.spec_draft_cost < 0:
            raise CapacityError("spec_tokens >= 0, spec_acceptance in [0, 1], spec_draft_cost >= 0")
        if not 0 <= self.kv_watermark < 1:
            raise CapacityError(f"kv_watermark must be in [0, 1), got {self.kv_watermark}")

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
        self._lin = (
            2 * m.params_active_b * 1e9 / tp / peak_w + 4 * m.num_heads * m.head_dim * swl * window / tp / peak_a
        )
        # a decode token may go through other weights than a prefill token (params_active_decode_b)
        self._lin_dec_extra = 2 * (m.active_decode_b - m.params_active_b) * 1e9 / tp / peak_w
        self._att_dec = att_dec * full / tp / peak_a
        self._att_pre = att_pre * full / tp / peak_a
        self._kv = self.kv_bytes_per_token / bw
        self._swa_mem = self._swa_bytes_per_token * window / bw
        self._w_dense = m.dense_params * wb / tp / bw
        self._w_exp = m.expert_params * wb / tp / bw
        self._experts = m.moe.experts if m.moe else 0
        self._miss = 1 - m.moe.experts_per_token / m.moe.experts if m.moe else 1.0
        self._miss_dec = 1 - m.experts_per_token_decode / m.moe.experts if m.moe else 1.0
        self._floor = m.layers * (self.layer_floor_s + (self.moe_layer_floor_s if m.moe else 0.0))
        collectives = 2 * m.layers if tp > 1 else 0  # after attention and after the MLP
        self._comm0 = collectives * g.allreduce_latency_us * 1e-6
        self._comm1 = collectives * 2 * (tp - 1) / tp * m.hidden_size * ACT_BYTES / (g.interconnect_gb_s * 1e9)

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
            while tp <= 64 and (self.weight_bytes_per_gpu * self.tp / tp > usable * 0.95 or self.model.num_heads % tp):
                tp *= 2
            raise CapacityError(
                f"{self.model.name} ({self.weight_dtype}, "
                f"{self.weight_bytes_per_gpu * self.tp / 1e9:.1f} GB of weights) "
                f"does not fit on tp={self.tp} x {self.gpu.name} "
                f"({usable / 1e9:.1f} GB usable at kv_util {self.kv_util}): needs tp >= {tp}"
            )
        return int(free // per_block)

    # ---- the roofline -------------------------------------------------------------------
    def _step_s(self, tokens: int, dec_ctx: int, pre_attn: int, kv_tokens: int, dec_tokens: int = 0) -> float:
        """One step's seconds.

        tokens: tokens computed (decodes + prefill chunks); dec_ctx: sum over decode
        tokens of the context they attend to; pre_attn: the same sum for prefill tokens;
        kv_tokens: KV-cache tokens read or written (full-attention layers); dec_tokens: how
        many of ``tokens`` are decodes (they matter only where decode's active parameters differ).
        """
        compute = tokens * self._lin + dec_tokens * self._lin_dec_extra + dec_ctx * self._att_dec
        compute += pre_attn * self._att_pre
        weights = self._w_dense
        if self._experts:  # expected distinct experts hit by `tokens` uniform top-k picks
            miss = self._miss ** (tokens - dec_tokens) * self._miss_dec**dec_tokens
            weights += self._w_exp * self._experts * (1.0 - miss)
        memory = weights + kv_tokens * self._kv + tokens * self._swa_mem
        roof = compute if compute > memory else memory
        if roof < self._floor:
            roof = self._floor
        return roof + self._comm0 + tokens * self._comm1 + self.step_overhead_s

    def step_time_s(self, decode_contexts: list[int], prefill_tokens: int = 0, prefill_context: int = 0) -> float:
        """Seconds for one step: decodes at these contexts (tokens already cached) plus one
        prefill chunk of ``prefill_tokens`` following ``prefill_context`` cached tokens."""
        n, c = prefill_tokens, prefill_context
        dec = sum(decode_contexts) + len(decode_contexts)
        b = len(decode_contexts)
        return self._step_s(b + n, dec, n * c + n * (n + 1) // 2, dec + (c + n if n else 0), b)

    def decode_step_s(self, batch: int, context: int) -> float:
        """Seconds for a step of ``batch`` decodes, each after ``context`` cached tokens."""
        ctx = batch * (context + 1)
        return self._step_s(batch, ctx, 0, ctx, batch)

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
            extra += self._step_s(b + n, dec, n * c + n * (n + 1) // 2, dec + c + n, b) - t_dec
            c, left = c + n, left - n
        out = max(1, output_tokens)
        cycle = out * t_dec + b * extra
        return Saturation(b, bound, cycle / out, b / cycle, b * out / cycle)

    def describe(self) -> dict[str, Any]:
        """The configuration and derived capacities, for logs, /v1/models and report headers."""
        return {
            "gpu": self.gpu.name,
            "model": self.model.name,
            "tp": self.tp,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype,
            "weights_gb_per_gpu": round(self.weight_bytes_per_gpu / 1e9, 2),
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token,
            "kv_capacity_tokens": self.kv_capacity_tokens(),
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_batch_tokens": self.max_batch_tokens,
            "mfu": self.mfu,
            "mbu": self.mbu,
            "step_overhead_s": self.step_overhead_s,
            "layer_floor_s": self.layer_floor_s,
            "admission": self.admission,
            "spec_tokens": self.spec_tokens,
            "spec_acceptance": self.spec_acceptance,
            "moe_layer_floor_s": self.moe_layer_floor_s,
            "prefix_cache": self.prefix_caching,
            "block_size": self.block_size,
        }
