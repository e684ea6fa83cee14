"""How much of a run's prompts the workload's own reuse lets a prefix cache serve, at most.

A run with a fresh salt (workload.salt) starts against a prefix cache that holds nothing of
it; whatever the cache serves then comes from the run's own reuse: a shared system prompt,
RAG documents that several requests retrieve, a trace's shared hash-id blocks, and a
conversation's history, which each later turn sends again. ``predict_reuse`` bounds that
from the sessions the run sent, with an unbounded cache that never evicts, where a request
hits as soon as an earlier one was sent (no in-flight misses):

- a session's first request shares with every earlier first request the longest common
  prefix of its context (system prompt and first message), found as chained hashes of
  ``BLOCK_CHARS``-character blocks, the way a server finds token blocks, and counted in
  the workload's tokenizer; past the last shared block the next one is credited too (the
  texts may part anywhere in it); the first request of each shared prefix finds nothing;
- a later turn's context repeats the previous turn's prompt and answer, all of which the
  server may serve from cache: the rest is the turn's own text.

Tokens are the workload's requested ones (``Turn.prompt_tokens``). Any real cache serves less (it
evicts, it caches whole blocks of 16 tokens or so, a request sent while an equal prefix
is still being computed misses), so an observed fraction well above this bound means the
cache held the run's prompts before the run began (analysis.prompt_cache). The order of the
sessions does not matter: with an unbounded cache, what all first requests share is
the same whichever came first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from loadgen.workload.base import Workload
from loadgen.workload.session import Session
from loadgen.workload.text import TextSource
from loadgen.workload.tokenizer import BUILTIN

__all__ = ["Reuse", "predict_reuse", "sent_sessions", "BLOCK_CHARS", "MAX_REQUESTS", "MAX_CHARS"]

BLOCK_CHARS = 64  # ~11 built-in tokens: finer than a server's 16-token blocks, so the bound stays above
# Past either limit the bound is that of the first sessions (building a session costs what it
# cost the engine, ~0.3 ms a turn; the seen blocks' set stays under ~20 MB):
MAX_REQUESTS = 2000  # requests (turns) predicted
MAX_CHARS = 16 << 20  # characters of first requests hashed


@dataclass(frozen=True)
class Reuse:
    """The reuse bound of one run (or sweep point): of ``prompt_tokens`` requested over
    ``requests``, ``reusable_tokens`` at most could come from cache."""

    sessions: int  # sessions the bound covers
    sessions_sent: int  # sessions the run sent (more than ``sessions`` when capped)
    requests: int
    prompt_tokens: int
    reusable_tokens: int

    @property
    def fraction(self) -> float:
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def json(self) -> dict[str, Any]:
        """For run.json (``prefix_reuse``)."""
        return {
            "sessions": self.sessions,
            "sessions_sent": self.sessions_sent,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "reusable_tokens": self.reusable_tokens,
            "fraction": self.fraction,
            "block_chars": BLOCK_CHARS,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Reuse | None:
        """run.json's ``prefix_reuse``; None when absent or not of that shape."""
        if not isinstance(d, Mapping):
            return None
        try:
            return cls(
                *(int(d[k]) for k in ("sessions", "sessions_sent", "requests", "prompt_tokens", "reusable_tokens"))
            )
        except (KeyError, TypeError, ValueError):
            return None


class _Count:
    __slots__ = ("requests", "prompt", "reusable", "chars", "seen", "tokens")

    def __init__(self, tokens: Callable[[str], int]) -> None:
        self.requests = self.prompt = self.chars = self.reusable = 0
        self.seen: set[int] = set()  # chained hashes of every first request's blocks
        self.tokens = tokens  # the workload's token count of a text


def predict_reuse(workload: Workload, sessions: Iterable[int]) -> Reuse:
    """The bound for a run that sent these sessions (their ids, any order, repeats ignored)."""
    ids = sorted({int(i) for i in sessions})
    text = getattr(workload, "text", None)  # a spec-built workload's text source (its tokenizer and ratio)
    count = _Count(text.count if isinstance(text, TextSource) else BUILTIN.count)
    covered = 0
    for i in ids:
        _session(workload.session(i), count)
        covered += 1
        if count.requests >= MAX_REQUESTS or count.chars > MAX_CHARS:
            break
    return Reuse(covered, len(ids), count.requests, count.prompt, count.reusable)


def _session(s: Session, count: _Count) -> None:
    prev = 0  # the previous turn's prompt and answer: the context a later turn repeats
    for k, turn in enumerate(s.turns):
        for child in turn.children:  # sent before this turn (each its own session)
            _session(child, count)
        p = max(int(turn.prompt_tokens), 0)
        if k == 0:
            text = (s.system or "") + turn.text
            count.chars += len(text)
            shared = _shared_chars(text, count.seen)
            reusable = min(p, count.tokens(text[:shared])) if shared else 0
        else:
            reusable = min(p, prev)
        count.requests += 1
        count.prompt += p
        count.reusable += reusable
        prev = p + max(int(turn.max_tokens), 0)


def _shared_chars(text: str, seen: set[int]) -> int:
    """The characters of ``text`` that may lead with an earlier text's: its leading blocks that
    an earlier text had, and the block after them; ``text``'s blocks join ``seen``."""
    h, shared, hit = 0, 0, True
    for a in range(0, len(text), BLOCK_CHARS):
        h = hash((h, text[a : a + BLOCK_CHARS]))  # per process: ``seen`` never leaves it
        if hit and h in seen:
            shared = a + BLOCK_CHARS
        else:
            if hit and shared:  # the texts part somewhere in this block
                shared = a + BLOCK_CHARS
            hit = False
            seen.add(h)
    return min(shared, len(text))


def sent_sessions(table: pa.Table) -> list[int]:
    """The sessions of a records table that had a request written to the wire."""
    if table.num_rows == 0:
        return []
    sent = table.filter(pc.is_valid(table["t_sent"]))
    return sorted(int(x) for x in pc.unique(sent["session"]).to_pylist() if x is not None)
