"""Agentic sessions from a spec: a task, then tool results, each after the answer, with real tools.

Turn k > 0 appends the previous answer and a tool result after a think/tool delay. Every
request offers the spec's ``tools`` with its ``tool_choice`` (``workload.tools``; in the
session's ``extra`` body fields). When an answer calls tools, the next turn sends the
assistant message with those calls and one ``role: tool`` message per call, whose content
is the turn's tool result; when it does not, the tool result is a user message, as before
tools were offered (``session.Conversation``). A later turn may also carry a ``follow_up``
user message after its tool results (its length the spec's ``follow_up``; none by default).
With ``subagents``, a turn may first run child sessions (each with its own shared system
prompt, and the parent's tools unless its own are given) while the parent waits; their
result is that turn's tool result.

``prompt_tokens`` of turn k: system + every earlier text and follow-up + every earlier
answer at its ``max_tokens`` + this turn's text and follow-up; the tools' schemas, which a
server renders into the prompt, are not counted (a few hundred tokens), nor a second
call's copy of the tool result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.specfile import Fields
from loadgen.workload.base import Base
from loadgen.workload.distributions import Distribution, Fixed, parse_distribution
from loadgen.workload.session import Session, Turn
from loadgen.workload.synthetic import TAG_LEN, TAG_SYSTEM, TAG_TEXT, grow, shared_system
from loadgen.workload.text import TextSource, rng
from loadgen.workload.tools import Tools, parse_tools

__all__ = ["AgenticWorkload", "AgentProfile", "build_agentic"]

_TAG_SUBSYSTEM, _TAG_CHILD_LEN, _TAG_CHILD_TEXT = 7, 8, 9
_TAG_FOLLOW, _TAG_CHILD_FOLLOW = 10, 11


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
    tools: Tools
    follow_up: Distribution | None = None  # tokens of a user message after a later turn's tool results

    def describe(self) -> dict[str, Any]:
        d = {
            "system_tokens": self.system_tokens,
            "first": self.first.describe(),
            "turns": self.turns.describe(),
            "tool_result": self.tool_result.describe(),
            "output": self.output.describe(),
            "think_s": self.think.describe(),
            "max_context": self.max_context,
            "tools": self.tools.describe(),
        }
        if self.follow_up is not None:
            d["follow_up"] = self.follow_up.describe()
        return d


@dataclass(frozen=True, kw_only=True)
class AgenticWorkload(Base):
    """Sessions of many turns: a task, then tool results, each after the answer (module docstring)."""

    kind = "agentic"
    agent: AgentProfile
    sub: AgentProfile | None = None
    sub_probability: float = 0.0
    sub_count: Distribution = Fixed(value=1)

    def _agent(
        self, p: AgentProfile, key: tuple[int, ...], child: bool, children: Callable[[int], tuple[Session, ...]] | None
    ) -> tuple[Turn, ...]:
        tag_len, tag_text = (_TAG_CHILD_LEN, _TAG_CHILD_TEXT) if child else (TAG_LEN, TAG_TEXT)
        tag_follow = _TAG_CHILD_FOLLOW if child else _TAG_FOLLOW
        g = rng(self.seed, tag_len, *key)
        n = p.turns.one(g)
        lens = p.tool_result.sample(g, n)
        lens[0] = p.first.one(g)
        outs, thinks = p.output.sample(g, n), p.think.sample(g, n)
        # drawn after the rest, from a stream of its own: a spec without follow-ups is unchanged
        follows = p.follow_up.sample(rng(self.seed, tag_follow, *key), n) if p.follow_up is not None else None
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
            follows=follows,
            follow_rng=lambda k: rng(self.seed, tag_follow, *key, k, 1),
        )

    def _children(self, j: int, k: int) -> tuple[Session, ...]:
        sub = self.sub
        if sub is None or self.sub_probability <= 0:
            return ()
        g = rng(self.seed, _TAG_CHILD_LEN, j, k)
        if g.random() >= self.sub_probability:
            return ()
        return tuple(
            Session(session=j, turns=self._agent(sub, (j, k, c), True, None), system=sub.system, extra=sub.tools.body())
            for c in range(self.sub_count.one(g))
        )

    def _build(self, j: int) -> Session:
        turns = self._agent(self.agent, (j,), False, lambda k: self._children(j, k))
        return Session(session=j, turns=turns, system=self.agent.system, extra=self.agent.tools.body())

    def _describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"agent": self.agent.describe()}
        if self.sub is not None:
            d["subagents"] = {
                "probability": self.sub_probability,
                "count": self.sub_count.describe(),
                **self.sub.describe(),
            }
        return d


def _profile(f: Fields, ts: TextSource, seed: int, tag: int, parent: AgentProfile | None) -> AgentProfile:
    """The parent agent's profile (its lengths required), or the subagents' (any field
    left out is the parent's)."""

    def dist(key: str, default: Distribution | None = None, integer: bool = True) -> Distribution:
        d = getattr(parent, key) if parent is not None else default
        return parse_distribution(f, key, integer=integer, default=d)

    system, system_tokens = shared_system(f, "system", ts, seed, tag)
    follow_up = parent.follow_up if parent is not None else None
    if f.has("follow_up"):
        follow_up = parse_distribution(f, "follow_up")
    else:
        f.raw("follow_up", None)
    return AgentProfile(
        system=system,
        system_tokens=system_tokens,
        first=dist("first"),
        turns=dist("turns"),
        tool_result=dist("tool_result"),
        output=dist("output"),
        think=dist("think", Fixed(value=0.0, integer=False), integer=False),
        max_context=f.number("max_context", parent.max_context if parent else None, integer=True, ge=1),
        tools=parse_tools(f, parent.tools if parent is not None else None),
        follow_up=follow_up,
    )


def build_agentic(f: Fields, common: dict[str, Any]) -> AgenticWorkload:
    ts, seed = common["text"], common["seed"]
    agent = _profile(f, ts, seed, TAG_SYSTEM, None)
    s = f.sub("subagents", None)
    if s is None:
        return AgenticWorkload(**common, agent=agent)
    prob = s.number("probability", ge=0, le=1)
    count = parse_distribution(s, "count", default=Fixed(value=1))
    sub = _profile(s, ts, seed, _TAG_SUBSYSTEM, agent)
    s.finish()
    return AgenticWorkload(**common, agent=agent, sub=sub, sub_probability=float(prob), sub_count=count)
