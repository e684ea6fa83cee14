"""Replay of coding-agent session traces (``format: agentic``, the ``kv-cache-tester`` format).

Agent traffic is what stresses a prefix cache most: long sessions whose context
only grows, subagents that share a system and tool prefix, think times that
include tool runs. These traces record exactly that (lengths, hash-id blocks and
timings, no text), so replaying them reproduces the cache pressure of a real
coding agent.

One JSON object per session (a file holds one, an array or JSONL of them; a folder,
its ``*.json`` files)::

    {"id": "trace_0010", "block_size": 64, "hash_id_scope": "local",
     "requests": [
        {"t": 0.0, "type": "n", "in": 17209, "out": 275, "hash_ids": [1, 2, ...], "think_time": 0.0},
        {"t": 100.65, "type": "subagent", "agent_id": "agent_001", "requests": [...]},
        {"t": 107.0, "type": "n", "in": 22038, "out": 162, "hash_ids": [...], "think_time": 98.0},
        ...]}

How it maps to ``Session``s:

- The first request's text is its ``hash_ids`` blocks (same id, same text: the
  subagents of a file share their system/tool prefix this way; scope ``local``
  keys ids by file, ``global`` shares them across files), then filler up to ``in``.
- A later request appends the tokens the trace's context grew by, beyond the
  previous answer the engine appends itself: ``in_k - in_(k-1) - out_(k-1)``.
  When the agent dropped context (earlier thinking, or a compaction: ``in``
  shrank), the replayed context cannot shrink; that turn appends one token, the
  context stays larger than the trace's by the difference from then on, and the
  count is in ``describe()`` (``context_shrinks``).
  ``max_context`` ends a session before a turn that would not fit.
- ``think_time`` (seconds from the previous answer to this request, divided by
  ``speed`` and capped by ``max_think``) is ``Turn.think_ns``. Subagent entries
  become ``children`` of the next parent request: the engine starts them when the
  previous answer ends and sends the turn at max(think, last child done), which is
  how the recorded ``think_time`` (that includes the subagents' run) came about.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from loadgen.errors import SpecError
from loadgen.workload.base import Base
from loadgen.workload.session import Session, Turn
from loadgen.workload.text import rng, str_key
from loadgen.workload.traces.blocks import Blocks
from loadgen.workload.traces.fields import plain_number, read_bytes, whole_number

__all__ = ["AgentRequest", "AgentTrace", "AgenticTrace", "read_agentic"]

_TAG_TEXT = 31


@dataclass(frozen=True)
class AgentRequest:
    inp: int
    out: int
    think_s: float
    hash_ids: npt.NDArray[np.int64]
    children: tuple[AgentTrace, ...] = ()


@dataclass(frozen=True)
class AgentTrace:
    """One agent's requests; ``path`` locates it in its file (subagents nest)."""

    name: str
    scope: int
    block: int
    path: tuple[int, ...]
    requests: tuple[AgentRequest, ...]
    dropped: int = 0  # subagents after the last request: nothing waits for them


def _parse(reqs: Any, where: str, name: str, scope: int, block: int, path: tuple[int, ...]) -> AgentTrace:
    if not isinstance(reqs, list):
        raise SpecError(f"{where}: requests: must be a list")
    out: list[AgentRequest] = []
    pending: list[AgentTrace] = []
    for n, r in enumerate(reqs):
        at = f"{where}: requests[{n}]"
        if not isinstance(r, dict):
            raise SpecError(f"{at}: must be a mapping")
        if r.get("type") == "subagent":
            sub = str(r.get("agent_id", f"{name}/{n}"))
            pending.append(_parse(r.get("requests"), at, sub, scope, block, (*path, n)))
            continue
        ids = r.get("hash_ids", [])
        if not isinstance(ids, list):
            raise SpecError(f"{at}: hash_ids: must be a list of whole numbers")
        out.append(
            AgentRequest(
                inp=whole_number(r.get("in"), at, "in"),
                out=whole_number(r.get("out"), at, "out"),
                think_s=plain_number(r.get("think_time", 0.0), at, "think_time"),
                hash_ids=np.asarray([whole_number(h, at, "hash_ids") for h in ids], dtype=np.int64),
                children=tuple(pending),
            )
        )
        pending = []
    if not out:
        raise SpecError(f"{where}: requests: no request in this agent")
    return AgentTrace(name=name, scope=scope, block=block, path=path, requests=tuple(out), dropped=len(pending))


def _objects(path: Path) -> list[tuple[str, Any]]:
    data = read_bytes(path)
    try:
        doc = orjson.loads(data)
        objs = doc if isinstance(doc, list) else [doc]
        return [(f"{path}: session {n}" if len(objs) > 1 else str(path), o) for n, o in enumerate(objs)]
    except orjson.JSONDecodeError as e:
        if len(data.strip().splitlines()) < 2:
            raise SpecError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    out = []
    for ln, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                out.append((f"{path}:{ln}", orjson.loads(line)))
            except orjson.JSONDecodeError as e:
                raise SpecError(f"{path}:{ln}: not valid JSON ({e.msg})") from None
    return out


def read_agentic(path: Path, block_tokens: int | None = None) -> list[AgentTrace]:
    """Sessions from a file (object, array or JSONL) or a folder of ``*.json`` files."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise SpecError(f"{path}: no *.json session files in this folder")
    traces = []
    for file in files:
        for where, obj in _objects(file):
            if not isinstance(obj, dict) or "requests" not in obj:
                raise SpecError(f"{where}: expected a session object with 'requests'")
            name = str(obj.get("id", file.stem))
            block = block_tokens or whole_number(obj.get("block_size", 64), where, "block_size", 1)
            scope = 0 if obj.get("hash_id_scope") == "global" else str_key(f"{file.name}/{name}")
            traces.append(_parse(obj["requests"], where, name, scope, block, ()))
    return traces


@dataclass(frozen=True)
class _Plan:
    lens: tuple[int, ...]  # tokens appended by each kept turn
    prompts: tuple[int, ...]
    outs: tuple[int, ...]
    shrinks: int


@dataclass(frozen=True, kw_only=True)
class AgenticTrace(Base):
    """Recorded agent sessions, one ``Session`` per file session; see the module docstring."""

    kind = "trace"
    format: str = "agentic"
    path: str
    traces: tuple[AgentTrace, ...]
    speed: float = 1.0
    max_think_s: float | None = None
    max_context: int | None = None
    output_tokens: int | None = None
    max_output: int | None = None

    @cached_property
    def _blocks(self) -> Blocks:
        return Blocks(self.text, self.seed)

    @property
    def size(self) -> int | None:
        return len(self.traces)

    def _plan(self, a: AgentTrace) -> _Plan:
        lens, prompts, outs, ctx, shrinks = [], [], [], 0, 0
        for k, r in enumerate(a.requests):
            out = self.output_tokens or max(1, r.out)
            if self.max_output:
                out = min(out, self.max_output)
            # growth of the trace's own context beyond its previous answer, so that
            # after a compaction the replay grows as the trace did (with an offset)
            prev = a.requests[k - 1] if k else None
            n = r.inp - (prev.inp + prev.out if prev else 0)
            if n < 1:
                shrinks += k > 0
                n = 1
            if k and self.max_context is not None and ctx + n + out > self.max_context:
                break
            lens.append(n)
            prompts.append(ctx + n)
            outs.append(out)
            ctx += n + out
        return _Plan(tuple(lens), tuple(prompts), tuple(outs), shrinks)

    def _turns(self, a: AgentTrace, j: int) -> tuple[Turn, ...]:
        plan = self._plan(a)
        turns = []
        for k, n in enumerate(plan.lens):
            r = a.requests[k]
            fill = partial(rng, self.seed, _TAG_TEXT, j, *a.path, k)
            if k == 0:
                text = self._blocks.text(a.scope, r.hash_ids, n, a.block, fill)
            else:
                text = self.text.words(n, fill())
            think = r.think_s if self.max_think_s is None else min(r.think_s, self.max_think_s)
            children = tuple(Session(session=j, turns=self._turns(c, j)) for c in r.children)
            turns.append(
                Turn(
                    text=text,
                    max_tokens=plan.outs[k],
                    prompt_tokens=plan.prompts[k],
                    think_ns=round(think / self.speed * 1e9) if k else 0,
                    role="tool" if k else "user",
                    children=children,
                )
            )
        return tuple(turns)

    def _build(self, j: int) -> Session:
        return Session(session=j, turns=self._turns(self.traces[j], j))

    @cached_property
    def stats(self) -> dict[str, Any]:
        agents = requests = shrinks = dropped = cut = 0
        stack = list(self.traces)
        while stack:
            a = stack.pop()
            plan = self._plan(a)
            agents += 1
            requests += len(plan.lens)
            shrinks += plan.shrinks
            dropped += a.dropped
            cut += len(a.requests) - len(plan.lens)
            stack.extend(c for r in a.requests[: len(plan.lens)] for c in r.children)
        return {
            "sessions": len(self.traces),
            "subagents": agents - len(self.traces),
            "requests": requests,
            "context_shrinks": shrinks,
            "cut_by_max_context": cut,
            "dropped_trailing_subagents": dropped,
        }

    def _describe(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "path": self.path,
            "speed": self.speed,
            "max_think_s": self.max_think_s,
            "max_context": self.max_context,
            "output_tokens": self.output_tokens,
            "max_output": self.max_output,
            "block_tokens": sorted({t.block for t in self.traces}),
            **self.stats,
        }
