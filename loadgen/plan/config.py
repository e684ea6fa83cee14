"""The deployments a plan compares: GPU, model, dtypes, TP, replicas, batch limits, P/D split, speculation.

A ``Deployment`` is ``replicas`` identical serving units. A unit is one engine of ``tp`` GPUs
(aggregated), or ``prefills`` prefill engines of ``prefill_tp`` GPUs and ``decodes`` decode engines
of ``tp`` GPUs joined by a KV link (disaggregated). The planner simulates one unit at its share of
the load (requests spread evenly, sessions kept on one unit) and multiplies by ``replicas``.

Given as YAML (``configs:``, a list of mappings, with optional top-level defaults such as
``model:``) or as flags (``--config gpu=h100,tp=4,dtype=fp8,replicas=2``): the same keys either way,
in ``KEYS``. Every value is checked, and the engine built once, before any point is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from loadgen.errors import ConfigError, LoadgenError
from loadgen.sim.disaggregated import DisaggregatedModel
from loadgen.sim.profiles import gpu as load_gpu
from loadgen.sim.profiles import model as load_model
from loadgen.sim.roofline import RooflineModel
from loadgen.specfile import Fields, LineDict, load_yaml

__all__ = ["Deployment", "KEYS", "parse_config_flag", "load_configs"]

# key in a file or flag -> (Deployment field, type)
KEYS: dict[str, tuple[str, type]] = {
    "name": ("name", str),
    "gpu": ("gpu", str),
    "model": ("model", str),
    "dtype": ("weight_dtype", str),
    "kv": ("kv_dtype", str),
    "tp": ("tp", int),
    "replicas": ("replicas", int),
    "max_batch": ("max_num_seqs", int),
    "max_batch_tokens": ("max_batch_tokens", int),
    "prefill_tp": ("prefill_tp", int),
    "prefills": ("prefills", int),
    "decodes": ("decodes", int),
    "kv_gb_s": ("kv_transfer_gb_s", float),
    "spec_tokens": ("spec_tokens", int),
    "spec_accept": ("spec_acceptance", float),
    "spec_cost": ("spec_draft_cost", float),
    "admission": ("admission", str),
    "block_size": ("block_size", int),
}


@dataclass(frozen=True)
class Deployment:
    """One configuration to plan (module doc)."""

    gpu: str
    model: str
    tp: int = 1
    replicas: int = 1
    weight_dtype: str = ""  # "" : the model's own
    kv_dtype: str = ""  # "": fp8 with fp8/fp4 weights, else bf16
    max_num_seqs: int = 256
    max_batch_tokens: int = 8192
    prefills: int = 0  # 0: aggregated
    prefill_tp: int = 0  # 0: the same as tp
    decodes: int = 1
    kv_transfer_gb_s: float = 50.0  # per prefill GPU (a 400 Gb/s NIC)
    spec_tokens: int = 0
    spec_acceptance: float = 0.7
    spec_draft_cost: float = 0.05
    admission: str = "vllm"
    # KV block size: coarser than vLLM's 16 (TensorRT-LLM uses 32-64), because the prefix cache's
    # bookkeeping costs O(blocks) per request and long agentic contexts have thousands of them
    block_size: int = 64
    name: str = ""

    def __post_init__(self) -> None:
        for k in ("tp", "replicas", "max_num_seqs", "max_batch_tokens", "decodes"):
            if getattr(self, k) < 1:
                raise ConfigError(f"config {self.label}: {k} must be >= 1")
        if self.prefills < 0 or self.prefill_tp < 0 or self.spec_tokens < 0:
            raise ConfigError(f"config {self.label}: prefills, prefill_tp and spec_tokens must be >= 0")

    @property
    def disaggregated(self) -> bool:
        return self.prefills > 0

    @property
    def dtype(self) -> str:
        return self.weight_dtype or load_model(self.model).weight_dtype

    @property
    def kv(self) -> str:
        return self.kv_dtype or ("fp8" if self.dtype in ("fp8", "fp4") else "bf16")

    @property
    def unit_gpus(self) -> int:
        if not self.disaggregated:
            return self.tp
        return self.prefills * (self.prefill_tp or self.tp) + self.decodes * self.tp

    @property
    def gpus(self) -> int:
        return self.unit_gpus * self.replicas

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        spec = f" spec{self.spec_tokens}" if self.spec_tokens else ""
        if self.disaggregated:
            shape = f"{self.prefills}P(tp{self.prefill_tp or self.tp})+{self.decodes}D(tp{self.tp})"
        else:
            shape = f"tp{self.tp}"
        reps = f" x{self.replicas}" if self.replicas > 1 else ""
        return f"{self.gpu} {shape} {self.dtype}{spec}{reps}"

    def engine_options(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "weight_dtype": self.dtype,
            "kv_dtype": self.kv,
            "max_num_seqs": self.max_num_seqs,
            "max_batch_tokens": self.max_batch_tokens,
            "admission": self.admission,
            "block_size": self.block_size,
            "spec_tokens": self.spec_tokens,
            "spec_acceptance": self.spec_acceptance,
            "spec_draft_cost": self.spec_draft_cost,
        }

    def engine(self) -> RooflineModel:
        """A fresh engine for one unit (a virtual run consumes its engine)."""
        opts = self.engine_options()
        if not self.disaggregated:
            return RooflineModel(self.gpu, self.model, **opts)
        pre = {**opts, "tp": self.prefill_tp or self.tp, "spec_tokens": 0}
        return DisaggregatedModel(
            self.gpu,
            self.model,
            prefill=pre,
            decode=opts,
            prefills=self.prefills,
            decodes=self.decodes,
            kv_transfer_gb_s=self.kv_transfer_gb_s,
        )

    def check(self) -> None:
        """Build the engine once: a config that cannot run (weights do not fit, TP does not divide
        the heads, an unknown GPU) fails here, before the plan simulates anything."""
        try:
            load_gpu(self.gpu)
            self.engine()
        except LoadgenError as e:
            raise ConfigError(f"config {self.label}: {e}") from None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(label=self.label, weight_dtype=self.dtype, kv_dtype=self.kv, gpus=self.gpus)
        out["disaggregated"] = self.disaggregated
        return out


def _build(values: dict[str, Any], where: str) -> Deployment:
    kw: dict[str, Any] = {}
    for key, raw in values.items():
        k = key.replace("-", "_")
        if k not in KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(KEYS)})")
        attr, typ = KEYS[k]
        try:
            v = typ(raw)
            if typ is int and float(raw) != v:
                raise ValueError
        except (TypeError, ValueError):
            what = "a whole number" if typ is int else "a number" if typ is float else "text"
            raise ConfigError(f"{where}: {key}={raw!r} is not {what}") from None
        kw[attr] = v.lower() if attr in ("gpu", "weight_dtype", "kv_dtype", "admission") else v
    for need in ("gpu", "model"):
        if need not in kw:
            raise ConfigError(f"{where}: {need} is required")
    return Deployment(**kw)


def parse_config_flag(text: str, model: str | None = None) -> Deployment:
    """``gpu=h100,tp=4,dtype=fp8`` (``model`` from ``--model`` where the flag has none)."""
    values: dict[str, Any] = {"model": model} if model else {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"--config {text!r}: expected KEY=VALUE pairs separated by commas, got {part!r}")
        values[k.strip()] = v.strip()
    return _build(values, f"--config {text!r}")


def load_configs(path: Path, model: str | None = None) -> list[Deployment]:
    """The ``configs:`` list of a YAML file; top-level keys are defaults for every entry."""
    doc = load_yaml(path)
    f = Fields(doc, str(path), path.parent)
    items = f.raw("configs")
    if not isinstance(items, list) or not items:
        raise f.error("configs", "must be a non-empty list of configurations")
    defaults = {k: doc[k] for k in doc if k != "configs"}
    if model and "model" not in defaults:
        defaults["model"] = model
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, LineDict):
            raise f.error("configs", f"entry {i + 1} must be a mapping")
        out.append(_build({**defaults, **item}, f"{path}:{item.line}: configs[{i}]"))
    return out


def with_replicas(d: Deployment, replicas: int) -> Deployment:
    return replace(d, replicas=replicas)
