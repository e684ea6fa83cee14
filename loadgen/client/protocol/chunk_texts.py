"""Each output chunk's text, kept to count its tokens with a tokenizer.

Why: without running usage, the only per-chunk truth a client can have is the text
each chunk carried. A chunk of speculative decoding carries 2-4 tokens, and spreading
the final usage evenly over chunks then gets most chunks wrong (and ITL with them).
With the tokenizer the server uses, the chunk texts give each chunk's count.

The whole text is tokenized once, each token counted in the chunk its text ends in
(``workload.tokenizer.count_pieces``): counting chunks one by one would count a
token that straddles two chunks twice. Then ``token_counts.by_tokenizer`` reconciles
those counts with the final usage, so the recorded total stays the server's when it
reports one. Memory is bounded: at most ``MAX_TOKENIZED_CHARS`` characters per
stream, past which the texts are dropped and the stream is counted as without a
tokenizer. Apart from the tally (tally.py), which hands each output chunk's text here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadgen.client.protocol.token_counts import Reconciled, by_tokenizer
from loadgen.client.protocol.usage import Problems
from loadgen.workload.tokenizer import count_pieces

if TYPE_CHECKING:
    from loadgen.workload.tokenizer import Tokenizer

__all__ = ["MAX_TOKENIZED_CHARS", "ChunkTexts"]

# The most output characters a tally keeps to count with its tokenizer (~250k tokens,
# longer than any answer a context window holds today): so a tally never holds more
# than a few MB of text, however long the stream.
MAX_TOKENIZED_CHARS = 1 << 20


class ChunkTexts:
    """The texts of a stream's output chunks, one string each ("" for a chunk that
    carried output without text, e.g. tool arguments sent as an object)."""

    __slots__ = ("tokenizer", "texts", "room")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.texts: list[str] = []
        self.room = MAX_TOKENIZED_CHARS

    def add(self, texts: list[str], size: int) -> bool:
        """Keep the texts of output chunks, ``size`` characters in all; False (and the
        texts are dropped) once that passes ``MAX_TOKENIZED_CHARS``."""
        self.room -= size
        if self.room < 0:
            self.texts = []
            return False
        self.texts.extend(texts)
        return True

    def counts(
        self, chunks: int, completion_tokens: int | None, lenient: bool, problems: Problems
    ) -> Reconciled | None:
        """The stream's counts per chunk (``token_counts.by_tokenizer``) for its ``chunks``
        output chunks, ``completion_tokens`` the final usage reported, or None if they
        cannot be had (then a problem says why, when it is the tokenizer's doing).
        ``lenient``: the text may hold lone surrogates."""
        texts = self.texts
        if not chunks or len(texts) != chunks:
            return None
        if lenient:  # a lone surrogate becomes "?": one character for one, so no offset moves
            texts = [t.encode("utf-8", "replace").decode() for t in texts]
        try:
            tokenized = count_pieces(self.tokenizer, texts)
        except Exception as e:  # a tokenizer on untrusted text: its failure must not lose the record
            problems.flag("tokenizer", f"the tokenizer failed on the output ({type(e).__name__}): counted without it")
            return None
        if len(tokenized) != chunks:
            problems.flag("tokenizer", "the tokenizer gave counts that do not fit the chunks: counted without it")
            return None
        return by_tokenizer(tokenized, completion_tokens)
