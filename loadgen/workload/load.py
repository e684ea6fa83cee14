"""Loading a workload: a YAML spec (a built-in name such as ``chat``, or a path) into a ``Workload``.

``load_workload`` validates all of the spec before any traffic and returns one of
``ChatWorkload``, ``RagWorkload``, ``AgenticWorkload`` (``synthetic``) or a trace
replay (``traces/``). Randomness comes only from ``rng(seed, tag, *key)``
(``text``), a fresh Generator per (stream, session, turn), so no draw in one
session can shift another's, and a tokenizer that needs extra draws to hit a
length exactly changes only the text it builds, never the lengths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.errors import ConfigError, LoadgenError, SpecError
from loadgen.specfile import Fields, apply_overrides, builtin_dir, load_yaml
from loadgen.workload.base import Workload
from loadgen.workload.text import TextSource
from loadgen.workload.tokenizer import Tokenizer, get_tokenizer

__all__ = ["load_workload", "builtin_specs", "find_spec", "KINDS"]


# -- loading -----------------------------------------------------------------------


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


KINDS = ("chat", "rag", "agentic", "trace")

# ``loadgen run --input-tokens/--output-tokens`` with a spec: fixed lengths.
_ALIASES = {
    "input_tokens": {"chat": "input"},
    "output_tokens": {"chat": "output", "rag": "output", "agentic": "output", "trace": "output_tokens"},
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
    if kind == "trace":
        from loadgen.workload.traces.replay import build_trace

        w = build_trace(f, common)
    else:
        from loadgen.workload.synthetic import build_synthetic

        w = build_synthetic(kind, f, common)
    f.finish()
    return w


def _text_source(f: Fields, seed: int, salt: str, tokenizer: Tokenizer | str | None) -> TextSource:
    t = f.sub("tokens", None)
    ratio, tok_path = 1.0, None
    if t is not None:
        tok_spec = t.string("tokenizer", "builtin")
        tok_path = None if tok_spec == "builtin" else t.path("tokenizer")
        ratio = t.number("ratio", 1.0, gt=0)
        t.finish()
    if tokenizer is None:
        try:
            tokenizer = get_tokenizer(tok_path)
        except LoadgenError as e:  # a bad tokenizer file: name the spec field too
            raise t.error("tokenizer", str(e)) from None  # type: ignore[union-attr]
    else:
        tokenizer = get_tokenizer(tokenizer)
    return TextSource(tokenizer=tokenizer, ratio=float(ratio), seed=seed, salt=salt)
