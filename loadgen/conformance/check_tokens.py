"""The check's verdicts on token counts: does usage tell the truth, are max_tokens and ignore_eos honoured?

Three witnesses of how many tokens a stream carried, of unequal weight:

- ``usage.completion_tokens``, the server's own count: exact when honest, and what
  loadgen's throughput figures rest on;
- the output chunks: each chunk with visible output carries at least one token, so
  their number is a lower bound that proves under-reporting (and a limit overrun)
  but never over-reporting; chunks without visible text (``Stream.gen_ns``) are
  tokens too when usage counts them;
- the endpoint's tokenizer (``--tokenizer``), re-counting the streamed text: close,
  but re-tokenizing text is not the same as counting generated tokens (a merge across
  a boundary, a special token, a detokenizer's clean-up), so it drifts by a few tokens.

When usage and a re-count both exist, usage is trusted within the drift
(``drift``); the re-count decides only what usage does not say, or contradicts it by
more than the drift. Pure functions of what was read, tested without a socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadgen.conformance.check_items import combine

if TYPE_CHECKING:
    from loadgen.conformance.exchange import Stream
    from loadgen.workload.tokenizer import Tokenizer

__all__ = ["drift", "usage_matches", "max_tokens", "ignore_eos"]


def drift(n: int) -> int:
    """How far a re-tokenized count may stray from the generated one: 3 tokens or 10%."""
    return max(3, round(0.1 * n))


def _exact(n: int) -> int:
    """The tolerance of a re-count that confirms usage: 2 tokens or 3%."""
    return max(2, round(0.03 * n))


def usage_matches(streams: list[Stream], tokenizer: Tokenizer | None) -> tuple[str, str]:
    """usage.completion_tokens against what streamed: fail when the chunks prove it under-reports,
    or a re-count contradicts it beyond the drift; skip when nothing can tell."""
    return combine([_usage_match(s, tokenizer) for s in streams])


def _usage_match(s: Stream, tokenizer: Tokenizer | None) -> tuple[str, str]:
    ct, visible, gen = s.completion_tokens, len(s.chunk_ns), len(s.gen_ns)
    if not s.ok() or ct is None:
        return "skip", f"{s.api}: no usage to compare"
    n = tokenizer.count(s.text) if tokenizer is not None else None
    if ct < visible:
        counted = f"; tokenizer counts {n}" if n is not None else ""
        return "fail", f"{s.api}: usage {ct} < {visible} output chunks (under-reports{counted})"
    if n is not None:
        if abs(ct - n) <= _exact(n):
            return "pass", f"{s.api}: usage {ct}, tokenizer counts {n}"
        if abs(ct - n) <= drift(n):
            return "pass", f"{s.api}: usage {ct}, tokenizer counts {n} (within re-tokenization drift; usage trusted)"
        return "fail", f"{s.api}: usage {ct}, but the tokenizer counts {n} in the streamed text"
    if ct == visible:
        return "pass", f"{s.api}: usage {ct} = {visible} output chunks"
    if ct == gen:
        return "pass", f"{s.api}: usage {ct} = {gen} generated chunks ({visible} with visible text)"
    return "skip", (
        f"{s.api}: usage {ct} > {visible} chunks; chunks may carry several tokens (pass --tokenizer to verify)"
    )


def max_tokens(a: Stream, limit: int, tokenizer: Tokenizer | None, name: str = "max_tokens") -> tuple[str, str]:
    """No answer exceeds max_tokens (``name``: the API's word for it): judged by usage when it is
    there, by the output chunks always (a lower bound), by a re-count only without usage, and
    then beyond its drift."""
    if not a.ok():
        return "fail", a.wire.brief()
    ct, visible = a.completion_tokens, len(a.chunk_ns)
    n = tokenizer.count(a.text) if tokenizer is not None else None
    over = [f"{visible} output chunks"] if visible > limit else []
    if ct is not None and ct > limit:
        over.append(f"usage {ct}")
    if ct is None and n is not None and n > limit + drift(limit):
        over.append(f"tokenizer {n}")
    seen = f"usage {ct}, {visible} output chunks" + (f", tokenizer {n}" if n is not None else "")
    if over:
        return "fail", f"{name} {limit}, but {' and '.join(over)}"
    return "pass", f"{name} {limit}: {seen}, finish_reason {a.finish_reason!r}"


def ignore_eos(got: list[Stream], n: int, tokenizer: Tokenizer | None) -> tuple[str, str]:
    """With ignore_eos, each short-answer prompt gives exactly ``n`` tokens."""
    verdicts = []
    for i, s in enumerate(got):
        if not s.ok():
            verdicts.append(("fail", f"prompt {i + 1}: {s.wire.brief()}"))
            continue
        ct, visible = s.completion_tokens, len(s.chunk_ns)
        k = tokenizer.count(s.text) if tokenizer is not None else None
        if ct is not None:  # usage decides, unless the chunks or a re-count disprove it
            ok = ct == n and visible <= n and (k is None or abs(k - n) <= drift(n))
        elif k is not None:
            ok = abs(k - n) <= _exact(n) and visible <= n
        else:
            ok = visible == n
        if ok:
            verdicts.append(("pass", f"prompt {i + 1}: {n} tokens"))
            continue
        seen = f"usage {ct}, {visible} output chunks" + (f", tokenizer {k}" if k is not None else "")
        verdicts.append(
            ("fail", f"prompt {i + 1}: asked {n} with ignore_eos, got {seen}, finish_reason {s.finish_reason!r}")
        )
    return combine(verdicts)
