"""Workloads: what traffic looks like, as a pure function of (spec, seed, index).

A ``Workload`` hands the engine ``Session``s by index, so session i is the same
bytes on any machine and in any worker process, and nothing is materialised
ahead of need beyond what the run asks for.

``load_workload`` reads a YAML spec (a built-in name such as ``chat`` or a path),
validates all of it before any traffic, and returns one of: ``ChatWorkload``,
``RagWorkload``, ``AgenticWorkload`` (``loadgen/synthetic.py``) or a trace replay
(``loadgen/traces.py``; ShareGPT in ``sharegpt.py``, agent sessions in
``agent_trace.py``). Randomness comes only from ``rng(seed, tag, *key)``, a
fresh Generator per (stream, session, turn), so no draw in one session can shift
another's, and a tokenizer that needs extra draws to hit a length exactly changes
only the text it builds, never the lengths. ``rng``, ``TextSource`` and the
other text pieces are ``prompt_text``'s, importable from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from loadgen.errors import ConfigError, LoadgenError, SpecError
from loadgen.specfile import Fields, apply_overrides, builtin_dir, load_yaml
from loadgen.workload.session import Session, Turn
from loadgen.workload.text import PREFIX_TOKENS, Memo, TextSource, rng, str_key
from loadgen.workload.tokenizer import BUILTIN, WORDS, Tokenizer, get_tokenizer

__all__ = [
    "Workload",
    "SyntheticChat",
    "TextSource",
    "load_workload",
    "builtin_specs",
    "find_spec",
    "rng",
    "PREFIX_TOKENS",
    "Memo",
    "str_key",
]


class Workload(Protocol):
    name: str

    @property
    def size(self) -> int | None:
        """Distinct sessions (a finite trace), or None when unbounded. Indices past
        it wrap around, each later pass under its own prefix (no false cache hits)."""

    def session(self, i: int) -> Session:
        """Session ``i``: a pure function of the workload spec, its seed and ``i``."""

    def offsets_ns(self) -> np.ndarray | None:
        """Arrival offsets carried by the workload itself (trace replay), else None."""

    def describe(self) -> dict[str, Any]:
        """Resolved spec, for run.json and previews."""


@dataclass(frozen=True)
class SyntheticChat:
    """Single-turn chat with fixed prompt and answer lengths (``loadgen run`` flags).

    ``salt`` prefixes every prompt with a run- or point-specific word so prefix
    caches start cold for each load point.
    """

    input_tokens: int = 128
    output_tokens: int = 128
    seed: int = 0
    salt: str = ""
    name: str = "synthetic-chat"

    @property
    def size(self) -> int | None:
        return None

    def session(self, i: int) -> Session:
        n = self.input_tokens
        salt = f" {self.salt}_{i}" if self.salt else ""  # one token
        body = BUILTIN.decode_words(_window(self.seed, i, max(n - (1 if salt else 0), 0)))
        return Session(
            session=i,
            turns=(Turn(text=salt + body, max_tokens=self.output_tokens, prompt_tokens=n),),
        )

    def offsets_ns(self) -> np.ndarray | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "seed": self.seed,
            "salt": self.salt,
        }


# -- text --------------------------------------------------------------------------

_STREAM_TOKENS = 1 << 20
_streams: dict[int, np.ndarray] = {}


def _window(seed: int, i: int, n: int) -> np.ndarray:
    """``n`` word ids for session ``i``: a window of one random stream per seed, at an offset
    that is a hash of ``i``. A pure function of (seed, i, n), and far cheaper per session
    than seeding a generator (SyntheticChat sessions are built while a run sends)."""
    stream = _streams.get(seed)
    if stream is None:
        stream = np.random.default_rng([seed, 0x7E47]).integers(0, len(WORDS), _STREAM_TOKENS, dtype=np.int16)
        _streams[seed] = stream
    if n > _STREAM_TOKENS:
        return np.resize(np.roll(stream, -(i % _STREAM_TOKENS)), n)
    h = (i * 0x9E3779B97F4A7C15 + seed) & 0xFFFFFFFFFFFFFFFF
    h ^= h >> 31
    start = h % (_STREAM_TOKENS - n + 1)
    return stream[start : start + n]


def with_prefix(s: Session, text: str, n: int) -> Session:
    """``s`` with ``text`` (n tokens) at the very start of its context (and its children's)."""
    if not text:
        return s
    turns = tuple(
        replace(t, prompt_tokens=t.prompt_tokens + n, children=tuple(with_prefix(c, text, n) for c in t.children))
        for t in s.turns
    )
    if s.system:
        return replace(s, system=text + s.system, turns=turns)
    first = turns[0]
    return replace(s, turns=(replace(first, text=text + first.text), *turns[1:]))


def renumber(s: Session, i: int) -> Session:
    """``s`` and its children labelled session ``i`` (children carry their parent's id)."""
    turns = tuple(replace(t, children=tuple(renumber(c, i) for c in t.children)) if t.children else t for t in s.turns)
    return replace(s, session=i, turns=turns)


@dataclass(frozen=True)
class Base:
    """What every spec-built workload shares: name, seed, text source, wrap-around.

    Subclasses build session ``j`` < ``size`` in ``_build``; ``session(i)`` adds the
    salt prefix and, past the end of a finite workload, a per-pass prefix.
    """

    kind = "base"  # a class attribute, not a field
    name: str
    seed: int
    text: TextSource
    source: str = ""  # the spec file

    @property
    def size(self) -> int | None:
        return None

    def session(self, i: int) -> Session:
        if i < 0:
            raise IndexError(f"session index {i} < 0")
        n = self.size
        cycle, j = (0, i) if n is None else divmod(i, n)
        s = self._build(j)
        if i != j:
            s = renumber(s, i)
        return with_prefix(s, *self.text.prefix(cycle))

    def _build(self, j: int) -> Session:
        raise NotImplementedError

    def offsets_ns(self) -> np.ndarray | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "spec": self.source,
            "seed": self.seed,
            "salt": self.text.salt,
            **self.text.describe(),
            **self._describe(),
        }

    def _describe(self) -> dict[str, Any]:
        return {}

    def sessions(self, n: int) -> Iterator[Session]:
        """The first ``n`` sessions (previews and tests)."""
        return (self.session(i) for i in range(n))


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
