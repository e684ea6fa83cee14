"""Synthetic workloads from a spec: chat, RAG and agentic sessions.

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

__all__ = ["ChatWorkload", "RagWorkload", "AgenticWorkload", "AgentProfile", "build_synthetic"]

_TAG_LEN, _TAG_TEXT, _TAG_SYSTEM = 1, 2, 3
_TAG_DOCLEN, _TAG_DOC, _TAG_PICK = 4, 5, 6
_TAG_SUBSYSTEM, _TAG_CHILD_LEN, _TAG_CHILD_TEXT = 7, 8, 9
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
) -> tuple[Turn, ...]:
    """Turns whose context grows by each text and answer; see the module docstring."""
    turns: list[Turn] = []
    ctx = base
    for k in range(len(lens)):
        n, out = int(lens[k]), int(outs[k])
        prompt = ctx + n
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
        g = rng(self.seed, _TAG_LEN, j)
        n = self.turns.one(g)
        lens, outs, thinks = self.input.sample(g, n), self.output.sample(g, n), self.think.sample(g, n)
        turns = grow(
            self.text,
            lambda k: rng(self.seed, _TAG_TEXT, j, k),
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

    def _build(self, j: int) -> Session:
        docs = self.docs(j)
        g = rng(self.seed, _TAG_LEN, j)
        q, out = self.question.one(g), self.output.one(g)
        text = "".join(self.doc_text(d) for d in docs) + self.text.words(q, rng(self.seed, _TAG_TEXT, j, 0))
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
            docs = self.docs(j)
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


@dataclass(frozen=True)
class AgentProfile:
    """How one kind of agent behaves: the parent, or its subagents."""

    system: str | None
    system_tokens: int
    first: Distribution
    turns: Distribution
    tool_result: Distribution
    output: Distribution
    think: Distribution
    max_context: int | None

    def describe(self) -> dict[str, Any]:
        return {
            "system_tokens": self.system_tokens,
            "first": self.first.describe(),
            "turns": self.turns.describe(),
            "tool_result": self.tool_result.describe(),
            "output": self.output.describe(),
            "think_s": self.think.describe(),
            "max_context": self.max_context,
        }


@dataclass(frozen=True, kw_only=True)
class AgenticWorkload(Base):
    """Sessions of many turns: a task, then tool results, each after the answer.

    Turn k > 0 appends the previous answer (the engine does) and a tool result
    (``Turn.text``, role ``tool``) after a think/tool delay. With ``subagents``,
    a turn may first run child sessions (each with its own shared system prompt)
    while the parent waits; their result is that turn's tool result.
    """

    kind = "agentic"
    agent: AgentProfile
    sub: AgentProfile | None = None
    sub_probability: float = 0.0
    sub_count: Distribution = Fixed(value=1)

    def _agent(
        self, p: AgentProfile, key: tuple[int, ...], child: bool, children: Callable[[int], tuple[Session, ...]] | None
    ) -> tuple[Turn, ...]:
        tag_len, tag_text = (_TAG_CHILD_LEN, _TAG_CHILD_TEXT) if child else (_TAG_LEN, _TAG_TEXT)
        g = rng(self.seed, tag_len, *key)
        n = p.turns.one(g)
        lens = p.tool_result.sample(g, n)
        lens[0] = p.first.one(g)
        outs, thinks = p.output.sample(g, n), p.think.sample(g, n)
        return grow(
            self.text,
            lambda k: rng(self.seed, tag_text, *key, k),
            base=p.system_tokens,
            lens=lens,
            outs=outs,
            thinks=thinks,
            later_role="tool",
            children=children,
            max_context=p.max_context,
        )

    def _children(self, j: int, k: int) -> tuple[Session, ...]:
        sub = self.sub
        if sub is None or self.sub_probability <= 0:
            return ()
        g = rng(self.seed, _TAG_CHILD_LEN, j, k)
        if g.random() >= self.sub_probability:
            return ()
        return tuple(
            Session(session=j, turns=self._agent(sub, (j, k, c), True, None), system=sub.system)
            for c in range(self.sub_count.one(g))
        )

    def _build(self, j: int) -> Session:
        turns = self._agent(self.agent, (j,), False, lambda k: self._children(j, k))
        return Session(session=j, turns=turns, system=self.agent.system)

    def _describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"agent": self.agent.describe()}
        if self.sub is not None:
            d["subagents"] = {
                "probability": self.sub_probability,
                "count": self.sub_count.describe(),
                **self.sub.describe(),
            }
        return d


# -- spec parsing --------------------------------------------------------------------


def _system(f: Fields, key: str, ts: TextSource, seed: int, tag: int) -> tuple[str | None, int]:
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


def _profile(f: Fields, ts: TextSource, seed: int, tag: int, parent: AgentProfile | None) -> AgentProfile:
    """The parent agent's profile (its lengths required), or the subagents' (any field
    left out is the parent's)."""

    def dist(key: str, default: Distribution | None = None, integer: bool = True) -> Distribution:
        d = getattr(parent, key) if parent is not None else default
        return parse_distribution(f, key, integer=integer, default=d)

    system, system_tokens = _system(f, "system", ts, seed, tag)
    return AgentProfile(
        system=system,
        system_tokens=system_tokens,
        first=dist("first"),
        turns=dist("turns"),
        tool_result=dist("tool_result"),
        output=dist("output"),
        think=dist("think", Fixed(value=0.0, integer=False), integer=False),
        max_context=f.number("max_context", parent.max_context if parent else None, integer=True, ge=1),
    )


def build_synthetic(kind: str, f: Fields, common: dict[str, Any]) -> Base:
    ts, seed = common["text"], common["seed"]
    if kind == "chat":
        system, system_tokens = _system(f, "system", ts, seed, _TAG_SYSTEM)
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
        system, system_tokens = _system(f, "system", ts, seed, _TAG_SYSTEM)
        docs = f.sub("documents")
        count = docs.number("count", integer=True, ge=1)
        doc_tokens = parse_distribution(docs, "tokens")
        docs.finish()
        k = f.number("k", integer=True, ge=1)
        if k > count:
            raise f.error("k", f"must be <= documents.count ({count})")
        return RagWorkload(
            **common,
            system=system,
            system_tokens=system_tokens,
            doc_count=count,
            doc_tokens=doc_tokens,
            k=k,
            zipf_alpha=float(f.number("zipf_alpha", 1.0, ge=0)),
            order=f.string("order", "sampled", choices=("sampled", "sorted")),
            question=parse_distribution(f, "question"),
            output=parse_distribution(f, "output"),
        )
    agent = _profile(f, ts, seed, _TAG_SYSTEM, None)
    s = f.sub("subagents", None)
    if s is None:
        return AgenticWorkload(**common, agent=agent)
    prob = s.number("probability", ge=0, le=1)
    count = parse_distribution(s, "count", default=Fixed(value=1))
    sub = _profile(s, ts, seed, _TAG_SUBSYSTEM, agent)
    s.finish()
    return AgenticWorkload(**common, agent=agent, sub=sub, sub_probability=float(prob), sub_count=count)
