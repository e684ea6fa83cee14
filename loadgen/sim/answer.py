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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from loadgen.sim.faults import FaultSpec
from loadgen.sim.model import SimRequest
from loadgen.sim.tool_calls import TOOL_SHAPES, ToolCall, header_bytes
from loadgen.workload.tokenizer import BUILTIN, WORDS

__all__ = [
    "SimConfig",
    "SseFrames",
    "apply_stop",
    "chunk_seed",
    "chunk_size",
    "first_stop",
    "natural_length",
    "word_index",
]


@dataclass
class SimConfig:
    """What the server answers with, apart from timing (that is the ``TimingModel``'s)."""

    model_name: str = "sim"
    max_model_len: int = 131072
    tokens_per_chunk: int = 1
    # Above ``tokens_per_chunk``: each chunk carries between the two, drawn per chunk (``chunk_size``),
    # as speculative decoding's accepted drafts do; 0 (or equal): every chunk ``tokens_per_chunk``.
    tokens_per_chunk_max: int = 0
    natural_mean_tokens: int = 256  # mean answer length when EOS is not ignored
    faults: FaultSpec = field(default_factory=FaultSpec)
    truth_path: str | None = None
    tool_calls: float = 0.0  # share of chat answers that are a tool call (tool_calls.py), 0..1
    tool_call_shape: str = "vllm"  # whose stream a tool call has the shape of: one of TOOL_SHAPES

    def __post_init__(self) -> None:
        if self.tokens_per_chunk < 1 or (
            self.tokens_per_chunk_max and self.tokens_per_chunk_max < self.tokens_per_chunk
        ):
            raise ValueError(
                f"tokens per chunk {self.tokens_per_chunk}-{self.tokens_per_chunk_max}: need 1 <= lo <= hi"
            )
        if not 0.0 <= self.tool_calls <= 1.0:
            raise ValueError(f"tool-call share {self.tool_calls}: give a share in [0, 1]")
        if self.tool_call_shape not in TOOL_SHAPES:
            raise ValueError(f"tool-call shape {self.tool_call_shape!r}: one of {', '.join(TOOL_SHAPES)}")


def natural_length(prompt_ids: Sequence[int], mean: int) -> int:
    """Where the simulated model would emit EOS: a pure function of the prompt."""
    return _natural_draw(zlib.crc32(np.asarray(prompt_ids[-64:], dtype=np.int64).tobytes()), mean)


@functools.lru_cache(maxsize=4096)
def _natural_draw(h: int, mean: int) -> int:
    """Cached: seeding a numpy generator costs ~0.1 ms of a slow core, most of a request's handling,
    and workloads repeat prompts (shared system prompts, fixed benchmark prompts)."""
    return max(1, int(np.random.default_rng(h).exponential(mean)))


class SseFrames:
    """The SSE frames of one streamed answer, pre-assembled around a fixed head so
    each token costs one bytes concatenation (the simulator must outpace loadgen).

    With ``tool``, a chat answer that is a tool call: its tokens are argument fragments, in
    the tool call's server shape (``tool_calls.SHAPES``), and ``header`` names the call."""

    __slots__ = ("head", "chat", "pre", "mid", "tool")

    def __init__(self, rid: str, model: str, chat: bool, tool: ToolCall | None = None) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = orjson.dumps({"id": f"cmpl-{rid}", "object": obj, "created": int(time.time()), "model": model})[:-1]
        self.chat = chat
        self.tool = tool if chat else None
        choice = b',"choices":[{"index":0,'
        if self.tool is not None:
            self.pre = b"data: " + self.head + choice + self.tool.shape.frag_pre
            self.mid = self.tool.shape.frag_mid
        else:
            self.pre = b"data: " + self.head + choice + (b'"delta":{"content":' if chat else b'"text":')
            self.mid = b'},"finish_reason":null}]' if chat else b',"finish_reason":null}]'

    def role(self, header_usage: bytes = b"") -> bytes:
        """The role-only first chat chunk; for a tool call, in its shape, followed by the call's
        header (with ``header_usage``, the ``,"usage":{...}`` of continuous usage, if given)."""
        if self.tool is not None:
            role = b"data: " + self.head + b',"choices":[{"index":0,' + self.tool.shape.role + b"}\n\n"
            return role + header_bytes(self.head, self.tool, header_usage)
        delta = b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
        return b"data: " + self.head + b',"choices":[{"index":0,' + delta

    def token(self, text_json: bytes, usage: bytes = b"") -> bytes:
        return self.pre + text_json + self.mid + usage + b"}\n\n"

    def finish(self, reason: str) -> bytes:
        if self.tool is not None:
            body, post = self.tool.shape.finish_pre, self.tool.shape.finish_post
        else:
            body = b'"delta":{},"finish_reason":"' if self.chat else b'"text":"","finish_reason":"'
            post = b'"}]'
        return b"data: " + self.head + b',"choices":[{"index":0,' + body + reason.encode() + post + b"}\n\n"

    def usage(self, usage: dict[str, Any]) -> bytes:
        return b"data: " + self.head + b',"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n"


def chunk_seed(prompt_ids: Sequence[int]) -> int:
    """The seed of a request's chunk sizes (``chunk_size``): a hash of its prompt's end."""
    return zlib.crc32(np.asarray(prompt_ids[-64:], dtype=np.int64).tobytes())


def chunk_size(seed: int, c: int, lo: int, hi: int) -> int:
    """How many tokens the c-th chunk of a request carries: ``lo`` when fixed, else a draw in
    [lo, hi], a pure function of the request's ``chunk_seed`` and ``c`` (deterministic, cheap)."""
    if hi <= lo:
        return lo
    h = ((seed + c * 40503) * 2654435761) & 0xFFFFFFFF
    return lo + (h >> 16) % (hi - lo + 1)


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
