"""Server metrics: parsing each engine's /metrics names, and scraping a live server into the run folder."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from llamacpp import LlamaServer, have_xllamacpp, start_llamacpp

from loadgen.client.metric_names import SERIES, detect_engine, normalize, parse_engine_metrics
from loadgen.client.prometheus import PrometheusTextError, metrics_url
from loadgen.client.scrape import ScraperThread, ServerMetricsScraper, resolve_option, summarize
from loadgen.errors import ConfigError
from loadgen.run_folder import SERVER_METRICS_NAME, load_server_metrics
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer

# -- captured text in each engine's format (names as each engine exports them) ------------

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4375
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12000.0
vllm:prefix_cache_queries_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4800.0
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12000.0
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5120.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 30.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 40.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 40.0
vllm:cache_config_info{block_size="16",cache_dtype="auto"} 1.0
python_gc_objects_collected_total{generation="0"} 9553.0
process_resident_memory_bytes 1.2e9
"""

VLLM_V0 = """\
vllm:num_requests_running{model_name="m"} 2.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:num_requests_swapped{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.125
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.5
vllm:prompt_tokens_total{model_name="m"} 100.0
vllm:generation_tokens_total{model_name="m"} 50.0
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 12.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 5.0
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.81
sglang:cache_hit_rate{model_name="qwen",tp_rank="0"} 0.33
sglang:gen_throughput{model_name="qwen",tp_rank="0"} 1450.5
sglang:num_used_tokens{model_name="qwen",tp_rank="0"} 81000.0
sglang:prompt_tokens_total{model_name="qwen"} 90000.0
sglang:generation_tokens_total{model_name="qwen"} 30000.0
sglang:cached_tokens_total{model_name="qwen"} 29700.0
sglang:num_requests_total{model_name="qwen"} 300.0
sglang:e2e_request_latency_seconds_bucket{le="0.1",model_name="qwen"} 0.0
"""

# Captured from llama.cpp's server (xllamacpp wheel) with --metrics; it has no KV-usage gauge.
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 25
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 15
llamacpp:prompt_seconds_total 0.002132
llamacpp:tokens_predicted_total 9
llamacpp:tokens_predicted_seconds_total 0.002966
llamacpp:n_decode_total 9
llamacpp:n_tokens_max 24
llamacpp:prompt_tokens_seconds 11726.1
llamacpp:predicted_tokens_seconds 2360.08
llamacpp:requests_processing 1
llamacpp:requests_deferred 4
llamacpp:n_busy_slots_per_decode 1
"""

# Older llama.cpp builds exported these two as well.
LLAMACPP_OLD = LLAMACPP + "llamacpp:kv_cache_usage_ratio 0.25\nllamacpp:kv_cache_tokens 512\n"

TGI = "tgi_batch_current_size 3\ntgi_queue_size 1\ntgi_request_success 17\n"


@pytest.mark.parametrize(
    ("text", "engine", "expected"),
    [
        (
            VLLM,
            "vllm",
            {
                "running": 7,
                "waiting": 3,
                "kv_cache_usage": 0.4375,
                "prompt_tokens_total": 12000,
                "generation_tokens_total": 5120,
                "preemptions_total": 2,
                "prefix_cache_hits_total": 4800,
                "prefix_cache_queries_total": 12000,
                "requests_finished_total": 40,
                "prefix_cache_hit_rate": None,
            },
        ),
        (
            VLLM_V0,
            "vllm",
            {
                "running": 2,
                "waiting": 0,
                "kv_cache_usage": 0.125,
                "prefix_cache_hit_rate": 0.5,
                "prefix_cache_hits_total": None,
                "preemptions_total": None,
            },
        ),
        (
            SGLANG,
            "sglang",
            {
                "running": 12,
                "waiting": 5,
                "kv_cache_usage": 0.81,
                "prefix_cache_hit_rate": 0.33,
                "prompt_tokens_total": 90000,
                "generation_tokens_total": 30000,
                "prefix_cache_hits_total": 29700,
                "requests_finished_total": 300,
            },
        ),
        # llama.cpp: prompt tokens = computed + cached, and every prompt token was a cache lookup
        (
            LLAMACPP,
            "llama.cpp",
            {
                "running": 1,
                "waiting": 4,
                "kv_cache_usage": None,
                "prompt_tokens_total": 40,
                "generation_tokens_total": 9,
                "prefix_cache_hits_total": 15,
                "prefix_cache_queries_total": 40,
                "preemptions_total": None,
            },
        ),
        (LLAMACPP_OLD, "llama.cpp", {"kv_cache_usage": 0.25}),
        (TGI, "tgi", {"running": 3, "waiting": 1, "requests_finished_total": 17}),
    ],
)
def test_each_engine_maps_onto_the_normalized_series(text: str, engine: str, expected: dict[str, float | None]) -> None:
    raw = parse_engine_metrics(text)
    assert detect_engine(raw) == engine
    norm = normalize(raw)
    assert set(norm) == set(SERIES)
    for key, value in expected.items():
        assert norm[key] == value, key


def test_parsing_keeps_engine_samples_and_drops_buckets_created_and_foreign_metrics() -> None:
    raw = parse_engine_metrics(VLLM)
    assert "vllm:time_to_first_token_seconds_sum" in raw and "vllm:time_to_first_token_seconds_count" in raw
    assert not any(k.endswith(("_bucket", "_created")) for k in raw)
    assert not any(k.startswith(("python_", "process_")) for k in raw)
    assert raw["vllm:request_success_total"] == 40.0  # summed over label sets


@pytest.mark.parametrize(
    "text",
    ["vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\n", "vllm:num_requests_running 1e400\n", ""],
)
def test_values_that_are_not_numbers_yield_no_values(text: str) -> None:
    assert parse_engine_metrics(text) == {}
    assert normalize(parse_engine_metrics(text))["running"] is None


@pytest.mark.parametrize("text", ["vllm:num_requests_running abc\n", VLLM + "vllm:num_requests_running"])
def test_broken_text_is_refused_whole_not_summed_in_part(text: str) -> None:
    with pytest.raises(PrometheusTextError):
        parse_engine_metrics(text)


def test_a_brace_inside_a_quoted_label_value_is_read_as_the_format_says() -> None:
    assert parse_engine_metrics('vllm:num_requests_running{model_name="a}b"} 3\n') == {"vllm:num_requests_running": 3.0}


def test_raw_names_are_bounded() -> None:
    text = "".join(f"vllm:m{i} 1\n" for i in range(2000)) + "vllm:m0 1\n"
    raw = parse_engine_metrics(text, limit=100)
    assert len(raw) == 100 and raw["vllm:m0"] == 2.0


def test_the_simulator_is_recognized() -> None:
    assert detect_engine({"vllm:num_requests_running": 0.0, "vllm:max_lateness_seconds": 0.0}) == "loadgen-sim"
    assert detect_engine({"python_info": 1.0}) == "unknown"


def test_option_semantics() -> None:
    assert resolve_option(None, "http://h:8000/v1") == "http://h:8000/metrics"
    assert resolve_option("auto", "http://h:8000/v1/") == "http://h:8000/metrics"
    assert resolve_option("off", "http://h:8000/v1") is None
    assert resolve_option("http://h:9090/metrics", "http://h:8000/v1") == "http://h:9090/metrics"
    with pytest.raises(ConfigError, match="--server-metrics"):
        resolve_option("h:9090", "http://h:8000/v1")


def test_load_skips_a_torn_last_line_and_reports_absence(tmp_path: Path) -> None:
    assert load_server_metrics(tmp_path) is None
    rows = [{"t_ns": 1, "running": 1.0}, {"t_ns": 2, "running": 2.0}]
    (tmp_path / SERVER_METRICS_NAME).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows) + b'{"t_ns": 3, "runn')
    assert load_server_metrics(tmp_path) == rows


def test_summarize_gives_counter_deltas_and_gauge_peaks() -> None:
    rows: list[dict[str, Any]] = [
        {"t_ns": 0, "running": 1.0, "waiting": 0.0, "generation_tokens_total": 100.0},
        {"t_ns": 10**9, "error": "HTTP 503"},
        {"t_ns": 2 * 10**9, "running": 3.0, "waiting": 2.0, "generation_tokens_total": 400.0},
    ]
    s = summarize(rows)
    assert s["deltas"] == {"generation_tokens_total": 300.0}
    assert s["gauges"]["running"] == {"max": 3.0, "mean": 2.0}
    assert s["span_s"] == 2.0


# -- against the built-in simulator, in-process ---------------------------------------------


async def _stream(http: aiohttp.ClientSession, url: str, n: int) -> None:
    body = {"model": "sim", "prompt": "hello there", "max_tokens": n, "stream": True, "ignore_eos": True}
    async with http.post(url + "/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()


def test_scraper_follows_the_simulator_through_a_burst(tmp_path: Path) -> None:
    async def main() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        sim = SimServer(FixedModel(ttft_s=0.05, itl_s=0.01))
        url = await sim.start()
        try:
            out = tmp_path / SERVER_METRICS_NAME
            async with aiohttp.ClientSession() as http:
                scraper = ServerMetricsScraper(metrics_url(url), interval_s=0.05, out_path=out)
                assert await scraper.start()
                await asyncio.gather(*(_stream(http, url, 40) for _ in range(5)))  # ~0.45 s of 5 streams
                summary = await scraper.stop()
            return summary, load_server_metrics(tmp_path) or []
        finally:
            await sim.stop()

    summary, rows = asyncio.run(main())
    assert summary["enabled"] and summary["engine"] == "loadgen-sim" and summary["path"] == SERVER_METRICS_NAME
    assert summary["errors"] == 0 and summary["samples"] == len(rows) >= 5
    assert summary["deltas"]["generation_tokens_total"] == 5 * 40
    assert summary["gauges"]["running"]["max"] == 5
    assert rows[0]["running"] == 0 and rows[-1]["running"] == 0
    t = [r["t_ns"] for r in rows]
    assert t == sorted(t) and all(r["wall_ns"] > 1.6e18 for r in rows)
    assert all(isinstance(r["raw"], dict) and "vllm:num_requests_running" in r["raw"] for r in rows)


def test_scraper_is_off_when_nothing_answers(tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        scraper = ServerMetricsScraper(
            "http://127.0.0.1:9/metrics", interval_s=0.1, out_path=tmp_path / SERVER_METRICS_NAME, timeout_s=1.0
        )
        assert not await scraper.start()
        return await scraper.stop()

    summary = asyncio.run(main())
    assert summary["enabled"] is False and summary["reason"]
    assert not (tmp_path / SERVER_METRICS_NAME).exists()
    assert ScraperThread(None).stop() == {"enabled": False, "reason": "off"}


def test_a_server_that_dies_mid_run_gives_error_rows_not_a_crash(tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        sim = SimServer(FixedModel())
        url = await sim.start()
        scraper = ServerMetricsScraper(
            metrics_url(url), interval_s=0.05, out_path=tmp_path / SERVER_METRICS_NAME, timeout_s=0.5
        )
        assert await scraper.start()
        await sim.stop()
        await asyncio.sleep(0.2)
        return await scraper.stop()

    summary = asyncio.run(main())
    assert summary["enabled"] and summary["errors"] >= 2 and summary["samples"] >= 1
    rows = load_server_metrics(tmp_path) or []
    assert any("error" in r for r in rows)


def test_an_unwritable_run_folder_turns_it_off_not_the_run(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")

    async def main() -> dict[str, Any]:
        sim = SimServer(FixedModel())
        url = await sim.start()
        try:
            scraper = ServerMetricsScraper(
                metrics_url(url), interval_s=0.1, out_path=tmp_path / "file" / SERVER_METRICS_NAME
            )
            assert not await scraper.start()
            return await scraper.stop()
        finally:
            await sim.stop()

    summary = asyncio.run(main())
    assert summary["enabled"] is False and "cannot write" in summary["reason"]


def test_a_non_metrics_answer_turns_it_off(tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        sim = SimServer(FixedModel())
        url = await sim.start()
        try:
            scraper = ServerMetricsScraper(url + "/models", interval_s=0.1)  # JSON, no Prometheus names
            assert not await scraper.start()
            return await scraper.stop()
        finally:
            await sim.stop()

    assert "no vLLM" in asyncio.run(main())["reason"]


# -- against llama.cpp ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_one_slot() -> Iterator[LlamaServer]:
    """One slot, so concurrent requests queue in llama.cpp (requests_deferred)."""
    if not have_xllamacpp():
        pytest.skip("xllamacpp (the [test] extra) is not installed")
    with start_llamacpp(n_parallel=1, n_ctx=4096) as server:
        yield server


def test_scraper_thread_sees_llamacpp_queue_and_counters(llama_one_slot: LlamaServer, tmp_path: Path) -> None:
    url = llama_one_slot.url

    async def burst() -> None:
        async with aiohttp.ClientSession() as http:
            body = {"prompt": "the house is open", "max_tokens": 300, "ignore_eos": True, "stream": True}

            async def one() -> None:
                async with http.post(url + "/completions", json=body) as resp:
                    assert resp.status == 200
                    await resp.read()

            await asyncio.gather(*(one() for _ in range(4)))

    with ScraperThread(metrics_url(url), 0.02, tmp_path / SERVER_METRICS_NAME) as scraper:
        t0 = time.perf_counter()
        worker = threading.Thread(target=lambda: asyncio.run(burst()))
        worker.start()
        worker.join(30)
        elapsed = time.perf_counter() - t0
    summary = scraper.stop()
    assert summary["enabled"] and summary["engine"] == "llama.cpp", summary
    assert summary["deltas"]["generation_tokens_total"] == 4 * 300
    assert summary["gauges"]["running"]["max"] == 1  # one slot
    assert summary["gauges"]["waiting"]["max"] >= 1, f"no queue seen in {elapsed:.2f} s of scraping"
    rows = load_server_metrics(tmp_path) or []
    assert rows and all(r["kv_cache_usage"] is None for r in rows)  # this llama.cpp exports no KV gauge
    assert "llamacpp:n_busy_slots_per_decode" in rows[-1]["raw"]
