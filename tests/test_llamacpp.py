"""loadgen against a real inference engine: llama.cpp's server (xllamacpp wheel) on a tiny model.

Each test is small: the model decodes thousands of tokens a second on one thread, so
what is measured here is loadgen's handling of a real engine's streams, usage, prompt
cache, ``/tokenize`` and ``/metrics``, not the model. Behaviour llama.cpp is known to
have (and that these tests pin) is written up in docs/llamacpp.md.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llamacpp import LlamaServer, have_xllamacpp, start_llamacpp

from loadgen.cli.main import main as cli_main
from loadgen.client.calibrate import calibrate
from loadgen.client.prometheus import metrics_url
from loadgen.client.run import execute
from loadgen.client.scrape import ScraperThread
from loadgen.client.settings import RunSettings
from loadgen.records import read_records
from loadgen.run_folder import SERVER_METRICS_NAME, load_server_metrics
from loadgen.schedule import Arrival
from loadgen.workload.base import SyntheticChat
from loadgen.workload.load import load_workload

pytestmark = pytest.mark.skipif(not have_xllamacpp(), reason="xllamacpp (the [test] extra) is not installed")

# Where llama.cpp deviates from the API, as `loadgen check` reports it (see docs/llamacpp.md): it
# serves one model and answers whatever `model` a request names. An API deviation loadgen
# measures through: WARN, not FAIL.
LLAMACPP_CHECK_WARNS = {"error-unknown-model"}


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    """Two slots of 4096 tokens each, prompt cache on, /metrics on."""
    with start_llamacpp(n_parallel=2, n_ctx=8192) as server:
        yield server


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read()) if "json" in resp.headers.get("Content-Type", "") else resp.read().decode()


def post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def spec(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def run(
    llama: LlamaServer, out: Path, workload: Any, *, api: str = "chat", requests: int = 8, rate: float = 10.0, **kw: Any
) -> list[dict[str, Any]]:
    """One run with loadgen's runner; constant arrivals so each send finds the last one done."""
    settings = RunSettings(
        endpoint=llama.url,
        model=None,
        api=api,
        arrival=Arrival("constant", rate=rate),
        duration_s=None,
        requests=requests,
        drain_s=20.0,
        **kw,
    )
    result = execute(settings, workload, out)
    assert result.records == requests
    return read_records(out).to_pylist()


def assert_streamed_exactly(rows: list[dict[str, Any]], output_tokens: int) -> None:
    """Every request ok, its length from usage equal to max_tokens (ignore_eos), one token per chunk."""
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert r["finish_reason"] == "length"
        assert r["output_tokens_source"] == "usage"
        assert r["output_tokens_reported"] == r["output_tokens_requested"] == r["output_tokens"] == output_tokens
        # the tiny model's vocabulary is whole ASCII pieces, so llama.cpp sends a chunk per token
        assert len(r["chunk_ns"]) == output_tokens and set(r["chunk_tokens"]) == {1}
        assert r["chunk_ns"] == sorted(r["chunk_ns"])
        assert r["t_sched"] <= r["t_sent"] <= r["t_headers"] <= r["t_first"] == r["chunk_ns"][0]
        assert r["chunk_ns"][-1] == r["t_last"] <= r["t_done"]
        assert r["prompt_tokens_reported"] > 0


def test_server_starts_fast_and_serves_its_own_endpoints(llama: LlamaServer) -> None:
    assert llama.started_s < 10, f"llama.cpp took {llama.started_s:.2f} s to listen"
    assert [m["id"] for m in get(llama.url + "/models")["data"]] == ["tiny"]
    slots = get(llama.root + "/slots")
    assert len(slots) == 2 and {s["n_ctx"] for s in slots} == {4096}
    assert "llamacpp:requests_processing" in get(llama.root + "/metrics")
    assert len(post(llama.root + "/tokenize", {"content": "the house is open"})["tokens"]) > 0


def test_run_chat_times_every_chunk_and_counts_usage(llama: LlamaServer, tmp_path: Path) -> None:
    rows = run(llama, tmp_path / "run", SyntheticChat(input_tokens=48, output_tokens=24), api="chat")
    assert_streamed_exactly(rows, 24)
    assert {r["api"] for r in rows} == {"chat"} and {r["model"] for r in rows} == {"tiny"}


def test_run_completions_with_the_models_tokenizer_sends_exact_prompt_lengths(
    llama: LlamaServer, tmp_path: Path
) -> None:
    path = spec(
        tmp_path,
        "exact",
        """\
        kind: chat
        input: {type: uniform, low: 20, high: 80}
        output: 16
        """,
    )
    workload = load_workload(str(path), tokenizer=str(llama.tokenizer_path))
    rows = run(llama, tmp_path / "run", workload, api="completions")
    assert_streamed_exactly(rows, 16)
    # completions: no chat template and no BOS, so the endpoint counts what was built
    assert [r["prompt_tokens_reported"] for r in rows] == [r["prompt_tokens_requested"] for r in rows]
    assert len({r["prompt_tokens_requested"] for r in rows}) > 1


def test_server_metrics_scraped_through_a_run(llama: LlamaServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # this scraper spans the whole call, preflight included: its tiny request (3 tokens) is not one
    # of the run's records, so it is left out here (the run's own scraper starts after it)
    with ScraperThread(metrics_url(llama.url), 0.05, out / SERVER_METRICS_NAME) as scraper:
        # answers of ~0.1 s each, 20 a second: two or so in flight at any moment
        workload = SyntheticChat(input_tokens=32, output_tokens=240, salt="metrics")
        rows = run(llama, out, workload, requests=10, rate=20.0, preflight=False)
    summary = scraper.stop()
    assert summary["enabled"] and summary["engine"] == "llama.cpp" and summary["errors"] == 0
    # the server's own counters agree with the client's records
    assert summary["deltas"]["generation_tokens_total"] == sum(r["output_tokens"] for r in rows)
    assert summary["deltas"]["prompt_tokens_total"] == sum(r["prompt_tokens_reported"] for r in rows)
    assert summary["deltas"]["prefix_cache_hits_total"] == sum(r["cached_tokens"] for r in rows)
    series = load_server_metrics(out) or []
    assert len(series) >= 5 and max(s["running"] for s in series) >= 1


def test_closed_loop_survives_a_server_that_closes_after_each_stream(llama: LlamaServer, tmp_path: Path) -> None:
    settings = RunSettings(
        endpoint=llama.url, model=None, arrival=Arrival("closed", concurrency=2), duration_s=None, requests=20
    )
    execute(settings, SyntheticChat(input_tokens=16, output_tokens=4), tmp_path / "run")
    rows = read_records(tmp_path / "run").to_pylist()
    assert [r["error"] for r in rows if r["status"] != "ok"] == []


def test_sweep_two_rates(llama: LlamaServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    code = cli_main(
        [
            "sweep",
            "--endpoint",
            llama.url,
            "--rates",
            "2,4",
            "--point-duration",
            "1",  # what is checked: two points, every answer whole, the folder written; not the figures
            "--warmup",
            "0.25",
            "--arrival",
            "constant",
            "--input-tokens",
            "32",
            "--output-tokens",
            "8",
            "--no-live",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = read_records(out).to_pylist()
    assert {r["point"] for r in rows} == {0, 1}
    assert all(r["status"] == "ok" and r["output_tokens"] == 8 for r in rows)
    assert (out / "summary.json").exists() and (out / "report.html").exists()


def test_check_passes_every_item_llamacpp_can(
    llama: LlamaServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "check.json"
    code = cli_main(["check", "--endpoint", llama.url, "--json", str(report), "--timeout", "20"])
    cases = {c["name"]: c for c in json.loads(report.read_text())["cases"]}
    not_passed = {name: c["status"] for name, c in cases.items() if c["status"] != "pass"}
    assert not_passed == dict.fromkeys(LLAMACPP_CHECK_WARNS, "warn"), {n: cases[n]["message"] for n in not_passed}
    assert code == 0  # only warnings; --strict would fail it
    assert "HTTP 200" in cases["error-unknown-model"]["message"]


def test_calibration_finds_the_builtin_tokenizer_off_and_the_models_own_exact(
    llama: LlamaServer, tmp_path: Path
) -> None:
    cal = asyncio.run(calibrate(llama.url))
    assert cal.method == "tokenize"
    assert 1.3 < cal.ratio < 2.0, cal  # the tiny vocabulary splits many of the built-in words
    exact = asyncio.run(calibrate(llama.url, tokenizer=str(llama.tokenizer_path)))
    assert exact.method == "tokenize" and [e for e, _ in exact.samples] == [r for _, r in exact.samples]
    # applying the ratio brings the endpoint's count of built-in text to about the target
    path = spec(
        tmp_path,
        "plain",
        """\
        kind: chat
        input: 400
        output: 8
        """,
    )
    for overrides, lo, hi in (({}, 1.3, 2.0), (cal.overrides(), 0.95, 1.05)):
        w = load_workload(str(path), overrides=overrides)
        counts = [
            len(post(llama.root + "/tokenize", {"content": w.session(i).turns[0].text})["tokens"]) for i in range(4)
        ]
        assert lo < sum(counts) / (4 * 400) < hi, (overrides, counts)


def test_rag_document_reuse_shows_up_as_cached_tokens(llama: LlamaServer, tmp_path: Path) -> None:
    path = spec(
        tmp_path,
        "rag",
        """\
        kind: rag
        system: 16
        documents:
          count: 3
          tokens: 120
        k: 2
        zipf_alpha: 1.0
        order: sorted
        question: 8
        output: 4
        """,
    )
    workload = load_workload(str(path), tokenizer=str(llama.tokenizer_path))
    rows = run(llama, tmp_path / "cached", workload, requests=10)
    assert all(r["status"] == "ok" for r in rows)
    cached = [r["cached_tokens"] for r in rows]
    assert max(cached) >= 120 + 16, cached  # at least the system prompt and a whole document reused
    assert sum(cached[1:]) > 0.5 * sum(r["prompt_tokens_reported"] for r in rows[1:]), cached
    # the same traffic with llama.cpp's prompt cache turned off per request: nothing reused
    rows = run(llama, tmp_path / "uncached", workload, requests=4, extra_body={"cache_prompt": False})
    assert [r["cached_tokens"] for r in rows] == [0, 0, 0, 0]


def test_without_max_tokens_llamacpp_generates_until_the_context_is_full(tmp_path: Path) -> None:
    with start_llamacpp(n_parallel=1, n_ctx=256) as small:
        answer = post(small.url + "/completions", {"prompt": "the house", "ignore_eos": True})
        usage = answer["usage"]
        assert answer["choices"][0]["finish_reason"] == "length"
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 256
