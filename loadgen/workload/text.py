"""Seeded text for prompts: the random streams every workload draws from, and prompt text
of a target token count.

``rng(seed, tag, *key)`` is the only source of randomness in a workload: a fresh
Generator per (stream, session, turn), so no draw in one session can shift
another's, and a tokenizer that needs extra draws to hit a length exactly
changes only the text it builds, never the lengths. ``TextSource`` builds text
of a target size under one tokenizer (and the salt and wrap-around prefixes put
before every session); ``Memo`` keeps built text bounded per worker. These sit
below every workload (and calibration, which builds probe text the same way)
so that all of them draw text alike.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from loadgen.workload.tokenizer import BUILTIN, Tokenizer

__all__ = ["rng", "str_key", "PREFIX_TOKENS", "Memo", "TextSource"]

# Tokens of the salt prefix (cold prefix caches per load point) and of the prefix
# that tells a wrapped-around pass over a finite trace from the first pass.
PREFIX_TOKENS = 4
_MASK32 = 0xFFFFFFFF


def rng(seed: int, tag: int, *key: int) -> np.random.Generator:
    """A Generator for one stream: every value is split into two 32-bit words and
    the key length is mixed in, since SeedSequence pads short entropy with zeros
    (so [1, 2] and [1, 2, 0] would otherwise collide)."""
    words: list[int] = [tag, len(key)]
    for v in (seed, *key):
        v = int(v)
        words += [v & _MASK32, (v >> 32) & _MASK32]
    return np.random.default_rng(words)


def str_key(text: str) -> int:
    """A stable 63-bit integer for a string (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


class Memo:
    """A bounded LRU memo of built text. It pickles empty: workers are spawned with a
    pickled workload and rebuild what they need (the text is a pure function)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, str] = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], str]) -> str:
        data = self._data
        value = data.get(key)
        if value is None:
            value = data[key] = make()
            if len(data) > self.maxsize:
                data.popitem(last=False)
        else:
            data.move_to_end(key)
        return value

    def __reduce__(self) -> tuple[type[Memo], tuple[int]]:
        return (Memo, (self.maxsize,))


_TAG_SALT = 0x5A17
_TAG_CYCLE = 0xC1C1E


@dataclass(frozen=True)
class TextSource:
    """Builds prompt text of target token counts under one tokenizer.

    ``ratio`` is endpoint tokens per tokenizer token (``loadgen.client.calibrate``):
    a target of n tokens is built as round(n / ratio) tokenizer tokens, and the
    workload still reports n as the requested prompt size.
    """

    tokenizer: Tokenizer = BUILTIN
    ratio: float = 1.0
    seed: int = 0
    salt: str = ""

    def words(self, n: int, gen: np.random.Generator) -> str:
        if n <= 0:
            return ""
        m = n if self.ratio == 1.0 else max(1, round(n / self.ratio))
        return self.tokenizer.words(m, gen)

    def count(self, text: str) -> int:
        """Target (endpoint) tokens of a given text."""
        c = self.tokenizer.count(text)
        return c if self.ratio == 1.0 else round(c * self.ratio)

    @cached_property
    def salt_text(self) -> str:
        if not self.salt:
            return ""
        return self.words(PREFIX_TOKENS, rng(self.seed, _TAG_SALT, str_key(self.salt)))

    def prefix(self, cycle: int) -> tuple[str, int]:
        """Text put before every session's context, and its target token count."""
        text, n = self.salt_text, PREFIX_TOKENS if self.salt else 0
        if cycle > 0:
            text += self.words(PREFIX_TOKENS, rng(self.seed, _TAG_CYCLE, cycle))
            n += PREFIX_TOKENS
        return text, n

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tokenizer": getattr(self.tokenizer, "name", "custom"), "ratio": self.ratio}
        sha256 = getattr(self.tokenizer, "sha256", None)  # a file-based tokenizer's identity
        if sha256:
            d["tokenizer_sha256"] = sha256
        return d
