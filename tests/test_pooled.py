"""Embeddings and rerank: the answer reader on byte literals, the workload's bodies, the
simulator's routes (read by the official ``openai`` client and the reader), and the figures."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import openai
import orjson
import pyarrow as pa
import pytest

from loadgen.analysis.pooled import pooled_figures
from loadgen.client.protocol.chunk_errors import StreamError
from loadgen.client.protocol.pooled_answer import MAX_ENVELOPE_BYTES, PooledAnswer
from loadgen.client.protocol.sse import BadStream
from loadgen.records import SCHEMA, Record, to_batch
from loadgen.sim.answer import SimConfig
from loadgen.sim.model import FixedModel
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.server import SimServer
from loadgen.sim.step_cost import StepCost
from loadgen.workload.distributions import Fixed
from loadgen.workload.pooled import PooledWorkload, build_pooled_body, expected_items

T = TypeVar("T")
EMBED = (
    b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]},'
    b'{"object":"embedding","index":1,"embedding":[0.3,0.4]}],"model":"m",'
    b'"usage":{"prompt_tokens":12,"total_tokens":12}}'
)
RERANK = (
    b'{"id":"r","model":"m","usage":{"total_tokens":30},"results":['
    b'{"index":1,"document":{"text":"a \\"]} [{ \\\\"},"relevance_score":0.9},'
    b'{"index":0,"document":{"text":"b"},"relevance_score":0.1}]}'
)


def read(api: str, body: bytes, step: int | None = None, expected: int | None = None) -> PooledAnswer:
    a = PooledAnswer(api, expected=expected)
    step = step or len(body)
    for k in range(0, len(body), step):
        a.feed(body[k : k + step], 1000 + k)
    a.close(5000)
    return a


# -- the reader --------------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 2, 3, 7, None])
def test_an_embeddings_answer_gives_its_usage_and_count_however_it_is_split(step: int | None) -> None:
    a = read("embeddings", EMBED, step, expected=2)
    assert (a.items, a.prompt_tokens, a.end, a.events, a.problems) == (2, 12, "done", 1, [])
    assert a.chunk_ns == [] and a.reconcile() == ([], 0, "none")  # no output: TTFT stays null
    assert a.t_output == 1000 and a.t_read == 1000 + (len(EMBED) - 1) // (step or len(EMBED)) * (step or 0)


@pytest.mark.parametrize("step", [1, 5, None])
def test_a_rerank_answer_counts_results_past_brackets_and_escapes_in_documents(step: int | None) -> None:
    a = read("rerank", RERANK, step, expected=2)
    assert (a.items, a.prompt_tokens, a.end, a.problems) == (2, 30, "done", [])  # total_tokens: all prompt


def test_a_bare_array_is_the_item_list() -> None:
    a = read("rerank", b'[{"index":0,"score":0.5},{"index":1,"score":0.2}]', 4, expected=2)
    assert (a.items, a.prompt_tokens, a.end) == (2, None, "done")


def test_a_count_other_than_the_inputs_sent_is_a_problem() -> None:
    assert read("embeddings", EMBED, expected=3).problems == ["answer has 2 embeddings, 3 expected"]


def test_impossible_usage_is_bounded_and_said() -> None:
    a = read("embeddings", b'{"data":[{"embedding":[1]}],"usage":{"prompt_tokens":-4,"total_tokens":1e12}}')
    assert a.prompt_tokens is None and len(a.problems) == 2 and "impossible" in a.problems[0]


def test_a_cut_short_answer_is_eof_and_an_empty_or_foreign_one_fails() -> None:
    a = read("embeddings", EMBED[:-30])
    assert (a.end, a.done, a.events, a.prompt_tokens) == ("eof", False, 1, None)
    with pytest.raises(BadStream, match="not JSON"):
        read("embeddings", b"<html>bad gateway</html>")
    with pytest.raises(BadStream, match="empty"):
        read("embeddings", b" \n")
    with pytest.raises(BadStream, match="not JSON"):
        read("embeddings", b'{"data":[]]}')


def test_an_error_object_in_a_200_answer_raises_with_its_message() -> None:
    with pytest.raises(StreamError, match="input too long"):
        read("embeddings", b'{"object":"error","message":"input too long","code":400}')


def test_megabytes_of_vectors_are_counted_not_kept() -> None:
    vec = b"[" + b",".join([b"-0.0123456789"] * 4096) + b"]"
    items = b",".join(b'{"object":"embedding","index":%d,"embedding":%b}' % (k, vec) for k in range(64))
    body = b'{"object":"list","data":[' + items + b'],"model":"m","usage":{"prompt_tokens":640,"total_tokens":640}}'
    assert len(body) > 3_000_000
    a = PooledAnswer("embeddings", expected=64)
    biggest = 0
    for k in range(0, len(body), 65536):
        a.feed(body[k : k + 65536], k)
        biggest = max(biggest, len(a._kept))
    assert (a.items, a.prompt_tokens, a.end) == (64, 640, "done")
    assert biggest < 200  # the envelope only, never a vector


def test_size_caps_hold() -> None:
    with pytest.raises(BadStream, match="over 100 bytes"):
        a = PooledAnswer("embeddings", max_answer_bytes=100)
        a.feed(b"[" + b"1," * 60, 1)
    huge = b'{"model":"' + b"x" * (MAX_ENVELOPE_BYTES + 10) + b'","data":[[1]],"usage":{"prompt_tokens":3}}'
    a = read("embeddings", huge, 4096)
    assert a.end == "done" and a.prompt_tokens is None and "not read" in a.problems[0]


# -- the workload ------------------------------------------------------------------------
def test_the_workload_builds_batches_of_the_asked_size_and_bodies_in_the_common_shapes() -> None:
    w = PooledWorkload("embeddings", batch=Fixed(value=4), input=Fixed(value=10))
    s = w.session(3)
    assert s == w.session(3) and len(s.extra["input"]) == 4 and s.turns[0].prompt_tokens == 40
    assert s.turns[0].max_tokens == 0 and expected_items("embeddings", s.extra) == 4
    assert list(orjson.loads(build_pooled_body("m", s.extra))) == ["model", "input"]
    r = PooledWorkload("rerank", batch=Fixed(value=5), input=Fixed(value=8), query=Fixed(value=3), top_n=2).session(0)
    assert set(r.extra) == {"query", "documents", "top_n"} and len(r.extra["documents"]) == 5
    assert expected_items("rerank", r.extra) == 2 and r.turns[0].prompt_tokens == 5 * (8 + 3)


# -- the simulator -----------------------------------------------------------------------
def served(model: Any, go: Callable[[str], Awaitable[T]]) -> T:
    async def main() -> T:
        server = SimServer(model, SimConfig(model_name="sim"))
        url = await server.start()
        try:
            return await go(url)
        finally:
            await server.stop()

    return asyncio.run(main())


def test_the_openai_client_reads_the_simulators_embeddings() -> None:
    async def go(url: str) -> Any:
        client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
        try:
            return await client.embeddings.create(model="sim", input=["one two three", "four five"])
        finally:
            await client.close()

    got = served(FixedModel(0.002, 0.001), go)
    assert [d.index for d in got.data] == [0, 1] and len(got.data[0].embedding) == 16
    assert got.usage.prompt_tokens == got.usage.total_tokens == 5


async def post(url: str, path: str, body: bytes) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url.removesuffix("/v1") + path, data=body) as r:
        return r.status, await r.read()


def test_the_simulators_rerank_answers_in_the_common_shape_and_costs_a_prefill() -> None:
    model = RooflineModel("h100", "llama-3.1-8b", max_num_seqs=8)
    docs = ["alpha beta", "gamma", "delta epsilon zeta"]
    body = build_pooled_body("sim", {"query": "which one", "documents": docs, "top_n": 2})

    async def go(url: str) -> list[tuple[int, bytes]]:
        return [await post(url, p, body) for p in ("/v1/rerank", "/rerank")] + [
            await post(url, "/v1/rerank", build_pooled_body("other", {"query": "q", "documents": ["d"]}))
        ]

    (s1, b1), (s2, b2), (s3, _) = served(model, go)
    assert (s1, s2, s3) == (200, 200, 404)
    out = orjson.loads(b1)
    assert set(out) == {"id", "model", "usage", "results"} and len(out["results"]) == 2
    scores = [r["relevance_score"] for r in out["results"]]
    assert scores == sorted(scores, reverse=True) and all(
        docs[r["index"]] == r["document"]["text"] for r in out["results"]
    )
    assert out["usage"]["total_tokens"] == 3 * 2 + 2 + 1 + 3  # the query read once per document
    a = read("rerank", b2, 7, expected=2)
    assert (a.items, a.prompt_tokens, a.problems) == (2, 12, [])
    assert isinstance(model, StepCost) and model.stats()["generation_tokens_total"] == 0  # prefill only


# -- the figures -------------------------------------------------------------------------
MS = 1_000_000


def test_the_figures_of_hand_made_records() -> None:
    recs = [
        Record(t_sched=k * 100 * MS, t_done=k * 100 * MS + (10 + k) * MS, prompt_tokens_reported=50, api="embeddings")
        for k in range(10)
    ]
    recs[3].prompt_tokens_reported = None
    recs[3].prompt_tokens_requested = 40
    recs.append(Record(t_sched=5 * MS, status="http_error", api="embeddings"))
    table = pa.Table.from_batches([to_batch(recs)], schema=SCHEMA)
    f = pooled_figures(table, inputs_per_request=4)
    span = (900 + 19) / 1000  # first intended instant to the last answer's end, s
    assert (f["requests"], f["failed"], f["tokens_unreported"]) == (10, 1, 1)
    assert (f["e2e_p50_ms"], f["e2e_p99_ms"]) == (14.0, 19.0)
    assert f["requests_per_s"] == pytest.approx(10 / span) and f["inputs_per_s"] == pytest.approx(40 / span)
    assert f["input_tokens_per_s"] == pytest.approx((9 * 50 + 40) / span)
    assert pooled_figures(table)["inputs_per_s"] is None  # no inputs column, no batch size: unknown
