"""What the batch scheduler plans with: a sequence as the engine holds it, a step being planned,
and a planned step (plain data shared by ``scheduler`` and its bulk-decode set, ``decode_set``)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.sim.model import SimRequest

__all__ = ["Seq", "StepPlan", "Batch"]


@dataclass(eq=False, slots=True)
class Seq:
    """A request as the engine holds it: its prompt's block hashes, its KV, its progress."""

    req: SimRequest
    prompt_len: int
    hashes: Sequence[int]  # chained hashes of the prompt's full blocks (a BlockChain; empty: cache off)
    computed: int = 0  # tokens whose KV exists
    blocks: int = 0  # blocks held, cached + anonymous
    committed: int = 0  # leading prompt blocks held as cached blocks (``hashes[:committed]``: refs held)
    lost: int = 0  # tokens whose KV its last preemption threw away (to compute again, less cache hits)
    ready_ns: int = 0  # when it may be admitted: its arrival, or when its KV has arrived (disaggregated)
    done: bool = False
    step_tokens: int = 0  # tokens computed in the step planned last (set by _schedule)
    drafts: int = 0  # of those, draft tokens the step verifies (speculative decoding)
    rng: random.Random | None = None  # its draft acceptances, drawn from its id: the same every run
    order: int = 0  # admissions before its last one: the running list is in this order
    # in a DecodeSet (bulk decode): kept as counts from step g0 on; its first block crossing; its bucket
    steady: bool = False
    g0: int = 0
    g_x: int = -1
    bucket: int = -1


@dataclass(slots=True)
class StepPlan:
    """One planned step: what it computes and what it costs."""

    items: list[Seq]  # the sequences computed this step (each one's tokens: ``step_tokens``)
    seconds: float
    steady: int = 0  # and this many steady decodes, one token each, not in ``items`` (bulk decode)
    walked: bool = True  # every running sequence was walked (always, unless bulk decode)


class Batch:
    """A step being planned: the sequences in it, the token budget left, and the totals it is priced by."""

    __slots__ = ("items", "budget", "tokens", "dec_ctx", "pre_attn", "kv", "dec", "dec_seqs", "dec_plain")

    def __init__(self, budget: int) -> None:
        self.items: list[Seq] = []
        self.budget = budget
        self.tokens = self.dec_ctx = self.pre_attn = self.kv = 0
        self.dec = 0  # decode tokens (with speculative decoding, a sequence's verified drafts too)
        self.dec_seqs = self.dec_plain = 0  # decoding sequences and their contexts (+1): the draft's cost

    def add_prefill(self, s: Seq, n: int, c: int) -> None:
        """``n`` prompt tokens of ``s`` after ``c`` already computed (each attends to all before it)."""
        s.step_tokens = n
        self.items.append(s)
        self.budget -= n
        self.pre_attn += n * c + n * (n + 1) // 2
        self.tokens += n
        self.kv += c + n
