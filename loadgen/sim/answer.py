"""What the simulated server answers, apart from HTTP and timing: its configuration, how long an
answer is, which words it says, where a stop string cuts it, and the SSE frames that carry it.

Split from the server (``server.py``) so that these pure, I/O-free pieces are shared by the
request handlers and the streaming writer (``stream_writer.py``) without either importing the
other, and can be read and tested without a socket.
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

__all__ = ["SimConfig"]


@dataclass
class SimConfig:
    model_name: str = "sim"
    max_model_len: int = 131072
    tokens_per_chunk: int = 1
    natural_mean_tokens: int = 256  # mean answer length when EOS is not ignored
    faults: FaultSpec = field(default_factory=FaultSpec)
    truth_path: str | None = None


def _natural_length(prompt_ids: list[int], mean: int) -> int:
    """Where the simulated model would emit EOS: a pure function of the prompt."""
    return _natural_draw(zlib.crc32(np.asarray(prompt_ids[-64:], dtype=np.int64).tobytes()), mean)


@functools.lru_cache(maxsize=4096)
def _natural_draw(h: int, mean: int) -> int:
    """Cached: seeding a numpy generator costs ~0.1 ms of a slow core, most of a request's handling,
    and workloads repeat prompts (shared system prompts, fixed benchmark prompts)."""
    return max(1, int(np.random.default_rng(h).exponential(mean)))


class _Frames:
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


def _word_index(req: SimRequest, k: int) -> int:
    """The k-th output word of a request: deterministic, cheap."""
    return (len(req.prompt_ids) * 31 + k * 7919) % len(WORDS)


def _first_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def _apply_stop(text: str, n_words: int, stops: list[str], finish: str) -> tuple[str, int, str]:
    cut = _first_stop(text, stops) if stops else None
    if cut is None:
        return text, n_words, finish
    kept = text[:cut]
    return kept, BUILTIN.count(kept), "stop"
