"""Hardware and model profiles for the roofline simulator, loaded from YAML data.

Each GPU and each model is one YAML file under ``loadgen/sim/profiles/`` (shipped in the
wheel), with a ``sources:`` list naming the datasheet or paper behind every figure, so a
reader can check a number without reading code and a user can add a GPU without a release.
``gpu("h100")`` / ``model("llama-3.1-8b")`` load by name or alias; a path ending in
``.yaml`` loads a user's own file. Bad data fails at load time with the file and field.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from loadgen.errors import SpecError

__all__ = [
    "WEIGHT_DTYPES",
    "KV_DTYPES",
    "DTYPE_BYTES",
    "ProfileError",
    "GpuProfile",
    "MoE",
    "MLA",
    "SlidingWindow",
    "ModelProfile",
    "gpu",
    "model",
    "list_gpus",
    "list_models",
]

WEIGHT_DTYPES = ("bf16", "fp8", "fp4")
KV_DTYPES = ("bf16", "fp8")
# Bytes per element as stored. fp4 counts its block scales: NVFP4 keeps one 8-bit scale
# per 16 values (4.5 bits); MXFP4 one per 32 (4.25 bits); we use the larger.
DTYPE_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}


class ProfileError(SpecError):
    """A profile name that does not exist, or a profile file with a bad field."""


@dataclass(frozen=True)
class GpuProfile:
    """One accelerator: dense peak FLOP/s per dtype, HBM, and the TP interconnect.

    Figures are vendor datasheet peaks without sparsity. ``interconnect_gb_s`` is the
    per-GPU bandwidth in ONE direction (a ring all-reduce sends and receives at once).
    ``allreduce_latency_us`` is a fixed cost per collective (kernel launch + sync), an
    estimate rather than a datasheet number.
    """

    name: str
    display_name: str
    hbm_gib: float
    hbm_tb_s: float
    bf16_tflops: float
    fp8_tflops: float | None
    fp4_tflops: float | None
    interconnect_gb_s: float
    allreduce_latency_us: float
    tdp_w: float | None = None  # board power at full load (the vendor's maximum), for tokens per MW
    status: str = "shipping"  # "announced": figures the vendor has announced, not yet a datasheet's
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s for matmuls with ``dtype`` weights.

        Without native tensor-core support for the dtype (fp4 on Hopper, fp8 on Ampere),
        engines run weight-only quantized kernels (Marlin, Triton MXFP4) that dequantize
        to BF16 and multiply at the BF16 rate; the weights still move at their own size.
        """
        tf = getattr(self, f"{dtype}_tflops")
        return (tf or self.bf16_tflops) * 1e12


@dataclass(frozen=True)
class MoE:
    """Routed mixture of experts: ``experts`` per layer, ``experts_per_token`` chosen."""

    experts: int
    experts_per_token: int


@dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention: the KV cache holds one compressed latent.

    Per token and layer the cache stores ``kv_lora_rank + qk_rope_head_dim`` values
    (the latent plus the decoupled RoPE key), shared by all heads.
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class SlidingWindow:
    """``layers`` of the model attend only to the last ``window`` tokens."""

    window: int
    layers: int


@dataclass(frozen=True)
class ModelProfile:
    """A transformer's shape: enough to count FLOPs, weight bytes and KV bytes per token."""

    name: str
    display_name: str
    params_total_b: float
    params_active_b: float
    layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    weight_dtype: str
    moe: MoE | None = None
    mla: MLA | None = None
    sliding_window: SlidingWindow | None = None
    # Parameters a decode token goes through, where they differ from a prefill token's
    # (``params_active_b``): an MoE that routes decode tokens to more experts than prefill ones.
    params_active_decode_b: float | None = None
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def active_decode_b(self) -> float:
        """Active parameters (billions) of a decode token."""
        return self.params_active_b if self.params_active_decode_b is None else self.params_active_decode_b

    @property
    def experts_per_token_decode(self) -> float:
        """Routed experts a decode token reads (may be fractional: an average over layers)."""
        if self.moe is None:
            return 0.0
        extra = (self.active_decode_b - self.params_active_b) * 1e9 / self.expert_params
        return self.moe.experts_per_token + extra

    @property
    def expert_params(self) -> float:
        """Parameters of ONE routed expert summed over all MoE layers (0 if dense).

        From total = dense + E*p and active = dense + k*p: p = (total-active)/(E-k).
        """
        if self.moe is None:
            return 0.0
        e, k = self.moe.experts, self.moe.experts_per_token
        return (self.params_total_b - self.params_active_b) * 1e9 / (e - k)

    @property
    def dense_params(self) -> float:
        """Parameters every token touches: attention, embeddings, shared experts, norms."""
        k = self.moe.experts_per_token if self.moe else 0
        return self.params_active_b * 1e9 - k * self.expert_params


_GPU_REQUIRED = (
    "name",
    "display_name",
    "hbm_gib",
    "hbm_tb_s",
    "bf16_tflops",
    "interconnect_gb_s",
    "allreduce_latency_us",
    "sources",
)
_MODEL_REQUIRED = (
    "name",
    "display_name",
    "params_total_b",
    "params_active_b",
    "layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "max_context",
    "weight_dtype",
    "sources",
)


def _root() -> Any:
    return importlib.resources.files("loadgen.sim").joinpath("profiles")


def _fail(where: str, field: str, why: str) -> ProfileError:
    return ProfileError(f"{where}: field '{field}': {why}")


def _number(
    where: str, data: dict[str, Any], key: str, *, integer: bool = False, optional: bool = False, parent: str = ""
) -> Any:
    v = data.get(key)
    key = parent + key
    if v is None:
        if optional:
            return None
        raise _fail(where, key, "missing")
    bad_type = isinstance(v, bool) or not isinstance(v, int if integer else (int, float))
    if bad_type:
        raise _fail(where, key, f"expected {'an integer' if integer else 'a number'}, got {v!r}")
    if v <= 0:
        raise _fail(where, key, f"must be > 0, got {v!r}")
    return v


def _strings(where: str, data: dict[str, Any], key: str) -> tuple[str, ...]:
    v = data.get(key, [])
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise _fail(where, key, "expected a list of strings")
    return tuple(v)


def _sub(where: str, data: dict[str, Any], key: str, cls: type, fields: tuple[str, ...]) -> Any:
    v = data.get(key)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise _fail(where, key, "expected a mapping")
    extra = set(v) - set(fields)
    if extra:
        bad = f"{key}.{sorted(extra)[0]}"
        raise _fail(where, bad, f"unknown field (valid: {', '.join(fields)})")
    return cls(**{f: _number(where, v, f, integer=True, parent=f"{key}.") for f in fields})


def _check_keys(where: str, data: Any, cls: type) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a YAML mapping at top level")
    valid = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in valid:
            raise _fail(where, str(k), f"unknown field (valid: {', '.join(valid)})")
    return data


def parse_gpu(data: Any, where: str) -> GpuProfile:
    """Validate one GPU mapping (as read from YAML) into a ``GpuProfile``."""
    d = _check_keys(where, data, GpuProfile)
    for k in _GPU_REQUIRED:
        if k not in d:
            raise _fail(where, k, "missing")
    return GpuProfile(
        name=str(d["name"]),
        display_name=str(d["display_name"]),
        hbm_gib=_number(where, d, "hbm_gib"),
        hbm_tb_s=_number(where, d, "hbm_tb_s"),
        bf16_tflops=_number(where, d, "bf16_tflops"),
        fp8_tflops=_number(where, d, "fp8_tflops", optional=True),
        fp4_tflops=_number(where, d, "fp4_tflops", optional=True),
        interconnect_gb_s=_number(where, d, "interconnect_gb_s"),
        allreduce_latency_us=_number(where, d, "allreduce_latency_us"),
        tdp_w=_number(where, d, "tdp_w", optional=True),
        status=_status(where, d),
        aliases=_strings(where, d, "aliases"),
        sources=_strings(where, d, "sources"),
    )


def _status(where: str, d: dict[str, Any]) -> str:
    v = d.get("status", "shipping")
    if v not in ("shipping", "announced"):
        raise _fail(where, "status", f"{v!r} not one of shipping, announced")
    return str(v)


def _decode_active(where: str, d: dict[str, Any], total: float, active: float, moe: MoE | None) -> float | None:
    dec = _number(where, d, "params_active_decode_b", optional=True)
    if dec is None:
        return None
    if moe is None:
        raise _fail(where, "params_active_decode_b", "only an MoE model routes decode tokens differently")
    if dec > total:
        raise _fail(where, "params_active_decode_b", f"{dec} exceeds params_total_b {total}")
    expert = (total - active) / (moe.experts - moe.experts_per_token)
    k_dec = moe.experts_per_token + (dec - active) / expert
    if not 0 < k_dec <= moe.experts:
        raise _fail(where, "params_active_decode_b", f"implies {k_dec:.2f} experts per decode token of {moe.experts}")
    return float(dec)


def parse_model(data: Any, where: str) -> ModelProfile:
    """Validate one model mapping (as read from YAML) into a ``ModelProfile``."""
    d = _check_keys(where, data, ModelProfile)
    for k in _MODEL_REQUIRED:
        if k not in d:
            raise _fail(where, k, "missing")
    ints = {
        k: _number(where, d, k, integer=True)
        for k in ("layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size", "max_context")
    }
    total, active = _number(where, d, "params_total_b"), _number(where, d, "params_active_b")
    if active > total:
        raise _fail(where, "params_active_b", f"{active} exceeds params_total_b {total}")
    if d["weight_dtype"] not in WEIGHT_DTYPES:
        raise _fail(where, "weight_dtype", f"{d['weight_dtype']!r} not one of {WEIGHT_DTYPES}")
    moe = _sub(where, d, "moe", MoE, ("experts", "experts_per_token"))
    if moe is not None and not moe.experts_per_token < moe.experts:
        raise _fail(where, "moe.experts_per_token", "must be less than moe.experts")
    if (moe is None) != (active == total):
        raise _fail(where, "params_active_b", "must equal params_total_b exactly when no moe")
    mla = _sub(where, d, "mla", MLA, ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    sw = _sub(where, d, "sliding_window", SlidingWindow, ("window", "layers"))
    if sw is not None and sw.layers >= ints["layers"]:
        raise _fail(where, "sliding_window.layers", "must be less than layers")
    return ModelProfile(
        name=str(d["name"]),
        display_name=str(d["display_name"]),
        params_total_b=total,
        params_active_b=active,
        weight_dtype=d["weight_dtype"],
        moe=moe,
        mla=mla,
        sliding_window=sw,
        params_active_decode_b=_decode_active(where, d, total, active, moe),
        aliases=_strings(where, d, "aliases"),
        sources=_strings(where, d, "sources"),
        **ints,
    )


def _load_dir(kind: str) -> dict[str, tuple[str, Any]]:
    """name -> (file label, raw mapping) for every YAML file of one kind."""
    out: dict[str, tuple[str, Any]] = {}
    for entry in sorted(_root().joinpath(kind).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            label = f"profiles/{kind}/{entry.name}"
            out[entry.name[: -len(".yaml")]] = (label, yaml.safe_load(entry.read_text()))
    return out


_P = TypeVar("_P", GpuProfile, ModelProfile)


def _resolve(kind: str, name: str, parse: Callable[[Any, str], _P]) -> _P:
    """The profile ``name`` of one kind (``gpus`` or ``models``): a YAML path, a file stem or an alias."""
    if name.endswith((".yaml", ".yml")):
        path = Path(name)
        try:
            text = path.read_text()
        except OSError as e:
            raise ProfileError(f"{name}: cannot read: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ProfileError(f"{name}: not UTF-8 text") from None
        return parse(yaml.safe_load(text), str(path))
    want = name.strip().lower()
    files = _load_dir(kind)
    for stem, (label, raw) in files.items():
        aliases = raw.get("aliases", []) if isinstance(raw, dict) else []
        if want == stem or want in [str(a).lower() for a in aliases or []]:
            return parse(raw, label)
    singular = kind[:-1]
    raise ProfileError(f"unknown {singular} {name!r}; valid: {', '.join(files)} (or a path to a .yaml file)")


def gpu(name: str) -> GpuProfile:
    """The GPU profile called ``name`` (file stem or alias, any case), or a YAML path."""
    return _resolve("gpus", name, parse_gpu)


def model(name: str) -> ModelProfile:
    """The model profile called ``name`` (file stem or alias, any case), or a YAML path."""
    return _resolve("models", name, parse_model)


def list_gpus() -> list[str]:
    """Names of the built-in GPU profiles."""
    return list(_load_dir("gpus"))


def list_models() -> list[str]:
    """Names of the built-in model profiles."""
    return list(_load_dir("models"))
