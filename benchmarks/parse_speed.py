"""How much CPU the stream interpretation layer spends per event (SSE + JSON + tally).

The whole client's budget is <= 4 us CPU per streamed token, aiohttp included, so this
layer must stay well under that. It replays a realistic 128-token OpenAI-shape chat
stream (role chunk, 128 content chunks, finish chunk, ``choices: []`` usage chunk,
``[DONE]``) through ``StreamTally``: once with one read per event (a server that
flushes every token, the worst case), once with reads of ~16 events (a client that
fell behind or a server that batches), and split at TCP-segment (1448-byte) and at
small 97-byte boundaries. The last column turns the learned templates off (every chunk
through orjson), to show what they save. The same stream is then replayed with running
usage on every chunk, as vLLM's ``continuous_usage_stats`` sends it (loadgen asks for it
by default where a server offers it, for exact per-chunk token counts): its content
chunks are read off the usage template (usage_template.py), whose holes are the counts.

Run: ``python benchmarks/parse_speed.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from loadgen.client.protocol.sse import SSEParser
from loadgen.client.protocol.tally import StreamTally

WORDS = "the quick brown fox jumps over a lazy dog while sipping some cold tea".split()


def chat_stream(tokens: int = 128, running: bool = False) -> list[bytes]:
    """The events (each one ``data: ...\\n\\n``) of an OpenAI chat stream with usage;
    with ``running``, every chunk carries the usage so far (vLLM's continuous_usage_stats)."""
    head = {
        "id": "chatcmpl-9xYzAbCdEfGhIjKlMnOpQrStUvWx",
        "object": "chat.completion.chunk",
        "created": 1718000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "system_fingerprint": "fp_44709d6fcb",
    }

    def chunk(delta: dict[str, Any], done: int, finish: str | None = None) -> bytes:
        body = dict(head)
        body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        body["usage"] = (
            {"prompt_tokens": 512, "total_tokens": 512 + done, "completion_tokens": done} if running else None
        )
        return b"data: " + orjson.dumps(body) + b"\n\n"

    events = [chunk({"role": "assistant", "content": "", "refusal": None}, 0)]
    events += [chunk({"content": " " + WORDS[i % len(WORDS)]}, i + 1) for i in range(tokens)]
    events.append(chunk({}, tokens, "length"))
    last = dict(head, choices=[])
    last["usage"] = {
        "prompt_tokens": 512,
        "completion_tokens": tokens,
        "total_tokens": 512 + tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    events.append(b"data: " + orjson.dumps(last) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def reads_of(events: list[bytes], per_read: int) -> list[bytes]:
    return [b"".join(events[i : i + per_read]) for i in range(0, len(events), per_read)]


def byte_splits(events: list[bytes], size: int) -> list[bytes]:
    whole = b"".join(events)
    return [whole[i : i + size] for i in range(0, len(whole), size)]


def run_tally(reads: list[bytes], repeat: int, learn: bool = True) -> float:
    """Seconds of CPU for ``repeat`` passes of the whole stream."""
    t0 = time.process_time()
    for _ in range(repeat):
        tally = StreamTally("chat")
        if not learn:
            tally._learns = 0  # no template learned: every chunk through orjson, the full path
        t = 0
        for data in reads:
            t += 1
            tally.feed(data, t)
        tally.close()
        tally.reconcile()
    return time.process_time() - t0


def run_sse(reads: list[bytes], repeat: int) -> float:
    t0 = time.process_time()
    for _ in range(repeat):
        parser = SSEParser()
        for data in reads:
            parser.feed(data)
        parser.close()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()
    for running, source in ((False, "usage"), (True, "usage_per_chunk")):
        events = chat_stream(running=running)
        n = len(events)
        check = StreamTally("chat")
        for data in reads_of(events, 16):
            check.feed(data, 0)
        assert check.reconcile()[1:] == (128, source), check.reconcile()
        what = "running usage on every chunk" if running else "final usage only"
        print(f"{n} events/stream (128 tokens, {what}), mean event {len(b''.join(events)) // n} bytes")
        print(f"{'us of CPU per event, best of 5':34s} SSE only   tally   tally without template")
        for label, reads in (
            ("1 event per read", reads_of(events, 1)),
            ("16 events per read", reads_of(events, 16)),
            ("1448-byte reads (TCP segments)", byte_splits(events, 1448)),
            ("97-byte reads", byte_splits(events, 97)),
        ):
            run_tally(reads, max(args.repeat // 20, 1))  # warm up
            per = 1e6 / (args.repeat * n)
            sse = min(run_sse(reads, args.repeat) for _ in range(5)) * per
            fast = min(run_tally(reads, args.repeat) for _ in range(5)) * per
            full = min(run_tally(reads, args.repeat, learn=False) for _ in range(5)) * per
            print(f"  {label:32s} {sse:8.2f} {fast:7.2f} {full:10.2f}")


if __name__ == "__main__":
    main()
