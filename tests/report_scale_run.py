"""A small, varied run's records for pinning the analysis's figures (``test_report_scale``).

Every kind of request the figures treat differently appears: ok streams with 1-3 tokens per
chunk, zero-token chunks, chunks sharing an instant (one read), answers that arrive in one
burst or late after a silence (buffered), a chunk out of order, cut streams, HTTP errors,
timeouts before any token, cancelled and never-sent requests, sessions of several turns,
cached, reasoning and content-first figures. Seeded: the same table every time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.records import SCHEMA

MS = 1_000_000
T0 = 10**12
STATUSES = np.array(["ok"] * 14 + ["http_error", "timeout", "disconnected", "cancelled", "not_sent", "bad_stream"])


def varied_table(n: int = 3000, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    sched = T0 + np.cumsum(rng.exponential(20 * MS, n)).astype(np.int64)
    status = STATUSES[rng.integers(0, STATUSES.size, n)]
    rows: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
    for i in range(n):
        s, st = int(sched[i]), str(status[i])
        sent = None if st == "not_sent" else s + int(rng.exponential(2 * MS))
        chunks: list[int] = []
        toks: list[int] = []
        if st in ("ok", "disconnected", "cancelled", "bad_stream") and sent is not None and rng.random() > 0.05:
            k = int(rng.integers(1, 40)) if st == "ok" else int(rng.integers(0, 10))
            t = sent + int(rng.lognormal(np.log(150), 0.6) * MS)
            for j in range(k):
                if j and rng.random() > 0.1:  # else: the same instant as the one before
                    t += int(rng.gamma(2.0, 8.0) * MS) * (40 if (i % 97 == 0 and j == k - 1) else 1)
                chunks.append(t - (3 * MS if i % 211 == 5 and j == 2 else 0))
                toks.append(int(rng.choice([0, 1, 1, 1, 1, 2, 3])))
        first = chunks[0] if chunks else None
        done = None if st in ("not_sent", "cancelled") else (chunks[-1] if chunks else (sent or s)) + MS
        if st == "timeout":
            done = (sent or s) + 900 * MS
        out = int(sum(toks))
        row = {
            "run_id": "pin",
            "request": i,
            "session": i // 3,
            "turn": i % 3,
            "endpoint": "e",
            "model": "m",
            "api": "chat",
            "t_sched": s,
            "t_sent": sent,
            "t_first": first,
            "t_first_content": (first + MS if i % 5 == 0 else first) if first is not None else None,
            "t_last": chunks[-1] if chunks else None,
            "t_done": done,
            "chunk_ns": chunks,
            "chunk_tokens": toks if i % 301 != 7 else toks[:-1],  # a malformed record: lists disagree
            "prompt_tokens_requested": int(rng.integers(100, 900)),
            "prompt_tokens_reported": int(rng.integers(100, 900)) if st == "ok" else None,
            "cached_tokens": int(rng.integers(0, 600)) if st == "ok" and i % 2 else None,
            "output_tokens_requested": 64 if i % 4 else None,
            "output_tokens_reported": out + (1 if i % 53 == 0 else 0) if st == "ok" else None,
            "output_tokens": out,
            "output_tokens_source": ["usage", "chunks", "tokenizer", "none"][i % 4],
            "reasoning_tokens": int(rng.integers(0, 10)) if i % 7 == 0 else None,
            "stream_end": ("done" if i % 9 else "finish") if st == "ok" else None,
            "finish_reason": "length" if st == "ok" else None,
            "status": st,
            "http_status": 500 if st == "http_error" else (200 if sent is not None else None),
            "error": f"failure {i % 4}" if st != "ok" else None,
        }
        for f in SCHEMA:
            rows[f.name].append(row.get(f.name))
    return pa.Table.from_pydict(rows, schema=SCHEMA)
