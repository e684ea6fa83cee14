"""Embeddings and rerank traffic: the request bodies, and a workload of them.

Two pooled APIs, each one non-streamed JSON request and answer (no output tokens):

- ``embeddings``: ``POST {base}/embeddings``, OpenAI's shape, ``{"model", "input": [...]}``
  with one string per input (``encoding_format`` is left to the server's default, float).
- ``rerank``: ``POST {base}/rerank`` (``/v1/rerank`` with the usual ``/v1`` base), the shape
  vLLM, Jina and Cohere share (and TEI's OpenAI-style route): ``{"model", "query",
  "documents": [...], "top_n"}``, answered with ``results``. vLLM serves the same body at
  ``/rerank``, ``/v1/rerank`` and ``/v2/rerank``; loadgen sends it under the endpoint's
  base URL, so ``--endpoint http://host:8000`` reaches ``/rerank``. TEI's native ``/rerank``
  takes ``texts``, not ``documents``: use its OpenAI-compatible route, or ``--extra-body``.

A pooled request's size is its **batch** (inputs per request: texts to embed, or documents
to rank against one query) and the **length** of each input in tokens; the workload draws
both per request. Its one turn has ``max_tokens`` 0 and ``prompt_tokens`` the whole batch's
requested tokens (rerank: the query once per document, as a cross-encoder reads each pair).
The pooled fields travel in ``Session.extra`` (``input``, or ``query``/``documents``/``top_n``):
``build_pooled_body`` writes ``{"model", **extra}``, so ``--extra-body`` fields merge as for chat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from loadgen.specfile import Fields
from loadgen.workload.distributions import Distribution, Fixed, parse_distribution
from loadgen.workload.session import Session, Turn
from loadgen.workload.text import TextSource, rng

__all__ = ["POOLED_APIS", "PooledWorkload", "build_pooled", "build_pooled_body", "expected_items", "inputs_sent"]

POOLED_APIS = ("embeddings", "rerank")
_TAG_SIZE, _TAG_TEXT = 0xE3BED, 0xE3BEE


def build_pooled_body(model: str, fields: dict[str, Any]) -> bytes:
    """The JSON body of one pooled request: ``model`` first, then ``fields`` (the session's
    ``extra`` merged over ``--extra-body``); never streamed."""
    return orjson.dumps({"model": model, **fields})


def inputs_sent(api: str, fields: dict[str, Any]) -> int | None:
    """How many inputs (embeddings) or documents (rerank) a request sends; None when its
    fields do not say."""
    items = fields.get("input" if api == "embeddings" else "documents")
    if isinstance(items, str):
        return 1
    return len(items) if isinstance(items, list) else None


def expected_items(api: str, fields: dict[str, Any]) -> int | None:
    """How many embeddings or results the answer should hold: one per input; for rerank
    ``min(top_n, documents)``. None when the body's fields do not say."""
    n = inputs_sent(api, fields)
    top_n = fields.get("top_n") if api == "rerank" else None
    if n is not None and isinstance(top_n, int) and not isinstance(top_n, bool) and top_n >= 0:
        return min(top_n, n)
    return n


@dataclass(frozen=True)
class PooledWorkload:
    """Embeddings or rerank requests of a drawn batch size and input length.

    ``batch``: inputs per request (documents per query for rerank); ``input``: tokens per
    input; ``query``: rerank's query tokens; ``top_n``: rerank's results asked for (None:
    all). Session ``i`` is a pure function of (the fields, ``seed``, ``i``). ``salt`` starts
    every input (embeddings) or the query (rerank) with a run-specific word, so prefix
    caches start cold per load point, as for chat.
    """

    api: str = "embeddings"
    batch: Distribution = field(default_factory=lambda: Fixed(value=1))
    input: Distribution = field(default_factory=lambda: Fixed(value=128))
    query: Distribution = field(default_factory=lambda: Fixed(value=16))
    top_n: int | None = None
    seed: int = 0
    text: TextSource = field(default_factory=TextSource)
    name: str = ""

    def __post_init__(self) -> None:
        if self.api not in POOLED_APIS:
            raise ValueError(f"api must be one of {POOLED_APIS}, not {self.api!r}")
        if not self.name:
            object.__setattr__(self, "name", f"synthetic-{self.api}")

    @property
    def size(self) -> int | None:
        return None

    def session(self, i: int) -> Session:
        g = rng(self.seed, _TAG_SIZE, i)
        n = max(1, int(self.batch.one(g)))
        lens = [max(1, int(x)) for x in self.input.sample(g, n)]
        t = rng(self.seed, _TAG_TEXT, i)
        salt, salt_n = self.text.prefix(0)
        texts = [self.text.words(k, t) for k in lens]
        if self.api == "embeddings":
            inputs = [salt + x for x in texts]
            extra: dict[str, Any] = {"input": inputs}
            tokens, head = sum(lens) + n * salt_n, inputs[0]
        else:
            q = max(1, int(self.query.one(g)))
            head = salt + self.text.words(q, t)
            extra = {"query": head, "documents": texts}
            if self.top_n is not None:
                extra["top_n"] = self.top_n
            tokens = sum(lens) + n * (q + salt_n)
        turn = Turn(text=head, max_tokens=0, prompt_tokens=tokens)
        return Session(session=i, turns=(turn,), extra=extra, salt=salt)

    def offsets_ns(self) -> npt.NDArray[np.int64] | None:
        return None

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "kind": self.api,
            "seed": self.seed,
            "salt": self.text.salt,
            "batch": self.batch.describe(),
            "input": self.input.describe(),
            **self.text.describe(),
        }
        if self.api == "rerank":
            d["query"] = self.query.describe()
            d["top_n"] = self.top_n
        return d


def build_pooled(kind: str, f: Fields, common: dict[str, Any]) -> PooledWorkload:
    """A spec of kind ``embeddings`` or ``rerank``: ``batch`` (inputs, or documents, per
    request), ``input`` (tokens per input), and for rerank ``query`` (tokens) and ``top_n``."""
    top_n = f.number("top_n", None, integer=True, ge=1) if kind == "rerank" else None
    return PooledWorkload(
        api=kind,
        batch=parse_distribution(f, "batch", default=Fixed(value=1)),
        input=parse_distribution(f, "input"),
        query=parse_distribution(f, "query", default=Fixed(value=16)) if kind == "rerank" else Fixed(value=16),
        top_n=None if top_n is None else int(top_n),
        seed=common["seed"],
        text=common["text"],
        name=common["name"],
    )
