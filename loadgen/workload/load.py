"""Loading a workload: a YAML spec (a built-in name such as ``chat``, or a path) into a ``Workload``.

``load_workload`` validates all of the spec before any traffic, so a typo or a
bad trace row fails in one line naming file, line and field instead of minutes
into a run, and returns one of ``ChatWorkload``, ``RagWorkload``
(``workload.synthetic``), ``RagPipelineWorkload`` (``workload.rag_pipeline``),
``AgenticWorkload`` (``workload.agentic``, its tools validated by ``workload.tools``) or a trace replay
(``workload.traces.build``). The tokenizer and the ``tokens.ratio`` calibration
become the workload's ``TextSource`` here, once, so every kind builds text the
same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.errors import ConfigError, LoadgenError, SpecError
from loadgen.specfile import Fields, apply_overrides, builtin_dir, load_yaml
from loadgen.workload.agentic import build_agentic
from loadgen.workload.base import Workload
from loadgen.workload.pooled import POOLED_APIS, build_pooled
from loadgen.workload.rag_pipeline import build_rag_pipeline
from loadgen.workload.synthetic import build_synthetic
from loadgen.workload.text import TextSource
from loadgen.workload.tokenizer import BUILTIN, Tokenizer, get_tokenizer
from loadgen.workload.traces.build import build_trace

__all__ = ["load_workload", "builtin_specs", "find_spec", "KINDS"]


def builtin_specs() -> dict[str, Path]:
    """Built-in spec names and their files (the packaged ones, or the checkout's)."""
    return {p.stem: p for p in sorted(builtin_dir("workloads").glob("*.yaml"))}


def find_spec(name_or_path: str) -> Path:
    """A spec file from a built-in name or a path."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    specs = builtin_specs()
    if name_or_path in specs:
        return specs[name_or_path]
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        raise SpecError(f"{name_or_path}: no such workload file")
    raise SpecError(f"{name_or_path}: no such workload (built-in: {', '.join(specs) or 'none'})")


KINDS = ("chat", "rag", "rag-pipeline", "agentic", "trace", *POOLED_APIS)

# ``loadgen run --input-tokens/--output-tokens`` with a spec: fixed lengths.
_ALIASES = {
    "input_tokens": {"chat": "input", "embeddings": "input", "rerank": "input"},
    "output_tokens": {
        "chat": "output",
        "rag": "output",
        "rag-pipeline": "output",
        "agentic": "output",
        "trace": "output_tokens",
    },
}


def _resolve_aliases(kind: str, overrides: dict[str, Any], file: str) -> dict[str, Any]:
    out = {}
    for k, v in overrides.items():
        if k in _ALIASES:
            target = _ALIASES[k].get(kind)
            if target is None:
                raise SpecError(f"{file}: override {k}: does not apply to a {kind} workload")
            out[target] = v
        else:
            out[k] = v
    return out


def load_workload(
    name_or_path: str,
    *,
    seed: int = 0,
    salt: str = "",
    tokenizer: Tokenizer | str | None = None,
    overrides: dict[str, Any] | None = None,
) -> Workload:
    """Read, validate and build a workload; any error is a ``SpecError`` naming
    file:line: field, raised before any traffic.

    ``overrides`` sets spec fields by dotted key (``{"input.mean": 300}``,
    ``{"turns": 4}``, ``{"tokens.ratio": 1.1}``, ``{"path": "my.jsonl"}``) or
    nested dicts; ``input_tokens``/``output_tokens`` fix those lengths. A
    ``tokenizer`` (object or HF tokenizer.json path) wins over the spec's.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ConfigError(f"--seed {seed!r}: must be a whole number from 0 to 2**64-1")
    path = find_spec(name_or_path)
    file = str(path)
    doc = load_yaml(path)
    kind = doc.get("kind")
    if overrides:
        # an unknown kind is reported as such below, before any alias could be
        ovr = _resolve_aliases(kind, dict(overrides), file) if kind in KINDS else dict(overrides)
        apply_overrides(doc, ovr, file)
    f = Fields(doc, file, base=path.parent)
    kind = f.string("kind", choices=KINDS)
    name = f.string("name", path.stem)
    f.string("description", "")
    text = _text_source(f, seed, salt, tokenizer)
    common = {"name": name, "seed": seed, "text": text, "source": file}
    w: Workload
    if kind == "trace":
        w = build_trace(f, common)
    elif kind == "agentic":
        w = build_agentic(f, common)
    elif kind in POOLED_APIS:
        w = build_pooled(kind, f, common)
    elif kind == "rag-pipeline":
        w = build_rag_pipeline(f, common)
    else:
        w = build_synthetic(kind, f, common)
    f.finish()
    return w


def _text_source(f: Fields, seed: int, salt: str, tokenizer: Tokenizer | str | None) -> TextSource:
    """The spec's ``tokens:`` (tokenizer, ratio); a ``tokenizer`` argument wins over the spec's."""
    t: Fields | None = f.sub("tokens", None)
    ratio = 1.0
    tok_path: Path | None = None
    if t is not None:
        tok_path = None if t.string("tokenizer", "builtin") == "builtin" else t.path("tokenizer")
        ratio = float(t.number("ratio", 1.0, gt=0))
        t.finish()
    chosen: Tokenizer = BUILTIN
    if tokenizer is not None:
        chosen = get_tokenizer(tokenizer)
    elif t is not None and tok_path is not None:
        try:
            chosen = get_tokenizer(tok_path)
        except LoadgenError as e:  # a bad tokenizer file: name the spec field too
            raise t.error("tokenizer", str(e)) from None
    return TextSource(tokenizer=chosen, ratio=ratio, seed=seed, salt=salt)
