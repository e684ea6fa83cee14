"""A stream's final token counts: what was seen per chunk, reconciled with the usage reported.

Apart from the tally (tally.py) because it is a pure function of the tally's
figures, run once per request, and its rules are a contract of their own: the
recorded counts decide ITL and TPOT (DESIGN.md), so each rule is pinned by a test.
"""

from __future__ import annotations

from typing import NamedTuple

from loadgen.untrusted import MAX_TOKEN_COUNT

__all__ = ["Reconciled", "by_tokenizer", "reconcile", "spread"]


class Reconciled(NamedTuple):
    """A stream's final token counts: per output chunk, their total, and where they came from."""

    counts: list[int]
    total: int
    source: str  # "usage_per_chunk" | "usage" | "tokenizer" | "chunks" | "none" (records.TOKEN_SOURCES)


def reconcile(chunk_tokens: list[int], per_chunk: bool, carry: int, completion_tokens: int | None) -> Reconciled:
    """Final per-chunk token counts, their total, and where the count came from.

    From the tally: ``chunk_tokens``, the counts observed per output chunk;
    ``per_chunk``, whether running usage gave them; ``carry``, a usage rise seen
    after the last output chunk; ``completion_tokens``, the last usage reported.

    Without running usage a chunk's observed count is 1 (only the first choice
    counts). Then:

    - ``usage_per_chunk``: running usage gave counts on output chunks; they are
      kept as observed (a rise seen after the last output chunk, e.g. on the
      finish chunk, is added to the last one).
    - ``usage``: the final ``completion_tokens`` is at least the observed total;
      each chunk keeps its observed count and the surplus is spread over the
      chunks by ``spread`` (evenly, deterministically).
    - ``chunks``: no usage, or a usage below the observed total (an
      under-reporting server; the caller stores the reported value beside it, so
      the mismatch stays visible): the observed counts.
    - no output chunks: ``([], 0, "usage")`` if usage was reported, else
      ``([], 0, "none")``.

    Bounds: the tally's counts are each at least 1 (exactly 1 without running
    usage), its ``carry`` at least 0 and its ``completion_tokens`` within
    ``[0, MAX_TOKEN_COUNT]`` (usage.py). Running usage gives counts that add up to
    at most the highest usage plus one per chunk whose rise was under one; should
    that pass ``MAX_TOKEN_COUNT`` (a counter leaping to near the bound), the counts
    are not believed and one per chunk is kept, as ``chunks``. So every count and
    the total lie in ``[0, MAX_TOKEN_COUNT]`` for any stream of fewer than
    ``MAX_TOKEN_COUNT`` output chunks (more would be over a GB of events, held in
    lists of their times: the engine's timeouts end it first).
    """
    counts = list(chunk_tokens)
    if not counts:
        return Reconciled([], 0, "none" if completion_tokens is None else "usage")
    if per_chunk:
        counts[-1] += carry
        total = sum(counts)
        if total <= MAX_TOKEN_COUNT:
            return Reconciled(counts, total, "usage_per_chunk")
        return Reconciled([1] * len(counts), len(counts), "chunks")
    seen = sum(counts)
    ct = completion_tokens
    if ct is not None and ct >= seen:
        if ct > seen:
            counts = [c + e for c, e in zip(counts, spread(ct - seen, len(counts)), strict=True)]
        return Reconciled(counts, ct, "usage")
    return Reconciled(counts, seen, "chunks")


def by_tokenizer(tokenized: list[int], completion_tokens: int | None) -> Reconciled:
    """Per-chunk counts from a tokenizer (``tokenized``, the tokens of the stream's text
    counted in the chunk each ends in), reconciled with the final usage reported.

    The rule, so that the tokenizer gives the shape and the server, when it says, the total:

    - each output chunk counts at least 1: it was sent because a token was generated,
      even where re-tokenizing merges its text into a token that ends in the next chunk;
    - no usage: these counts, their sum the total;
    - a usage above their sum (tokens that are not in the text: an end-of-sequence
      token, tool-call markup the server's parser hides): the surplus is spread
      evenly over the chunks (``spread``), and the total is the usage;
    - a usage below their sum but at least one per chunk (a tokenizer that is not the
      server's): the excess is taken off each chunk's count above 1 in proportion
      (``_shrink``), and the total is the usage;
    - a usage below one per chunk (an under-reporting server, as ``reconcile``'s
      ``chunks``): these counts, their sum the total; the record keeps the usage
      reported beside it, so the mismatch stays visible.

    Every count lies in ``[1, MAX_TOKEN_COUNT]``, and so does the total, when the
    tokenizer's counts add up to at most ``MAX_TOKEN_COUNT`` (the tally keeps at
    most ``tally.MAX_TOKENIZED_CHARS`` characters, far fewer) or a usage is given.
    """
    counts = [c if c > 1 else 1 for c in tokenized]
    if not counts:
        return Reconciled([], 0, "none" if completion_tokens is None else "usage")
    total = sum(counts)
    ct = completion_tokens
    if ct is None or ct < len(counts) or ct == total:
        if total > MAX_TOKEN_COUNT:  # cannot be, for text the tally keeps; never recorded so
            return Reconciled([1] * len(counts), len(counts), "chunks")
        return Reconciled(counts, total, "tokenizer")
    if ct > total:
        counts = [c + e for c, e in zip(counts, spread(ct - total, len(counts)), strict=True)]
    else:
        counts = _shrink(counts, total - ct)
    return Reconciled(counts, ct, "tokenizer")


def _shrink(counts: list[int], less: int) -> list[int]:
    """``counts`` (each at least 1) with ``less`` fewer in all, taken from each count's
    part above 1 in proportion (deterministically: by the rounded running sum), so each
    stays at least 1 and keeps its place in the shape; ``less`` is at most those parts' sum."""
    above = sum(counts) - len(counts)
    keep = above - less
    out, run, kept = [], 0, 0
    for c in counts:
        run += c - 1
        now = run * keep // above
        out.append(1 + now - kept)
        kept = now
    return out


def spread(total: int, n: int) -> list[int]:
    """Split ``total`` over ``n`` chunks as evenly as integers allow, deterministically.

    Each gets ``total // n``; the remainder ``r`` goes one each to the chunks where
    ``floor(i * r / n)`` steps up, so extra tokens are spaced evenly through the
    stream rather than piled at one end (which would bend ITL percentiles).
    """
    base, r = divmod(total, n)
    if not r:
        return [base] * n
    return [base + ((i + 1) * r // n - i * r // n) for i in range(n)]
