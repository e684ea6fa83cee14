"""Builders for streamed chunks as servers send them, shared by the stream tests."""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.client.protocol.tally import StreamTally

__all__ = ["Json", "sse", "tally_of", "usage_chunk", "vllm_chunk"]

Json = dict[str, Any]  # a decoded chunk, or a part of one


def sse(*events: bytes | Json) -> list[bytes]:
    """One ``data:`` event per item (dicts are JSON-encoded), as separate reads."""
    return [b"data: " + (e if isinstance(e, bytes) else orjson.dumps(e)) + b"\n\n" for e in events]


def tally_of(api: str, reads: list[bytes], keep_text: bool = False, max_event_bytes: int = 1 << 20) -> StreamTally:
    """Feed each read at t = 1000 * (its index + 1), then close."""
    t = StreamTally(api, keep_text=keep_text, max_event_bytes=max_event_bytes)
    for i, data in enumerate(reads):
        t.feed(data, 1000 * (i + 1))
    t.close()
    return t


def vllm_chunk(delta: Json, completion_tokens: int | None, finish: str | None = None) -> Json:
    """A vLLM chat chunk; with a count, running usage as continuous_usage_stats sends."""
    out: Json = {
        "id": "chatcmpl-v1",
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if finish:
        out["choices"][0]["stop_reason"] = None
    if completion_tokens is not None:
        out["usage"] = {
            "prompt_tokens": 20,
            "total_tokens": 20 + completion_tokens,
            "completion_tokens": completion_tokens,
        }
    return out


def usage_chunk(completion_tokens: int, prompt_tokens: int = 20) -> Json:
    """The chunk that carries only the final usage (``stream_options.include_usage``)."""
    return {
        "id": "chatcmpl-v1",
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": "m",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        },
    }
