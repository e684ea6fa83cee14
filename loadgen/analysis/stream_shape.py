"""How the streams were shaped, in words that qualify TTFT and ITL: buffered delivery, missing
[DONE] markers, and where the per-chunk token counts came from.

None of these makes a run suspect (its figures are what was measured); each says how to read
them, so the reports show them first among the caveats and beside the ITL figures:

- ``buffered_stream``: most ok requests (of those with at least ``BUFFERED_MIN_TOKENS`` tokens)
  got most of their output in one read after a long silence (``outcomes.buffered_rows``): TTFT
  is then close to E2E and ITL near 0, because the endpoint or a proxy buffers the stream.
- ``no_done_marker``: ok streams that ended with a finish_reason but no ``data: [DONE]``
  (records' ``stream_end`` "finish"): the answer is whole, its framing not; they count as ok.
- The per-chunk token source (records' ``output_tokens_source``): ``usage_per_chunk`` (the
  endpoint's running usage) and ``tokenizer`` count each chunk; ``usage`` spreads the final usage
  evenly over the chunks, which is exact only when each chunk carries the same number of tokens,
  so ITL percentiles are approximate when chunks carry several tokens on average; ``chunks``
  counts one per chunk.

Pure functions of a ``Summary``, returning text (``analysis.validity`` makes caveats of them).
"""

from __future__ import annotations

from loadgen.analysis.metrics import Summary
from loadgen.analysis.outcomes import BUFFERED_MIN_TOKENS

__all__ = [
    "SOURCE_WORDS",
    "SPREAD_APPROXIMATE",
    "buffered_message",
    "no_done_message",
    "itl_approximate",
    "source_shares_text",
    "token_source_text",
]

SOURCE_WORDS = {
    "usage": "usage spread over chunks",
    "usage_per_chunk": "usage per chunk",
    "tokenizer": "tokenizer",
    "chunks": "one per chunk",
}
# Spread usage gives every chunk the same count; past this many tokens per chunk on average the
# true counts (and so the per-token gaps) differ from chunk to chunk often enough to move ITL's tail.
SPREAD_APPROXIMATE = 1.5


def buffered_message(s: Summary) -> str | None:
    """The ``buffered_stream`` caveat's words, when at least half the ok requests with enough
    tokens to tell look buffered (else None)."""
    if not s.buffered_of or 2 * s.buffered < s.buffered_of:
        return None
    return (
        f"{s.buffered} of {s.buffered_of} ok requests (with >= {BUFFERED_MIN_TOKENS} tokens) got most of their "
        "output in one read after a long silence: TTFT is close to E2E and ITL near 0 because the endpoint "
        "(or a proxy in front of it) buffers the stream; these figures do not time token generation"
    )


def no_done_message(s: Summary) -> str | None:
    """The ``no_done_marker`` caveat's words, when some ok stream ended without [DONE] (else None)."""
    if not s.no_done_marker:
        return None
    n = s.no_done_marker
    return (
        f"{n} ok stream{'s' if n > 1 else ''} ended with a finish_reason but without data: [DONE]: "
        "counted ok (the answer is whole, its framing not); loadgen check warns on it"
    )


def itl_approximate(s: Summary) -> bool:
    """ITL percentiles rest on usage spread evenly over chunks that carry several tokens on average."""
    spread = s.spread_tokens_per_chunk
    return s.token_sources.get("usage", 0) > 0 and spread == spread and spread >= SPREAD_APPROXIMATE


def source_shares_text(s: Summary) -> str:
    """The per-chunk token sources' shares of the requests that streamed ("usage per chunk 100%")."""
    return ", ".join(f"{SOURCE_WORDS.get(k, k)} {v:.0%}" for k, v in s.token_source_shares.items())


def token_source_text(s: Summary) -> str:
    """Where the per-chunk token counts came from ("per-chunk tokens: usage per chunk 100%"), and
    when ITL is approximate because of it; "" when no request streamed output."""
    shares = source_shares_text(s)
    if not shares:
        return ""
    text = "per-chunk tokens: " + shares
    if itl_approximate(s):
        text += (
            f"; usage spread over chunks of {s.spread_tokens_per_chunk:.1f} tokens on average: ITL percentiles "
            "are approximate (per-chunk usage, or --tokenizer, counts each chunk)"
        )
    return text
