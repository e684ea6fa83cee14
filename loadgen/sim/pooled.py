"""The simulator's pooled endpoints: ``POST /v1/embeddings`` and ``POST /v1/rerank`` (also ``/rerank``).

A pooled request is prefill only: every input (embeddings) or every query-document pair
(rerank, a cross-encoder reads the two as one sequence, query first) goes to the timing model
as a request of its own with ``max_tokens`` 0, so the roofline engine (roofline.py) batches
its prefill with everything else running, at the same step cost (step_cost.py), and it ends
when its last prefill chunk's step ends; no token is emitted. The answer goes out when every
input of the request is done. Under the fixed-latency model (``FixedModel``), a pooled request
takes its ``ttft_s``, whatever its size.

Shapes: embeddings as OpenAI's (``{"object": "list", "data": [{"object": "embedding",
"index", "embedding": [...]}], "model", "usage": {"prompt_tokens", "total_tokens"}}``), each
vector ``DIMS`` floats, a pure function of the input; rerank as vLLM's (``{"id", "model",
"usage": {"total_tokens"}, "results": [{"index", "document": {"text"}, "relevance_score"}]}``),
best first, ``top_n`` of them when asked. Errors as the chat routes': a wrong model is 404, a
malformed body or an input past ``max_model_len`` is 400. Faults and the truth file are the
chat routes' only: pooled requests take no fault-plan number and write no truth line.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import orjson
from aiohttp import web

from loadgen.clock import sleep_until
from loadgen.sim.answer import SimConfig
from loadgen.sim.model import FixedModel, SimRequest, TimingModel
from loadgen.workload.tokenizer import BUILTIN

__all__ = ["DIMS", "Host", "pooled_routes"]

DIMS = 16  # floats per simulated embedding (small: the simulator's answers stay cheap to write)
_ARRIVAL_NS, _INPUT_NS = 400_000, 20_000  # front-end work per request and per input (server.py's estimate)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Host(Protocol):
    """What the pooled routes use of the server (``SimServer``)."""

    model: TimingModel
    config: SimConfig


def pooled_routes(server: Host) -> list[web.RouteDef]:
    """The routes to add to the server's application."""
    embed: _Handler = partial(_embeddings, server)
    rerank: _Handler = partial(_rerank, server)
    return [web.post("/v1/embeddings", embed), web.post("/v1/rerank", rerank), web.post("/rerank", rerank)]


def _error(status: int, message: str, etype: str = "invalid_request_error", code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    return web.json_response(body, status=status)


async def _body(server: Host, request: web.Request) -> dict[str, Any] | web.Response:
    await server.model.headroom(_ARRIVAL_NS)
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _error(400, "request body is not valid JSON")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    if body.get("model") not in (None, server.config.model_name):
        return _error(
            404, f"The model `{str(body.get('model'))[:100]}` does not exist.", "NotFoundError", "model_not_found"
        )
    return body


def _texts(value: object, name: str) -> list[str] | web.Response:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return _error(400, f"'{name}' is required: a string or a non-empty list of strings")


async def _prefill(server: Host, prompts: list[list[int]], arrival: int) -> web.Response | None:
    """Run every prompt's prefill on the timing model; None when all are done."""
    limit = server.config.max_model_len
    longest = max(len(p) for p in prompts)
    if longest > limit:
        return _error(
            400,
            f"This model's maximum context length is {limit} tokens; an input has {longest}.",
            code="context_length_exceeded",
        )
    model = server.model
    await model.headroom(_INPUT_NS * len(prompts))
    reqs = [
        SimRequest(rid=f"pool-{arrival}-{k}", prompt_ids=p, max_tokens=0, arrival_ns=arrival)
        for k, p in enumerate(prompts)
    ]
    try:
        for r in reqs:
            model.submit(r)
        for r in reqs:
            while not r.finished:
                await r.wait()
        if isinstance(model, FixedModel):  # no prefill cost of its own: its fixed latency
            await sleep_until(arrival + model.ttft_ns, model.clock)
    finally:
        for r in reqs:
            if not r.finished:
                model.cancel(r)
    return None


def _vector(text: str) -> list[float]:
    """A unit-free, deterministic vector for ``text`` (DIMS values in [-1, 1))."""
    digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=DIMS).digest()
    return [round(b / 128 - 1, 6) for b in digest]


async def _embeddings(server: Host, request: web.Request) -> web.StreamResponse:
    arrival = time.perf_counter_ns()
    body = await _body(server, request)
    if isinstance(body, web.Response):
        return body
    texts = _texts(body.get("input"), "input")
    if isinstance(texts, web.Response):
        return texts
    prompts = [BUILTIN.encode(t) for t in texts]
    failed = await _prefill(server, prompts, arrival)
    if failed is not None:
        return failed
    tokens = sum(len(p) for p in prompts)
    data = [{"object": "embedding", "index": k, "embedding": _vector(t)} for k, t in enumerate(texts)]
    out = {
        "object": "list",
        "data": data,
        "model": server.config.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return web.Response(body=orjson.dumps(out), content_type="application/json")


async def _rerank(server: Host, request: web.Request) -> web.StreamResponse:
    arrival = time.perf_counter_ns()
    body = await _body(server, request)
    if isinstance(body, web.Response):
        return body
    query, docs = body.get("query"), _texts(body.get("documents"), "documents")
    if isinstance(docs, web.Response):
        return docs
    if not isinstance(query, str):
        return _error(400, "'query' is required: a string")
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
        return _error(400, "'top_n' must be a non-negative integer")
    q = BUILTIN.encode(query)
    prompts = [q + BUILTIN.encode(d) for d in docs]
    failed = await _prefill(server, prompts, arrival)
    if failed is not None:
        return failed
    scores = [(_vector(query + "\x00" + d)[0] + 1) / 2 for d in docs]
    order = sorted(range(len(docs)), key=lambda k: -scores[k])[: len(docs) if top_n is None else top_n]
    results = [{"index": k, "document": {"text": docs[k]}, "relevance_score": scores[k]} for k in order]
    tokens = sum(len(p) for p in prompts)
    out = {
        "id": f"rerank-{arrival}",
        "model": server.config.model_name,
        "usage": {"total_tokens": tokens},
        "results": results,
    }
    return web.Response(body=orjson.dumps(out), content_type="application/json")
