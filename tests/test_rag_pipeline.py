"""The rag-pipeline workload end to end: each user request embeds its question, reranks its
candidates and generates with the top k, each stage at its own endpoint and model; the user's
figures (TTFT, E2E, the SLO) are the pipeline's, and the stage breakdown says where the time
went (issue 16)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fake_wire import MS, Answer, FakeTransport, Read, run, sessions

from loadgen.analysis.metrics import SLO, summarize
from loadgen.analysis.pipeline import pipeline_figures, pipeline_view
from loadgen.cli.main import main
from loadgen.client.stages import StageEndpoint
from loadgen.client.transport import Exchange
from loadgen.conformance.gate import gate_run
from loadgen.conformance.slo import load_profile
from loadgen.errors import SpecError
from loadgen.records import Record, to_batch
from loadgen.sim.answer import SimConfig
from loadgen.sim.server import SimServer
from loadgen.sim.thread import serve_in_thread
from loadgen.workload.load import load_workload


def spec(tmp_path: Path, **fields: Any) -> Path:
    doc = {
        "kind": "rag-pipeline",
        "system": 8,
        "documents": {"count": 50, "tokens": {"type": "uniform", "low": 20, "high": 40}},
        "candidates": 5,
        "k": 2,
        "question": 6,
        "output": 4,
        **fields,
    }
    path = tmp_path / "p.yaml"
    path.write_bytes(orjson.dumps(doc))  # JSON is YAML
    return path


def test_a_user_request_is_embed_then_rerank_then_generate_with_the_top_k(tmp_path: Path) -> None:
    w = load_workload(str(spec(tmp_path)), seed=3, salt="s")
    s = w.session(7)
    embed, rerank, generate = s.turns
    assert [(t.stage, t.api) for t in s.turns] == [("embed", "embeddings"), ("rerank", "rerank"), ("generate", "")]
    assert embed.extra == {"input": [embed.text]} and embed.max_tokens == 0
    assert rerank.extra is not None and rerank.extra["query"] == embed.text and rerank.extra["top_n"] == 2
    docs = rerank.extra["documents"]
    assert len(docs) == 5 and len(set(docs)) == 5
    assert generate.text.startswith(docs[0] + docs[1]) and generate.extra is None and generate.max_tokens == 4
    assert s.salt and s.system is not None and s.system.startswith(s.salt) and embed.text.startswith(s.salt)
    lens = w.doc_lengths[w.docs(7)]
    q = embed.prompt_tokens  # the question and the salt
    assert rerank.prompt_tokens == int(lens.sum()) + 5 * q
    assert generate.prompt_tokens == 8 + int(lens[:2].sum()) + q
    assert w.session(7) == s  # a pure function of (spec, seed, index)


def test_stages_can_be_left_out_but_generate_ends_the_pipeline(tmp_path: Path) -> None:
    w = load_workload(str(spec(tmp_path, stages=["rerank", "generate"])), seed=1)
    assert [t.stage for t in w.session(0).turns] == ["rerank", "generate"]
    for bad in (["generate", "embed"], ["embed"], ["embed", "embed", "generate"], ["search", "generate"]):
        with pytest.raises(SpecError, match="stages"):
            load_workload(str(spec(tmp_path, stages=bad)), seed=1)
    with pytest.raises(SpecError, match=r"k: must be <= candidates \(5\)"):
        load_workload(str(spec(tmp_path, k=6)), seed=1)


def _rec(session: int, turn: int, stage: str, t0: int, t1: int, status: str = "ok", **kw: Any) -> Record:
    api = {"embed": "embeddings", "rerank": "rerank", "generate": "chat"}[stage]
    sent = None if status == "not_sent" else t0 + 1 * MS
    done = None if status == "not_sent" else t1
    return Record(
        session=session, turn=turn, stage=stage, api=api, t_sched=t0, t_sent=sent, t_done=done, status=status, **kw
    )


def test_the_view_makes_each_user_request_one_row_timed_from_its_first_stage() -> None:
    s = 1_000 * MS
    gen = dict(t_first=s + 160 * MS, t_last=s + 300 * MS, chunk_ns=[s + 160 * MS, s + 300 * MS], chunk_tokens=[1, 1])
    records = [
        _rec(0, 0, "embed", s, s + 20 * MS),
        _rec(0, 1, "rerank", s + 20 * MS, s + 100 * MS),
        _rec(0, 2, "generate", s + 100 * MS, s + 300 * MS, output_tokens=2, **gen),
        _rec(1, 0, "embed", s + 50 * MS, s + 60 * MS),
        _rec(1, 1, "rerank", s + 60 * MS, s + 90 * MS, status="http_error", error="HTTP 503"),
        _rec(1, 2, "generate", s + 90 * MS, s + 90 * MS, status="not_sent"),
    ]
    table = pa.Table.from_batches([to_batch(records[::-1])])  # any order
    view = pipeline_view(table).to_pydict()
    assert view["session"] == [0, 1] and view["stage"] == ["generate", "rerank"]
    assert view["t_sched"] == [s, s + 50 * MS] and view["t_sent"] == [s + MS, s + 51 * MS]
    assert view["status"] == ["ok", "http_error"] and view["t_first"] == [s + 160 * MS, None]
    f = pipeline_figures(table)
    assert f is not None and (f["pipelines"], f["completed"], f["failed_at"]) == (2, 1, {"rerank": 1})
    assert f["e2e_p50_ms"] == pytest.approx(300.0)
    by = {st["stage"]: st for st in f["stages"]}
    assert [st["stage"] for st in f["stages"]] == ["embed", "rerank", "generate"]
    assert by["rerank"]["ok"] == 1 and by["rerank"]["failed"] == 1 and by["generate"]["not_sent"] == 1
    shares = [by[n]["share_of_e2e"] for n in ("embed", "rerank", "generate")]
    assert shares == pytest.approx([20 / 300, 80 / 300, 200 / 300]) and sum(shares) == pytest.approx(1.0)
    assert by["generate"]["ttft_p50_ms"] == pytest.approx(60.0)  # its own, from its own instant
    # a pipeline whose generating request left no record (a killed run's last flush) did not complete
    cut = pipeline_view(pa.Table.from_batches([to_batch(records[:2])])).to_pydict()
    assert cut["status"] == ["cancelled"] and "left no record" in cut["error"][0]
    # the SLO is the user's: the answer took 200 ms, the user request 300 ms
    met = summarize(pipeline_view(table), slo=SLO(e2e_ms=250)).slo_met
    assert met == 0 and summarize(pipeline_view(table), slo=SLO(e2e_ms=350)).slo_met == 1


def _stage_answer(ex: Exchange) -> Answer:
    body = orjson.loads(ex.body)
    if "input" in body:
        data = {"data": [{"index": 0, "embedding": [0.5]}], "usage": {"prompt_tokens": 7, "total_tokens": 7}}
        return Answer(head_ms=5, reads=[Read(1, orjson.dumps(data))])
    if "documents" in body:
        results = [{"index": i, "relevance_score": 1 - i / 10} for i in range(body["top_n"])]
        return Answer(head_ms=20, reads=[Read(1, orjson.dumps({"results": results, "usage": {"total_tokens": 90}}))])
    return Answer.tokens(3, ttft_ms=30, itl_ms=10)


def test_each_stage_goes_to_its_route_with_its_model_and_the_extra_body_only_to_generate(tmp_path: Path) -> None:
    w = load_workload(str(spec(tmp_path)), seed=2)
    seen: list[tuple[int, dict[str, Any]]] = []

    def answer(ex: Exchange) -> Answer:
        seen.append((ex.seq, orjson.loads(ex.body)))
        return _stage_answer(ex)

    stages = (StageEndpoint("embed", "http://embed:1/v1", "e5"), StageEndpoint("rerank", "http://rank:2/v1", "bge"))
    recs, wire, _ = run(
        tmp_path,
        lambda c: FakeTransport(c, answer),
        sessions([w.session(0), w.session(1)], [0, 5]),
        stages=stages,
        extra_body={"temperature": 0},
    )
    assert recs["status"] == ["ok"] * 6 and recs["stage"] == [
        "embed",
        "embed",
        "rerank",
        "rerank",
        "generate",
        "generate",
    ]
    assert recs["model"] == ["e5", "e5", "bge", "bge", "m", "m"] and recs["inputs"][:4] == [1, 1, 5, 5]
    bodies = [b for _, b in sorted(seen, key=lambda x: x[0])]
    assert [b["model"] for b in bodies] == ["e5", "e5", "bge", "bge", "m", "m"]
    assert ["temperature" in b for b in bodies] == [False] * 4 + [True] * 2
    generate = [b for b in bodies if "messages" in b]
    assert all(len(b["messages"]) == 2 for b in generate)  # system + the documents and question: no stage in it
    for k in (0, 1):  # each stage due when the one before it ended
        rows = [i for i, s in enumerate(recs["session"]) if s == k]
        for a, b in zip(rows, rows[1:], strict=False):
            assert recs["t_sched"][b] == recs["t_done"][a]
    assert wire.most_open <= 2


def test_a_pipeline_run_against_stage_endpoints_reports_the_users_figures_and_the_stages(
    tmp_path: Path, capsys: Any
) -> None:
    stage_sim = SimServer(config=SimConfig(model_name="bge-small"))
    out = tmp_path / "run"
    with serve_in_thread(stage_sim) as stage_url:
        argv = ["run", "--workload", str(spec(tmp_path)), "--rate", "20", "--requests", "6", "--no-live"]
        argv += ["--endpoint-embed", stage_url, "--endpoint-rerank", stage_url]
        argv += ["--model-embed", "bge-small", "--model-rerank", "bge-small", "--sim-ttft-ms", "5"]
        argv += ["--out", str(out)]
        assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    recs = pq.read_table(out / "records.parquet").to_pydict()
    assert recs["status"] == ["ok"] * 18
    rows = sorted(zip(recs["session"], recs["turn"], recs["stage"], recs["model"], recs["endpoint"], strict=True))
    model = orjson.loads((out / "run.json").read_bytes())["model"]
    assert [r[2:4] for r in rows[:3]] == [("embed", "bge-small"), ("rerank", "bge-small"), ("generate", model)]
    assert rows[0][4] == rows[1][4] == stage_url.rstrip("/") and rows[2][4] != rows[0][4]
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["summary"]["requests"] == 6  # user requests, not stage requests
    pipeline = summary["pipeline"]
    assert pipeline["pipelines"] == pipeline["completed"] == 6
    assert sum(s["share_of_e2e"] for s in pipeline["stages"]) == pytest.approx(1.0)
    assert summary["summary"]["e2e"]["percentiles"]["p50"]["value"] == pytest.approx(pipeline["e2e_p50_ms"])
    settings = orjson.loads((out / "run.json").read_bytes())["settings"]
    assert settings["stage_endpoints"] == {"embed": stage_url.rstrip("/"), "rerank": stage_url.rstrip("/")}
    assert "pipeline stages" in printed and "pipelines: 6 in the window, 6 completed" in printed
    html = (out / "report.html").read_text()
    assert 'id="points-stages"' in html and "rerank share %" in html
    # the gate judges the user requests too: 6 E2E samples, each a whole pipeline
    (tmp_path / "slo.yaml").write_text(
        "name: t\nmin_samples: 1\nmin_duration_s: 0\ncriteria:\n"
        '  - {metric: e2e, statistic: p50, bound: "<= 60 s"}\n  - {metric: success_rate, bound: ">= 50 %"}\n'
    )
    gated = gate_run(out, load_profile(tmp_path / "slo.yaml"))
    e2e = next(c for c in gated.cases if c.data["metric"] == "e2e")
    assert e2e.data["n"] == 6 and e2e.data["value"] == pytest.approx(pipeline["e2e_p50_ms"])


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--api", "embeddings"], "a rag-pipeline generates its answers with --api chat"),
        (["--endpoint-embed", "ftp://x"], "--endpoint-embed 'ftp://x': expected an OpenAI base URL"),
    ],
)
def test_a_pipeline_flag_that_cannot_work_is_one_line(tmp_path: Path, capsys: Any, argv: list[str], said: str) -> None:
    base = ["run", "--workload", str(spec(tmp_path)), "--rate", "1", "--requests", "1", "--no-live"]
    base += ["--out", str(tmp_path / "r")]
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_stage_flags_need_a_pipeline(tmp_path: Path, capsys: Any) -> None:
    assert main(["run", "--workload", "chat", "--model-rerank", "x", "--out", str(tmp_path / "r")]) == 2
    assert "stage endpoints apply to rag-pipeline only" in capsys.readouterr().err
