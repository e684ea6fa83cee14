"""What a serving engine's Prometheus ``/metrics`` text says, on one set of names.

Engines name the same thing differently (vLLM, llama.cpp, SGLang, TGI): this
module picks the engine-prefixed samples out of the text (``parse_engine_metrics``,
parsed by ``client.prometheus``, which also bounds what an untrusted body costs),
says which engine exported them (``detect_engine``) and maps them onto one
normalized set of series (``SERIES``, via ``normalize``), so a report reads
queue depth or KV-cache use the same way whatever served the run. Pure
functions of the text, tested without a server; kept apart from
``client.scrape`` (the scraper that fetches the text during a run and writes
the rows) for that reason.
"""

from __future__ import annotations

from loadgen.client.prometheus import MAX_NAMES, parse_samples

__all__ = ["SERIES", "parse_engine_metrics", "detect_engine", "normalize"]

# Normalized series, each with what it means. Counters end in _total and are
# cumulative since the server started; gauges are instantaneous.
SERIES: dict[str, str] = {
    "running": "requests being decoded/prefilled now (in a batch slot)",
    "waiting": "requests queued for a slot",
    "kv_cache_usage": "fraction of KV-cache capacity in use, 0..1",
    "prompt_tokens_total": "prompt tokens of started requests, cached ones included",
    "generation_tokens_total": "output tokens generated",
    "preemptions_total": "requests preempted (evicted, to be recomputed or swapped)",
    "prefix_cache_hits_total": "prompt tokens served from the prefix cache",
    "prefix_cache_queries_total": "prompt tokens looked up in the prefix cache",
    "prefix_cache_hit_rate": "engine-reported prefix-cache hit rate, 0..1 (when it has no counters)",
    "requests_finished_total": "requests finished by the server",
}

# engine name -> metric-name prefix (how the engine is recognized)
_PREFIXES = {"vllm": "vllm:", "llama.cpp": "llamacpp:", "sglang": "sglang:", "tgi": "tgi_"}

# normalized series -> raw names that give it directly, first present wins
_DIRECT: dict[str, tuple[str, ...]] = {
    "running": (
        "vllm:num_requests_running",
        "llamacpp:requests_processing",
        "sglang:num_running_reqs",
        "tgi_batch_current_size",
    ),
    "waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs", "tgi_queue_size"),
    # vLLM's "perc" gauges are fractions (1.0 = full) despite the name; SGLang's token_usage too
    "kv_cache_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "llamacpp:kv_cache_usage_ratio",
        "sglang:token_usage",
    ),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "generation_tokens_total": (
        "vllm:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
        "sglang:generation_tokens_total",
    ),
    "preemptions_total": ("vllm:num_preemptions_total",),
    "prefix_cache_hits_total": (
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
        "llamacpp:prompt_tokens_cached_total",
        "sglang:cached_tokens_total",
    ),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hit_rate": ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate"),
    "requests_finished_total": ("vllm:request_success_total", "sglang:num_requests_total", "tgi_request_success"),
}

_ENGINE_PREFIXES = tuple(_PREFIXES.values())


def parse_engine_metrics(text: str, limit: int = MAX_NAMES) -> dict[str, float]:
    """Engine-prefixed samples summed over label sets (``name -> value``), at most ``limit``
    names; buckets and values not finite or absurd are left out. Untrusted input: raises
    ``PrometheusTextError`` (a ``ValueError``) for text that is not Prometheus's, or too much."""
    return parse_samples(text, _ENGINE_PREFIXES, limit)


def detect_engine(raw: dict[str, float]) -> str:
    """``vllm``, ``llama.cpp``, ``sglang``, ``tgi``, ``loadgen-sim`` or ``unknown``, from the names exported."""
    counts = {engine: sum(1 for k in raw if k.startswith(p)) for engine, p in _PREFIXES.items()}
    engine, n = max(counts.items(), key=lambda kv: kv[1])
    if n == 0:
        return "unknown"
    if engine == "vllm" and "vllm:max_lateness_seconds" in raw:
        return "loadgen-sim"  # the built-in simulator speaks vLLM's names plus its own lateness gauge
    return engine


def normalize(raw: dict[str, float]) -> dict[str, float | None]:
    """The ``SERIES`` values for one sample; None where the engine exports nothing for one."""
    out: dict[str, float | None] = {}
    for series, names in _DIRECT.items():
        out[series] = next((raw[n] for n in names if n in raw), None)
    if "llamacpp:prompt_tokens_total" in raw:
        # llama.cpp counts prompt tokens it computed, excluding cache hits: add them back, so
        # prompt_tokens_total means the same for every engine, and every prompt token was a lookup
        cached = raw.get("llamacpp:prompt_tokens_cached_total", 0.0)
        out["prompt_tokens_total"] = raw["llamacpp:prompt_tokens_total"] + cached
        if "llamacpp:prompt_tokens_cached_total" in raw:
            out["prefix_cache_queries_total"] = out["prompt_tokens_total"]
    return out
