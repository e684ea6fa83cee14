"""What every workload is: sessions handed out by index, as a pure function of (spec, seed, index).

A ``Workload`` hands the engine ``Session``s by index, so session i is the same
bytes on any machine and in any worker process, and nothing is materialised
ahead of need beyond what the run asks for. ``Base`` is what the spec-built
workloads (synthetic and trace replay) share: the text source, the shared
system prompt, and the prefix that keeps each pass over a finite trace apart.
``SyntheticChat`` is the flag-built chat workload (``--input-tokens`` ...).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from loadgen.workload.session import Session, Turn
from loadgen.workload.text import TextSource
from loadgen.workload.tokenizer import BUILTIN, WORDS

__all__ = ["Workload", "SyntheticChat", "Base", "with_prefix", "renumber"]


class Workload(Protocol):
    """What the engine, the sweep and previews need from any workload."""

    @property
    def name(self) -> str:
        """Shown in reports and run.json."""

    @property
    def size(self) -> int | None:
        """Distinct sessions (a finite trace), or None when unbounded. Indices past
        it wrap around, each later pass under its own prefix (no false cache hits)."""

    def session(self, i: int) -> Session:
        """Session ``i``: a pure function of the workload spec, its seed and ``i``."""

    def offsets_ns(self) -> npt.NDArray[np.int64] | None:
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
        body = _text(self.seed, i, max(n - (1 if salt else 0), 0))
        return Session(
            session=i,
            turns=(Turn(text=salt + body, max_tokens=self.output_tokens, prompt_tokens=n),),
            salt=salt,
        )

    def prompt_ids(self, i: int) -> list[int]:
        """Session ``i``'s prompt as ``BUILTIN.encode`` of its text gives it, without building the
        text: the simulator in virtual time takes a prompt's ids, and tokenizing the text it was
        built from was most of what a request cost there (sim.virtual.loop.PromptIds)."""
        n = self.input_tokens
        if not self.salt:
            body: list[int] = _window(self.seed, i, n).tolist()
            return body
        head = BUILTIN.encode(f" {self.salt}_{i}")
        head.extend(_window(self.seed, i, max(n - 1, 0)).tolist())
        return head

    def prompt_view(self, i: int) -> Sequence[int]:
        """``prompt_ids(i)``'s ints without a list of them: the simulator in virtual time
        (sim.virtual.loop.SingleTurns) only reads a prompt's length and slices of it, and a list of
        512 ints cost it more than the rest of the request's bookkeeping. Without a salt, a read-only
        memoryview of the seed's word stream (no copy); with one, an ``array`` of int64 (a salt's
        token ids are hashes, beyond the word ids' int16)."""
        n = self.input_tokens
        if not self.salt:
            if n > _STREAM_TOKENS:
                return _window(self.seed, i, n).data.toreadonly()
            start = _start(self.seed, i, n)
            return _view(self.seed)[start : start + n]
        ids = array("q", BUILTIN.encode(f" {self.salt}_{i}"))
        ids.frombytes(_window(self.seed, i, max(n - 1, 0)).astype(np.int64).tobytes())
        return ids

    def turn_shape(self, i: int) -> Turn:
        """Session ``i``'s one turn as ``session(i)`` has it but for its text (left empty), which
        ``prompt_ids(i)`` gives as ids: for a driver that never reads the text (the simulator in
        virtual time, sim.virtual.loop.SingleTurns), building it is work for nothing."""
        return self._shape

    @cached_property
    def _shape(self) -> Turn:  # the same for every session (a frozen Turn: one will do)
        return Turn(text="", max_tokens=self.output_tokens, prompt_tokens=self.input_tokens)

    def offsets_ns(self) -> npt.NDArray[np.int64] | None:
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
# The length of each word's text as ``decode`` joins them (a space, then the word): a test pins
# that ``_text`` is ``decode_words``.
_SPACED_LENGTHS = np.array([1 + len(w) for w in WORDS], dtype=np.int64)
_streams: dict[int, npt.NDArray[np.int16]] = {}
_views: dict[int, memoryview] = {}


def _window(seed: int, i: int, n: int) -> npt.NDArray[np.int16]:
    """``n`` word ids for session ``i``: a window of one random stream per seed, at an offset
    that is a hash of ``i``. A pure function of (seed, i, n), and far cheaper per session
    than seeding a generator (SyntheticChat sessions are built while a run sends)."""
    stream = _stream(seed)
    if n > _STREAM_TOKENS:
        return np.resize(np.roll(stream, -(i % _STREAM_TOKENS)), n)
    start = _start(seed, i, n)
    return stream[start : start + n]


def _view(seed: int) -> memoryview:
    """The seed's stream as a read-only memoryview: a slice of it is a prompt's ids, no copy made."""
    view = _views.get(seed)
    if view is None:
        view = _views[seed] = _stream(seed).data.toreadonly()
    return view


def _stream(seed: int) -> npt.NDArray[np.int16]:
    """The seed's stream of word ids, built on first use."""
    stream = _streams.get(seed)
    if stream is None:
        stream = np.random.default_rng([seed, 0x7E47]).integers(0, len(WORDS), _STREAM_TOKENS, dtype=np.int16)
        _streams[seed] = stream
    return stream


_BLOCK = 1 << 12  # word ids per block of decoded text (~20 KB of text, ~1 ms to decode)
_blocks: dict[tuple[int, int], tuple[str, array[int]]] = {}
# where each word starts in its block's text: two bytes each while a block's text is that short
_OFFSET = "H" if _BLOCK * int(_SPACED_LENGTHS.max()) < 1 << 16 else "I"


def _text(seed: int, i: int, n: int) -> str:
    """``BUILTIN.decode_words(_window(seed, i, n))``, cut out of text decoded once per block.

    A prompt is a window of its seed's word stream, so its text is a slice of that stream's
    text: decoding 512 words per request cost ~20 us, a slice or two costs ~2. The stream is
    decoded a block at a time, on first use (``_block``), so a run pays only for the blocks
    its windows touch (at most the whole stream's ~5 MB of text and 2 MB of offsets per seed)."""
    if n == 0 or n > _STREAM_TOKENS:
        return BUILTIN.decode_words(_window(seed, i, n))
    start = _start(seed, i, n)
    first, last = start // _BLOCK, (start + n - 1) // _BLOCK
    lo = start - first * _BLOCK
    text, ends = _block(seed, first)
    if first == last:
        return text[ends[lo] : ends[lo + n]]
    pieces = [text[ends[lo] :]]
    for b in range(first + 1, last):
        pieces.append(_block(seed, b)[0])
    text, ends = _block(seed, last)
    pieces.append(text[: ends[start + n - last * _BLOCK]])
    return "".join(pieces)


def _block(seed: int, b: int) -> tuple[str, array[int]]:
    """Block ``b`` of ``seed``'s stream (built) decoded, and where each word of it starts
    within the block's text, and one more for the block's end."""
    got = _blocks.get((seed, b))
    if got is None:
        ids = _stream(seed)[b * _BLOCK : (b + 1) * _BLOCK]
        text = BUILTIN.decode_words(ids)
        ends = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(_SPACED_LENGTHS[ids], out=ends[1:])
        # an array, not numpy's: indexing it gives a plain int, 4x sooner
        got = _blocks[(seed, b)] = (text, array(_OFFSET, ends.astype(np.dtype(_OFFSET)).tobytes()))
    return got


def _start(seed: int, i: int, n: int) -> int:
    """Where ``_window(seed, i, n)`` starts in its seed's stream (``n`` at most its length)."""
    h = (i * 0x9E3779B97F4A7C15 + seed) & 0xFFFFFFFFFFFFFFFF
    h ^= h >> 31
    return int(h % (_STREAM_TOKENS - n + 1))


def with_prefix(s: Session, text: str, n: int, salt: str = "") -> Session:
    """``s`` with ``text`` (n tokens) at the very start of its context (and its children's);
    ``salt``, when given, is the part of ``text`` it starts with that is the run's salt."""
    if not text:
        return s
    turns = tuple(
        replace(t, prompt_tokens=t.prompt_tokens + n, children=tuple(with_prefix(c, text, n, salt) for c in t.children))
        for t in s.turns
    )
    salted = salt or s.salt
    if s.system:
        return replace(s, system=text + s.system, turns=turns, salt=salted)
    first = turns[0]
    return replace(s, turns=(replace(first, text=text + first.text), *turns[1:]), salt=salted)


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
        return with_prefix(s, *self.text.prefix(cycle), salt=self.text.salt_text)

    def _build(self, j: int) -> Session:
        raise NotImplementedError

    def offsets_ns(self) -> npt.NDArray[np.int64] | None:
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
