"""An end-to-end RAG pipeline: per user request, embed the query, rerank the candidates, generate.

Each user request is a session of stage requests, sent one after another (the next is due
when the previous answer ended), open loop across user requests:

1. ``embed``: the question, embedded (``/v1/embeddings``, one input);
2. ``rerank``: the question against the ``candidates`` documents retrieved for it
   (``/v1/rerank``, ``top_n`` = ``k``);
3. ``generate``: the shared system prompt, the ``k`` top documents and the question (the run's
   API, chat by default), streamed and timed as any other request.

Retrieval is today's ``rag`` workload's: a pool of documents of fixed text, Zipf popularity, the
candidates drawn without replacement. Which ``k`` candidates reach the prompt is the workload's
choice, not the reranker's answer: the first ``k`` in retrieval order (``order: sorted``: in
rank order). So every endpoint sees the same bytes for the same seed (a bake-off compares like
with like, and a prefix cache sees the same reuse); the reranker's answer is checked for its
shape and its number of results like any rerank answer, and its order is left unused.

``stages`` may leave out ``embed`` or ``rerank`` (``generate`` is always last). Each stage
request carries its own body fields (``Turn.extra``) and its stage's name (``Turn.stage``): the
engine sends it to that stage's endpoint and model (``client.stages``). ``prompt_tokens`` per
stage: embed, the question; rerank, every candidate plus the question once per candidate (a
cross-encoder reads each pair); generate, system + the ``k`` documents + the question.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadgen.specfile import Fields
from loadgen.workload.session import Session, Turn
from loadgen.workload.synthetic import TAG_LEN, TAG_TEXT, RagWorkload, rag_fields
from loadgen.workload.text import rng

__all__ = ["RagPipelineWorkload", "STAGES", "build_rag_pipeline", "pooled_stages", "valid_stages"]

STAGES = ("embed", "rerank", "generate")


@dataclass(frozen=True, kw_only=True)
class RagPipelineWorkload(RagWorkload):
    """``k`` of ``candidates`` documents per request, through the stages named in ``stages``.

    (``RagWorkload.k`` here is the candidates retrieved; ``top_k`` the documents in the prompt.)
    """

    kind = "rag-pipeline"
    top_k: int
    stages: tuple[str, ...] = STAGES

    def __post_init__(self) -> None:
        if not valid_stages(self.stages):
            raise ValueError(f"stages {self.stages!r}: {_STAGES_RULE}")
        if not 1 <= self.top_k <= self.k:
            raise ValueError(f"k {self.top_k}: from 1 to candidates ({self.k})")

    def prompt_docs(self, j: int) -> list[int]:
        return self.docs(j)[: self.top_k]

    def session(self, i: int) -> Session:
        """User request ``i``: one turn per stage. The run's salt starts the question of each
        pooled stage and the generating request's context (its system prompt, else its text)."""
        if i < 0:
            raise IndexError(f"session index {i} < 0")
        salt, salt_n = self.text.prefix(0)
        candidates = self.docs(i)
        top = candidates[: self.top_k]
        g = rng(self.seed, TAG_LEN, i)
        q, out = self.question.one(g), self.output.one(g)
        question = self.text.words(q, rng(self.seed, TAG_TEXT, i, 0))
        query, q_n = salt + question, q + salt_n
        turns: list[Turn] = []
        if "embed" in self.stages:
            turns.append(Turn(query, 0, q_n, api="embeddings", stage="embed", extra={"input": [query]}))
        if "rerank" in self.stages:
            docs = [self.doc_text(d) for d in candidates]
            n = int(self.doc_lengths[candidates].sum()) + len(candidates) * q_n
            body = {"query": query, "documents": docs, "top_n": self.top_k}
            turns.append(Turn(query, 0, n, api="rerank", stage="rerank", extra=body))
        text = "".join(self.doc_text(d) for d in top) + question
        prompt = self.system_tokens + salt_n + int(self.doc_lengths[top].sum()) + q
        system = self.system
        if system:
            system = salt + system
        else:
            text = salt + text
        turns.append(Turn(text, out, prompt, stage="generate"))
        return Session(session=i, turns=tuple(turns), system=system, salt=salt)

    def _describe(self) -> dict[str, Any]:
        d = super()._describe()
        d["candidates"] = d.pop("k")
        d["k"] = self.top_k
        d["stages"] = list(self.stages)
        return d


def pooled_stages(workload: object) -> tuple[str, ...]:
    """The stages of ``workload`` that go to pooled endpoints of their own (none unless a pipeline)."""
    return workload.stages[:-1] if isinstance(workload, RagPipelineWorkload) else ()


def build_rag_pipeline(f: Fields, common: dict[str, Any]) -> RagPipelineWorkload:
    """A spec of kind ``rag-pipeline``: ``rag``'s fields, with ``candidates`` (documents
    retrieved for the reranker), ``k`` (of them, into the prompt) and ``stages``."""
    fields = rag_fields(f, common, "candidates")
    top_k = f.number("k", integer=True, ge=1)
    if top_k > fields["k"]:
        raise f.error("k", f"must be <= candidates ({fields['k']})")
    stages = f.raw("stages", list(STAGES))
    if not isinstance(stages, list) or not valid_stages(tuple(stages)):
        raise f.error("stages", _STAGES_RULE)
    return RagPipelineWorkload(**common, **fields, top_k=int(top_k), stages=tuple(stages))


_STAGES_RULE = f"a list of stages from {', '.join(STAGES)}, in that order, ending in generate"


def valid_stages(stages: tuple[Any, ...]) -> bool:
    """Whether ``stages`` names some of ``STAGES``, each once, in order, ending in generate."""
    return (
        bool(stages)
        and stages[-1] == "generate"
        and all(s in STAGES for s in stages)
        and list(stages) == sorted(set(stages), key=STAGES.index)
    )
