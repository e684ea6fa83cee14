"""Tokenizers: the built-in approximate one, shared by workloads and the simulator.

The built-in tokenizer counts one token per word and one per punctuation mark,
and builds text only from common short English words, each of which is a single
token in the BPE vocabularies of current LLMs. So a prompt built for N tokens is
N tokens here, in the simulator, and close to N on a real endpoint; the gap is
measured (requested vs reported prompt tokens) and shown, never assumed away.
"""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from loadgen.errors import LoadgenError

__all__ = [
    "Tokenizer",
    "PieceCounter",
    "BuiltinTokenizer",
    "HFTokenizer",
    "BUILTIN",
    "WORDS",
    "count_pieces",
    "get_tokenizer",
]

# Common words that are one token with a leading space in GPT-2/Llama-3/Qwen BPEs.
WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        """the of and to in is that for it as was with be by on not he this are or his from at
    which but have an they you were her she there one all we their been has would more if
    when will no so can who its about into them some could him than other time then these
    two may only new do any my first now such like our over man also me even most made
    after many before must through back years where much your way well down should because
    each just those people how too little state good very make world still own see men work
    long get here between both life being under never day same another know while last might
    us great old year off come since against go came right used take three small place
    found part water house light point city line word hand school high end name side story
    book fire music food night river road space tree door field power city sound form
    table paper game body month week plan open close start stop turn move play read write
    run walk talk call give keep hold bring show try ask need feel seem leave put mean let
    begin help tell live change follow learn grow draw cut build send fall stand pay meet""".split()
    )
)
_SPACED = [" " + w for w in WORDS]  # decode joins these: no per-token string concatenation
_SPACED_ARRAY = np.array(_SPACED, dtype=object)
_WORD_ID = {w: i for i, w in enumerate(WORDS)}
_PIECES = [" " + w for w in WORDS]
_TOKEN_RE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+$")


class Tokenizer(Protocol):
    """What workloads, the simulator and token counting need from a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def count(self, text: str) -> int: ...

    def words(self, n: int, rng: np.random.Generator) -> str:
        """Text of exactly ``n`` tokens under this tokenizer, drawn from ``rng``."""
        ...


@runtime_checkable
class PieceCounter(Protocol):
    """A tokenizer that can count a text cut in pieces (``count_pieces``), as both here can."""

    def count_pieces(self, pieces: Sequence[str]) -> list[int]: ...


def count_pieces(tokenizer: Tokenizer, pieces: Sequence[str]) -> list[int]:
    """The tokens of ``"".join(pieces)``, each counted in the piece its text ends in.

    A token can straddle two pieces (" wor" + "ld" may be one token): counting each
    piece alone would count it twice, so the whole text is tokenized once and each
    token goes to the piece holding its last character. The counts add up to the
    joined text's count; a piece inside a token that ends later counts 0. A
    tokenizer without ``count_pieces`` counts each piece alone (an overcount where
    tokens straddle pieces).
    """
    if isinstance(tokenizer, PieceCounter):
        return tokenizer.count_pieces(pieces)
    return [tokenizer.count(p) for p in pieces]


def _by_piece(ends: Sequence[int], pieces: Sequence[str]) -> list[int]:
    """How many of the token ``ends`` (character offsets in the joined text) fall in each piece."""
    if not pieces:
        return []
    bounds = np.fromiter(accumulate(map(len, pieces)), dtype=np.int64, count=len(pieces))
    at = np.searchsorted(bounds, np.asarray(ends, dtype=np.int64), side="left")
    counts: list[int] = np.bincount(np.minimum(at, len(pieces) - 1), minlength=len(pieces)).tolist()
    return counts


class BuiltinTokenizer:
    """Word-level approximate tokenizer; deterministic on every machine.

    Known words map to their index; any other piece maps to a stable CRC32-based
    id above the word range, so equal text always gives equal ids (which is what
    the simulator's prefix cache hashes).
    """

    name = "builtin"

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in _TOKEN_RE.findall(text):
            word = piece.strip()
            if not word:
                continue
            known = _WORD_ID.get(word)
            ids.append(known if known is not None else len(WORDS) + zlib.crc32(word.encode()))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        n = len(WORDS)
        return "".join([_SPACED[i] if 0 <= i < n else _SPACED[i % n] for i in ids])

    def decode_words(self, ids: np.ndarray) -> str:
        """``decode`` of an array of word ids, each below ``len(WORDS)``, at numpy's speed:
        synthetic prompts are built this way while a run sends (~3x faster at 1k tokens; a
        short one goes through a list, which numpy's fixed cost per call would outweigh)."""
        if len(ids) < 64:
            return "".join([_SPACED[i] for i in ids.tolist()])
        return "".join(_SPACED_ARRAY[ids].tolist())

    def count(self, text: str) -> int:
        return sum(1 for p in _TOKEN_RE.findall(text) if p.strip())

    def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        """``count`` of the joined pieces, each token counted in the piece it ends in (``count_pieces``)."""
        ends = [m.end() for m in _TOKEN_RE.finditer("".join(pieces)) if not m.group().isspace()]
        return _by_piece(ends, pieces)

    def words(self, n: int, rng: np.random.Generator) -> str:
        """Text of exactly ``n`` tokens drawn from ``rng`` (leading space included)."""
        if n <= 0:
            return ""
        return "".join([_PIECES[i] for i in rng.integers(0, len(WORDS), size=n).tolist()])


BUILTIN = BuiltinTokenizer()


# Of a vocabulary's single-token words, those used to build text: lower-case ASCII
# words (with the leading space the pre-tokenizer splits on), so text built from
# them reads like words and its token count is the sum of its pieces.
_HF_WORD = re.compile(r"^[a-z]{2,12}$")
_HF_MIN_WORDS = 16
_HF_ADJUST_ROUNDS = 16


class HFTokenizer:
    """A Hugging Face ``tokenizers`` JSON file (offline), for exact prompt lengths.

    Text is built from words that are one token each in this vocabulary; the
    count of the joined text is verified and pieces added or dropped until it is
    exactly ``n`` (a merge across pieces is rare but possible in odd vocabularies).
    The word list is taken in vocabulary-id order, so the same file gives the same
    text on every machine.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path).expanduser()
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise LoadgenError(f"{p}: no such tokenizer file (give a tokenizer.json or its folder)")
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError:
            raise LoadgenError(
                "a Hugging Face tokenizer needs the 'tokenizers' package: pip install 'loadgen[hf]'"
            ) from None
        try:
            self._tk: Any = _HF.from_file(str(p))
        except Exception as e:  # the library raises a bare Exception on a bad file
            raise LoadgenError(f"{p}: not a Hugging Face tokenizer file: {e}") from None
        data = p.read_bytes()
        self.path = p
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.name = f"hf:{p.parent.name}/{p.name}" if p.parent.name else f"hf:{p.name}"
        self._pieces: list[str] | None = None

    def encode(self, text: str) -> list[int]:
        return list(self._tk.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tk.decode(list(ids)))

    def count(self, text: str) -> int:
        return len(self._tk.encode(text, add_special_tokens=False).ids)

    def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        """``count`` of the joined pieces, each token counted in the piece it ends in (``count_pieces``),
        by the tokens' character offsets."""
        offsets = self._tk.encode("".join(pieces), add_special_tokens=False).offsets
        return _by_piece([end for _, end in offsets], pieces)

    @property
    def pieces(self) -> list[str]:
        """Single-token words (" word") of this vocabulary, in id order."""
        if self._pieces is None:
            vocab = sorted(self._tk.get_vocab().items(), key=lambda kv: kv[1])
            cands: list[tuple[int, str]] = []
            for _, tid in vocab:
                w = self._tk.decode([tid]).strip()
                if _HF_WORD.match(w):
                    cands.append((tid, " " + w))
            encoded = self._tk.encode_batch([c for _, c in cands], add_special_tokens=False)
            seen: set[str] = set()
            pieces = []
            for (tid, c), enc in zip(cands, encoded, strict=True):
                if list(enc.ids) == [tid] and c not in seen:
                    seen.add(c)
                    pieces.append(c)
            if len(pieces) < _HF_MIN_WORDS:
                raise LoadgenError(
                    f"{self.path}: only {len(pieces)} single-token words in this vocabulary; "
                    "cannot build text of exact lengths with it"
                )
            self._pieces = pieces
        return self._pieces

    def words(self, n: int, rng: np.random.Generator) -> str:
        """Text of exactly ``n`` tokens: random single-token words, count verified."""
        if n <= 0:
            return ""
        pieces = self.pieces
        chosen = [pieces[i] for i in rng.integers(0, len(pieces), size=n).tolist()]
        for _ in range(_HF_ADJUST_ROUNDS):
            text = "".join(chosen)
            c = self.count(text)
            if c == n:
                return text
            if c > n:
                del chosen[max(1, len(chosen) - (c - n)) :]
            else:
                chosen.extend(pieces[i] for i in rng.integers(0, len(pieces), size=n - c).tolist())
        raise LoadgenError(f"{self.path}: could not build text of exactly {n} tokens")


def get_tokenizer(spec: Tokenizer | str | os.PathLike[str] | None) -> Tokenizer:
    """A tokenizer from an object, ``"builtin"``/None, or a path to a HF tokenizer file."""
    if spec is None or spec == "builtin":
        return BUILTIN
    if isinstance(spec, (str, os.PathLike)):
        return HFTokenizer(spec)
    return spec
