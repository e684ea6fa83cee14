"""What the simulated server answers, apart from HTTP and timing: its configuration, how long an
answer is, which words it says, where a stop string cuts it, and the SSE frames that carry it.

These are pure, I/O-free functions of the request, kept apart from the HTTP side so that the
request handlers (``server.py``) and the streaming writer (``stream_writer.py``) share one
definition of an answer without importing each other, and so that they read and test without a
socket. An answer is deterministic: its length and words follow from the prompt alone, so a run
against the simulator can be checked token by token.
"""

from __future__ import annotations

import functools
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from loadgen.sim.faults import FaultSpec
from loadgen.sim.model import SimRequest
from loadgen.workload.tokenizer import BUILTIN, WORDS

__all__ = ["SimConfig", "SseFrames", "apply_stop", "first_stop", "natural_length", "word_index"]


@dataclass
class SimConfig:
    """What the server answers with, apart from timing (that is the ``TimingModel``'s)."""

    model_name: str = "sim"
    max_model_len: int = 131072
    tokens_per_chunk: int = 1
    natural_mean_tokens: int = 256  # mean answer length when EOS is not ignored
    faults: FaultSpec = field(default_factory=FaultSpec)
    truth_path: str | None = None


def natural_length(prompt_ids: list[int], mean: int) -> int:
    """Where the simulated model would emit EOS: a pure function of the prompt."""
    return _natural_draw(zlib.crc32(np.asarray(prompt_ids[-64:], dtype=np.int64).tobytes()), mean)


@functools.lru_cache(maxsize=4096)
def _natural_draw(h: int, mean: int) -> int:
    """Cached: seeding a numpy generator costs ~0.1 ms of a slow core, most of a request's handling,
    and workloads repeat prompts (shared system prompts, fixed benchmark prompts)."""
    return max(1, int(np.random.default_rng(h).exponential(mean)))


class SseFrames:
    """The SSE frames of one streamed answer, pre-assembled around a fixed head so
    each token costs one bytes concatenation (the simulator must outpace loadgen)."""

    __slots__ = ("head", "chat", "pre", "mid")

    def __init__(self, rid: str, model: str, chat: bool) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = orjson.dumps({"id": f"cmpl-{rid}", "object": obj, "created": int(time.time()), "model": model})[:-1]
        self.chat = chat
        choice = b',"choices":[{"index":0,'
        self.pre = b"data: " + self.head + choice + (b'"delta":{"content":' if chat else b'"text":')
        self.mid = b'},"finish_reason":null}]' if chat else b',"finish_reason":null}]'

    def role(self) -> bytes:
        delta = b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
        return b"data: " + self.head + b',"choices":[{"index":0,' + delta

    def token(self, text_json: bytes, usage: bytes = b"") -> bytes:
        return self.pre + text_json + self.mid + usage + b"}\n\n"

    def finish(self, reason: str) -> bytes:
        body = b'"delta":{},"finish_reason":"' if self.chat else b'"text":"","finish_reason":"'
        return b"data: " + self.head + b',"choices":[{"index":0,' + body + reason.encode() + b'"}]}\n\n'

    def usage(self, usage: dict[str, Any]) -> bytes:
        return b"data: " + self.head + b',"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n"


def word_index(req: SimRequest, k: int) -> int:
    """The k-th output word of a request: deterministic, cheap."""
    return (len(req.prompt_ids) * 31 + k * 7919) % len(WORDS)


def first_stop(text: str, stops: list[str]) -> int | None:
    """Where the earliest of ``stops`` begins in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def apply_stop(text: str, n_words: int, stops: list[str], finish: str) -> tuple[str, int, str]:
    """A whole answer cut at its first stop string: (text, tokens kept, finish reason)."""
    cut = first_stop(text, stops) if stops else None
    if cut is None:
        return text, n_words, finish
    kept = text[:cut]
    return kept, BUILTIN.count(kept), "stop"
