"""ShareGPT replay (``format: sharegpt``): real multi-turn conversation text.

The other traces give lengths only; ShareGPT gives what people actually typed,
so it is the trace to use when the text itself matters (a tokenizer's real
ratio, a speculative decoder's acceptance, an answer cache). A JSON array or
JSONL of ``{conversations: [{from, value}]}`` (``messages: [{role, content}]``
is read too). It has no timestamps: conversations arrive per the arrival spec.

Each human message is a turn, sent as recorded; its answer is asked for at the
recorded answer's length under the workload's tokenizer (with ``ignore_eos`` the
engine then appends an answer that long, so the next turn's ``prompt_tokens`` is
what the endpoint sees). Consecutive human messages are joined; a human message
with no answer after it ends the conversation; a conversation with no answered
human message is skipped (counted in ``describe()``). The file is read once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadgen.errors import SpecError
from loadgen.workload.base import Base
from loadgen.workload.distributions import Distribution, Fixed
from loadgen.workload.session import Session, Turn
from loadgen.workload.text import rng
from loadgen.workload.traces.fields import field_error, read_bytes

__all__ = ["RecordedConversation", "read_sharegpt", "ShareGPTTrace"]

_TAG_THINK = 41

_HUMAN, _GPT, _SYSTEM = ("human", "user"), ("gpt", "assistant", "chatgpt", "bard", "model"), ("system",)


@dataclass(frozen=True)
class RecordedConversation:
    system: str | None
    pairs: tuple[tuple[str, str], ...]  # (human text, recorded answer)


def _load_json_records(path: Path) -> list[Any]:
    data = read_bytes(path)
    if data.lstrip()[:1] == b"[":
        try:
            recs = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise SpecError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        return list(recs)
    recs = []
    for ln, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                recs.append(orjson.loads(line))
            except orjson.JSONDecodeError as e:
                raise SpecError(f"{path}:{ln}: not valid JSON ({e.msg})") from None
    return recs


def read_sharegpt(path: Path) -> tuple[list[RecordedConversation], int]:
    """Conversations with at least one answered human turn, and how many were skipped."""
    convs: list[RecordedConversation] = []
    skipped = 0
    for n, rec in enumerate(_load_json_records(path)):
        where = f"{path}: record {n}"
        msgs = rec.get("conversations", rec.get("messages")) if isinstance(rec, dict) else None
        if not isinstance(msgs, list):
            raise field_error(where, "conversations", "must be a list of {from, value}")
        system: str | None = None
        pairs: list[tuple[str, str]] = []
        human: str | None = None
        for m, msg in enumerate(msgs):
            if not isinstance(msg, dict):
                raise field_error(where, f"conversations[{m}]", "must be a mapping")
            who, text = msg.get("from", msg.get("role")), msg.get("value", msg.get("content"))
            if not isinstance(who, str) or not isinstance(text, str):
                raise field_error(where, f"conversations[{m}]", "needs string 'from' and 'value'")
            if who in _SYSTEM:
                system = text
            elif who in _HUMAN:
                human = text if human is None else human + "\n" + text
            elif who in _GPT:
                if human is not None:
                    pairs.append((human, text))
                human = None
            else:
                raise field_error(where, f"conversations[{m}].from", f"unknown speaker {who[:20]!r}")
        if pairs:
            convs.append(RecordedConversation(system, tuple(pairs)))
        else:
            skipped += 1
    if not convs:
        raise SpecError(f"{path}: no conversation with an answered human turn")
    return convs, skipped


@dataclass(frozen=True, kw_only=True)
class ShareGPTTrace(Base):
    """Real multi-turn conversations: each human message is a turn whose answer is
    asked for at the recorded answer's length (in the workload's tokenizer)."""

    kind = "trace"
    format: str = "sharegpt"
    path: str
    convs: tuple[RecordedConversation, ...]
    skipped: int = 0
    max_turns: int | None = None
    max_output: int | None = None
    output_tokens: int | None = None
    think: Distribution = Fixed(value=0.0, integer=False)  # seconds between turns

    @property
    def size(self) -> int | None:
        return len(self.convs)

    def _build(self, j: int) -> Session:
        c = self.convs[j]
        pairs = c.pairs[: self.max_turns] if self.max_turns else c.pairs
        thinks = self.think.sample(rng(self.seed, _TAG_THINK, j), len(pairs))
        ctx = self.text.count(c.system) if c.system else 0
        turns = []
        for k, (human, answer) in enumerate(pairs):
            out = self.output_tokens or max(1, self.text.count(answer))
            if self.max_output:
                out = min(out, self.max_output)
            prompt = ctx + self.text.count(human)
            turns.append(
                Turn(
                    text=human, max_tokens=out, prompt_tokens=prompt, think_ns=round(float(thinks[k]) * 1e9) if k else 0
                )
            )
            ctx = prompt + out
        return Session(session=j, turns=tuple(turns), system=c.system)

    def _describe(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "path": self.path,
            "conversations": len(self.convs),
            "skipped": self.skipped,
            "max_turns": self.max_turns,
            "max_output": self.max_output,
            "output_tokens": self.output_tokens,
            "think_s": self.think.describe(),
            "mean_turns": float(np.mean([len(c.pairs) for c in self.convs])),
        }
