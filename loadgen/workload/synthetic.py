"""Synthetic workloads from a spec: chat and RAG sessions (agentic ones: ``workload.agentic``).

Each is a pure function of (spec, seed, session index). Text that should be the
same across sessions (a shared system prompt, RAG document j) is drawn from a
stream keyed only by what identifies it, so a prefix cache sees the same tokens
every time; everything else is keyed by the session index.

``prompt_tokens`` of a turn is the expected size of its whole prompt: system +
every earlier turn's text + every earlier answer at its ``max_tokens`` (the
engine appends the real answer, which ``ignore_eos`` makes that long) + this
turn's text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from loadgen.specfile import Fields
from loadgen.workload.base import Base
from loadgen.workload.distributions import Distribution, Fixed, parse_distribution
from loadgen.workload.session import Session, Turn
from loadgen.workload.text import Memo, TextSource, rng

__all__ = [
    "ChatWorkload",
    "RagWorkload",
    "build_synthetic",
    "rag_fields",
    "grow",
    "shared_system",
    "TAG_LEN",
    "TAG_TEXT",
    "TAG_SYSTEM",
]

TAG_LEN, TAG_TEXT, TAG_SYSTEM = 1, 2, 3  # the streams of text and lengths (workload.agentic uses them too)
_TAG_DOCLEN, _TAG_DOC, _TAG_PICK = 4, 5, 6
_REUSE_HORIZON = 1000  # requests over which RAG reuse is reported
_DOC_CACHE = 4096


def grow(
    ts: TextSource,
    text_rng: Callable[[int], np.random.Generator],
    *,
    base: int,
    lens: np.ndarray,
    outs: np.ndarray,
    thinks: np.ndarray,
    later_role: str = "user",
    children: Callable[[int], tuple[Session, ...]] | None = None,
    max_context: int | None = None,
    follows: np.ndarray | None = None,
    follow_rng: Callable[[int], np.random.Generator] | None = None,
) -> tuple[Turn, ...]:
    """Turns whose context grows by each text (and later turns' ``follows``, a user
    message after a tool result, drawn from ``follow_rng``) and answer; see the module
    docstring."""
    turns: list[Turn] = []
    ctx = base
    for k in range(len(lens)):
        n, out = int(lens[k]), int(outs[k])
        f = int(follows[k]) if follows is not None and follow_rng is not None and k else 0
        prompt = ctx + n + f
        if k and max_context is not None and prompt + out > max_context:
            break
        turns.append(
            Turn(
                text=ts.words(n, text_rng(k)),
                max_tokens=out,
                prompt_tokens=prompt,
                think_ns=round(float(thinks[k]) * 1e9) if k else 0,
                role=later_role if k else "user",
                children=children(k) if children and k else (),
                follow_up=ts.words(f, follow_rng(k)) if f and follow_rng is not None else "",
            )
        )
        ctx = prompt + out
    return tuple(turns)


@dataclass(frozen=True, kw_only=True)
class ChatWorkload(Base):
    """Single- or multi-turn chat with an optional shared system prompt."""

    kind = "chat"
    system: str | None
    system_tokens: int
    turns: Distribution
    input: Distribution
    output: Distribution
    think: Distribution

    def _build(self, j: int) -> Session:
        g = rng(self.seed, TAG_LEN, j)
        n = self.turns.one(g)
        lens, outs, thinks = self.input.sample(g, n), self.output.sample(g, n), self.think.sample(g, n)
        turns = grow(
            self.text,
            lambda k: rng(self.seed, TAG_TEXT, j, k),
            base=self.system_tokens,
            lens=lens,
            outs=outs,
            thinks=thinks,
        )
        return Session(session=j, turns=turns, system=self.system)

    def _describe(self) -> dict[str, Any]:
        return {
            "system_tokens": self.system_tokens,
            "turns": self.turns.describe(),
            "input": self.input.describe(),
            "output": self.output.describe(),
            "think_s": self.think.describe(),
        }


@dataclass(frozen=True, kw_only=True)
class RagWorkload(Base):
    """k documents per request from a pool with Zipf popularity, then a question.

    Document j (rank j: 0 is the most popular) has a length and a text that are
    pure functions of (seed, j), so it is the same bytes in every request that
    retrieves it. ``order: sorted`` puts a request's documents in rank order (as
    a cache-aware retriever would, so shared leading documents form a shared
    prefix); ``sampled`` keeps retrieval order.
    """

    kind = "rag"
    system: str | None
    system_tokens: int
    doc_count: int
    doc_tokens: Distribution
    k: int
    zipf_alpha: float
    order: str
    question: Distribution
    output: Distribution

    @cached_property
    def _docs(self) -> Memo:
        return Memo(_DOC_CACHE)

    @cached_property
    def doc_lengths(self) -> np.ndarray:
        return self.doc_tokens.sample(rng(self.seed, _TAG_DOCLEN), self.doc_count)

    @cached_property
    def _cdf(self) -> npt.NDArray[np.float64]:
        w: npt.NDArray[np.float64] = np.arange(1, self.doc_count + 1, dtype=np.float64) ** -self.zipf_alpha
        cdf = np.cumsum(w)
        return cdf / float(cdf[-1])

    def _make_doc(self, d: int) -> str:
        return self.text.words(int(self.doc_lengths[d]), rng(self.seed, _TAG_DOC, d))

    def doc_text(self, d: int) -> str:
        return self._docs.get(d, lambda: self._make_doc(d))

    def docs(self, j: int) -> list[int]:
        """Request j's documents: k distinct ranks drawn by Zipf popularity."""
        g = rng(self.seed, _TAG_PICK, j)
        chosen: list[int] = []
        seen: set[int] = set()
        for _ in range(64):
            for u in g.random(self.k).tolist():
                d = min(int(np.searchsorted(self._cdf, u, side="right")), self.doc_count - 1)
                if d not in seen:
                    seen.add(d)
                    chosen.append(d)
                    if len(chosen) == self.k:
                        break
            if len(chosen) == self.k:
                break
        else:  # alpha so steep that the tail is never drawn: take the top unused ranks
            chosen += [d for d in range(self.doc_count) if d not in seen][: self.k - len(chosen)]
        return sorted(chosen) if self.order == "sorted" else chosen

    def prompt_docs(self, j: int) -> list[int]:
        """The documents request j puts in its prompt (every one retrieved; a pipeline's top k)."""
        return self.docs(j)

    def _build(self, j: int) -> Session:
        docs = self.docs(j)
        g = rng(self.seed, TAG_LEN, j)
        q, out = self.question.one(g), self.output.one(g)
        text = "".join(self.doc_text(d) for d in docs) + self.text.words(q, rng(self.seed, TAG_TEXT, j, 0))
        prompt = self.system_tokens + int(self.doc_lengths[docs].sum()) + q
        return Session(session=j, turns=(Turn(text=text, max_tokens=out, prompt_tokens=prompt),), system=self.system)

    @cached_property
    def reuse(self) -> dict[str, Any]:
        """Over the first requests: the fraction of document tokens whose document an
        earlier request already sent, and the fraction in a leading run of documents
        an earlier request also began with (what an unbounded prefix cache can hit)."""
        seen: set[int] = set()
        prefixes: set[tuple[int, ...]] = set()
        total = again = prefix = 0
        lens = self.doc_lengths
        for j in range(_REUSE_HORIZON):
            docs = self.prompt_docs(j)
            total += int(lens[docs].sum())
            again += sum(int(lens[d]) for d in docs if d in seen)
            for m in range(len(docs), 0, -1):
                if tuple(docs[:m]) in prefixes:
                    prefix += int(lens[docs[:m]].sum())
                    break
            seen.update(docs)
            prefixes.update(tuple(docs[:m]) for m in range(1, len(docs) + 1))
        return {
            "requests": _REUSE_HORIZON,
            "doc_tokens_seen_before": again / total,
            "doc_tokens_in_cached_prefix": prefix / total,
        }

    def _describe(self) -> dict[str, Any]:
        return {
            "system_tokens": self.system_tokens,
            "documents": {
                "count": self.doc_count,
                "tokens": self.doc_tokens.describe(),
                "mean_tokens": float(self.doc_lengths.mean()),
            },
            "k": self.k,
            "zipf_alpha": self.zipf_alpha,
            "order": self.order,
            "question": self.question.describe(),
            "output": self.output.describe(),
            "reuse": self.reuse,
        }


# -- spec parsing --------------------------------------------------------------------


def shared_system(f: Fields, key: str, ts: TextSource, seed: int, tag: int) -> tuple[str | None, int]:
    """A shared system prompt: ``N`` or ``{tokens: N}`` (generated) or ``{text: "..."}``."""
    if not f.has(key):
        f.raw(key, None)
        return None, 0
    if not isinstance(f.data[key], dict):
        n = f.number(key, integer=True, ge=0)
    else:
        s = f.sub(key)
        literal, n = s.string("text", None), s.number("tokens", None, integer=True, ge=0)
        s.finish()
        if (literal is None) == (n is None):
            raise s.error(None, "give exactly one of tokens or text")
        if literal is not None:
            return literal, ts.count(literal)
    return (ts.words(n, rng(seed, tag)), n) if n else (None, 0)


def build_synthetic(kind: str, f: Fields, common: dict[str, Any]) -> Base:
    ts, seed = common["text"], common["seed"]
    if kind == "chat":
        system, system_tokens = shared_system(f, "system", ts, seed, TAG_SYSTEM)
        return ChatWorkload(
            **common,
            system=system,
            system_tokens=system_tokens,
            turns=parse_distribution(f, "turns", default=Fixed(value=1)),
            input=parse_distribution(f, "input"),
            output=parse_distribution(f, "output"),
            think=parse_distribution(f, "think", integer=False, default=Fixed(value=0.0, integer=False)),
        )
    if kind == "rag":
        return RagWorkload(**common, **rag_fields(f, common, "k"))
    raise ValueError(f"not a chat or rag workload: {kind!r}")


def rag_fields(f: Fields, common: dict[str, Any], k_key: str) -> dict[str, Any]:
    """A RAG spec's fields, as ``RagWorkload``'s; ``k_key`` names the documents retrieved per
    request (``k``; a pipeline's ``candidates``)."""
    system, system_tokens = shared_system(f, "system", common["text"], common["seed"], TAG_SYSTEM)
    docs = f.sub("documents")
    count = docs.number("count", integer=True, ge=1)
    doc_tokens = parse_distribution(docs, "tokens")
    docs.finish()
    k = f.number(k_key, integer=True, ge=1)
    if k > count:
        raise f.error(k_key, f"must be <= documents.count ({count})")
    return {
        "system": system,
        "system_tokens": system_tokens,
        "doc_count": count,
        "doc_tokens": doc_tokens,
        "k": k,
        "zipf_alpha": float(f.number("zipf_alpha", 1.0, ge=0)),
        "order": f.string("order", "sampled", choices=("sampled", "sorted")),
        "question": parse_distribution(f, "question"),
        "output": parse_distribution(f, "output"),
    }
