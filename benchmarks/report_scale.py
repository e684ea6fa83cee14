"""How long ``loadgen report`` takes, and how much memory it holds, on a run of N requests.

Builds a run folder of N requests (default 1,000,000) streaming up to 128 chunks each, fast
(numpy, written straight to records.parquet as ``record_compact.compact`` writes it: its writer, its row groups) and
varied like a real run: Poisson arrivals at 300 req/s (an hour is a million requests),
sessions of 1-4 turns, lognormal TTFT and per-request inter-token gaps with per-chunk
jitter, chunks of 1-3 tokens, prompt and cached tokens, and ~2 % failures (HTTP errors with
no stream, timeouts and disconnects cut mid-stream). Then runs ``loadgen report DIR`` as a
subprocess and prints its wall time and peak resident memory (``getrusage`` of the child).

``--code DIR`` runs the report from another checkout (e.g. ``/tmp/before``, the code before a
change) through PYTHONPATH; ``--keep DIR`` builds the folder once and reuses it (its pristine
records.parquet is restored before each report, since the report annotates it); ``--mem-gb``
caps the child's address space (RLIMIT_AS) and ``--timeout`` its time, so a report that
would take the machine down is stopped and said to be.

Run: ``python benchmarks/report_scale.py [--requests 1000000] [--code /tmp/before] [--keep DIR]``.

Figures on the 2-core box (1,000,000 requests x 128 chunks, 126 M chunks; load average beside
each): 55.4 s (61.2 s CPU), 2.54 GiB before issue 18's second analysis wave; 33.6 s (46.1 s CPU),
2.65 GiB after it (load 0.11-0.70): ITL's CDF steps found in the summary's own passes from fine
buckets (one pass after the first, not three), the time series counted in a dense table of its
open intervals, the annotated records.parquet written in a thread while the figures are computed.
At 100,000 requests: 10.7 s (11.3 s CPU), 0.69 GiB before; 8.5 s (10.4 s CPU), 0.72 GiB after
(load 1.3, another helper's tests running). Then 30.8-31.9 s (43.2-45.3 s CPU), 2.64-2.69 GiB at
1,000,000 (load 0.7-1.2): the time series 7.8 -> 6.4 s (each gap's counter looked up in a table,
its tokens summed from the open intervals' table, the blocks' spans found once for both series).
Then, on a fresh machine of the same kind, the rewrite and the time series each in a forked child
beside the figures, FirstPass's sums by einsum (no BLAS threads): 30.8-32.1 s (44-46 s CPU) ->
24.2-25.4 s (38-40 s CPU), 2.5 GiB both, at 1,000,000 (load 1.8, alone); 7.1 -> 6.7 s at 100,000.
Then, on a faster VM of the same kind (its speed drifting by a third within minutes; the two
alternated, three of each): the CLI keeping the C heap's freed memory (loadgen.heap), blocks of
2 Mi chunks, ITL's first pass counting its fine window once, two row groups read at a time:
15.4-19.0 s (24-30 s CPU) -> 13.3-14.6 s (23-25 s CPU) at 1,000,000, 11.0-11.4 s at a quieter
moment, peak 2.5 GiB both (load 1.3-2.0); 4.6-5.8 -> 3.5-5.2 s at 100,000. The same code on a
fresh VM of the kind that evening, slower by a quarter to a third: 18.5-19.3 s (30-33 s CPU),
2.4 GiB at 1,000,000 (four runs, load 0.2-1.6); 4.8-6.0 s at 100,000.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from loadgen.record_parquet import ROW_GROUP_ROWS, parquet_writer
from loadgen.records import SCHEMA, file_metadata
from loadgen.run_folder import PARQUET_NAME

CHUNKS = 128
RATE = 300.0  # req/s
SLICE = 50_000  # requests built and written at a time
MS = 1_000_000
T0 = 10**12


def _strings(values: Any, null: Any) -> Any:
    """A string column's values, None where ``null``."""
    out = np.asarray(values).astype(object)
    out[null] = None
    return out


def _slice(rng: np.random.Generator, start: int, m: int, t_start: int, k: int) -> tuple[pa.RecordBatch, int]:
    """Requests ``start .. start + m``, the first scheduled at ``t_start``; returns the batch and
    the next request's intended instant."""
    gaps = rng.exponential(1e9 / RATE, m).astype(np.int64)
    sched = t_start + np.concatenate([[0], np.cumsum(gaps[:-1])])
    lag = rng.exponential(0.2 * MS, m).astype(np.int64)
    sent = sched + lag
    ttft = (rng.lognormal(np.log(180.0), 0.5, m) * MS).astype(np.int64)
    itl = rng.lognormal(np.log(18.0), 0.3, m) * MS  # each request's own pace
    jitter = rng.gamma(4.0, 0.25, (m, k))  # per chunk, mean 1
    tok = rng.choice(np.array([1, 1, 1, 1, 1, 1, 1, 2, 2, 3], dtype=np.int32), (m, k))
    step = (jitter * itl[:, None] * tok).astype(np.int64)
    step[:, 0] = 0
    ns = sent[:, None] + ttft[:, None] + np.cumsum(step, axis=1)
    roll = rng.random(m)
    status = np.full(m, "ok", dtype=object)
    status[roll < 0.010] = "http_error"
    status[(roll >= 0.010) & (roll < 0.015)] = "timeout"
    status[(roll >= 0.015) & (roll < 0.020)] = "disconnected"
    err = status == "http_error"
    cut = (status == "timeout") | (status == "disconnected")
    lens = np.full(m, k, dtype=np.int64)
    lens[err] = 0
    lens[cut] = rng.integers(0, k, int(cut.sum()))
    keep = np.arange(k)[None, :] < lens[:, None]
    offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]), pa.int32())
    has = lens > 0
    rows = np.arange(m)
    first = np.where(has, ns[:, 0], 0)
    last = ns[rows, np.maximum(lens - 1, 0)]
    out_tok = np.where(keep, tok, 0).sum(axis=1).astype(np.int32)
    done = np.where(err, sent + 5 * MS, np.where(status == "timeout", last + 60_000 * MS, last + MS // 2))
    prompt = rng.integers(200, 2000, m).astype(np.int32)
    cached = np.where(rng.random(m) < 0.3, (prompt * rng.random(m)).astype(np.int32), 0).astype(np.int32)
    req = start + rows
    http = np.where(err, np.where(rng.random(m) < 0.5, 500, 429), 200).astype(np.int32)
    ok = status == "ok"
    given: dict[str, Any] = {
        "run_id": pa.array(np.full(m, "20260101-000000-bench", dtype=object)),
        "request": pa.array(req),
        "session": pa.array(req // 3),
        "turn": pa.array((req % 3).astype(np.int32)),
        "endpoint": pa.array(np.full(m, "http://127.0.0.1:8000/v1", dtype=object)),
        "model": pa.array(np.full(m, "llama-3.1-8b", dtype=object)),
        "api": pa.array(np.full(m, "chat", dtype=object)),
        "t_sched": pa.array(sched),
        "t_sent": pa.array(sent),
        "t_headers": pa.array(sent + ttft // 2, mask=err),
        "t_first": pa.array(first, mask=~has),
        "t_first_content": pa.array(first, mask=~has),
        "t_last": pa.array(last, mask=~has),
        "t_done": pa.array(done),
        "chunk_ns": pa.ListArray.from_arrays(offsets, pa.array(ns[keep])),
        "chunk_tokens": pa.ListArray.from_arrays(offsets, pa.array(tok[keep])),
        "prompt_tokens_requested": pa.array(prompt),
        "prompt_tokens_reported": pa.array(prompt, mask=~ok),
        "cached_tokens": pa.array(cached, mask=~ok),
        "output_tokens_requested": pa.array(np.where(ok, out_tok, 2 * k).astype(np.int32)),
        "output_tokens_reported": pa.array(out_tok, mask=~ok),
        "output_tokens": pa.array(out_tok),
        "output_tokens_source": pa.array(np.where(ok, "usage", np.where(err, "none", "chunks")).astype(object)),
        "stream_end": pa.array(_strings(np.where(ok, "done", "eof"), err)),
        "finish_reason": pa.array(_strings(np.full(m, "length"), ~ok)),
        "status": pa.array(status),
        "http_status": pa.array(http, mask=cut),
        "error": pa.array(_strings(np.where(err, "HTTP 500: upstream overloaded", "stream cut"), ok)),
    }
    cols = [given[f.name].cast(f.type) if f.name in given else pa.nulls(m, f.type) for f in SCHEMA]
    return pa.RecordBatch.from_arrays(cols, schema=SCHEMA), int(sched[-1] + gaps[-1])


def build_run(folder: Path, n: int, k: int = CHUNKS, seed: int = 0) -> None:
    """``folder``: run.json and records.parquet of ``n`` requests (see the module's docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    schema = SCHEMA.with_metadata(file_metadata())
    t = T0
    batches = []
    for start in range(0, n, SLICE):
        batch, t = _slice(rng, start, min(SLICE, n - start), t, k)
        batches.append(batch)
    # as record_compact.compact writes it: its writer, row groups of ROW_GROUP_ROWS rows
    table = pa.Table.from_batches(batches).replace_schema_metadata(schema.metadata)
    del batches
    with parquet_writer(folder / PARQUET_NAME, table.schema) as w:
        w.write_table(table, row_group_size=ROW_GROUP_ROWS)
    arrival = {"kind": "poisson", "rate": RATE, "cv": None, "concurrency": None, "speed": None}
    meta = {
        "run_id": "20260101-000000-bench",
        "tool": {"name": "loadgen", "version": "bench"},
        "endpoint": "http://127.0.0.1:8000/v1",
        "model": "llama-3.1-8b",
        "state": "complete",
        "settings": {
            "api": "chat",
            "arrival": {**arrival, "label": f"poisson @ {RATE:g} req/s"},
            "duration_s": n / RATE,
            "warmup_s": 10.0,
            "cooldown_s": 10.0,
            "lag_limit_ms": 10.0,
            "point": 0,
            "workers": 1,
        },
        "workload": {"name": "synthetic-chat", "kind": "chat", "turns": {"kind": "uniform", "low": 1, "high": 3}},
        "client": {},
        "salt": "bench",
        "salt_source": "fresh",
    }
    (folder / "run.json").write_bytes(orjson.dumps(meta))


def _limit(mem_gb: float | None) -> Any:
    def apply() -> None:
        if mem_gb:
            cap = int(mem_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return apply


def report(
    folder: Path, code: Path | None, mem_gb: float | None, timeout: float
) -> tuple[float, float, float, int | str]:
    """(seconds, CPU seconds, peak RSS GiB, exit code or "timeout") of ``loadgen report folder``
    in a child (CPU seconds say more than wall time on a machine others load)."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    cmd = [sys.executable, "-m", "loadgen", "report", str(folder)]
    start = time.perf_counter()
    with subprocess.Popen(
        cmd, env=env, cwd=code or None, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_limit(mem_gb)
    ) as p:
        try:
            _, err = p.communicate(timeout=timeout)
            rc: int | str = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            rc = "timeout"
    took = time.perf_counter() - start
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0 and err:
        print(err.decode(errors="replace").strip().splitlines()[-1][:300])
    return took, use.ru_utime + use.ru_stime, use.ru_maxrss / 2**20, rc  # KiB -> GiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--chunks", type=int, default=CHUNKS)
    ap.add_argument("--code", type=Path, default=None, help="checkout whose loadgen runs the report")
    ap.add_argument("--keep", type=Path, default=None, help="build the run folder here once and reuse it")
    ap.add_argument("--mem-gb", type=float, default=None, help="cap the report's address space (GiB)")
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="report-scale-"))
    pristine = folder.with_name(folder.name + ".records.parquet")
    try:
        if not pristine.exists():
            t = time.perf_counter()
            build_run(folder, args.requests, args.chunks)
            shutil.copyfile(folder / PARQUET_NAME, pristine)
            print(f"built {args.requests:,} requests x {args.chunks} chunks in {time.perf_counter() - t:.1f} s")
        else:
            shutil.copyfile(pristine, folder / PARQUET_NAME)
        size = (folder / PARQUET_NAME).stat().st_size
        rows = pq.read_metadata(folder / PARQUET_NAME).num_rows
        print(f"records.parquet: {size / 1e6:,.0f} MB, {size / rows:,.0f} B per request")
        took, cpu, peak, rc = report(folder, args.code, args.mem_gb, args.timeout)
        who = args.code or "this checkout"
        print(f"loadgen report ({who}): {took:.1f} s ({cpu:.1f} s CPU), peak RSS {peak:.2f} GiB, exit {rc}")
        print(f"load average: {Path('/proc/loadavg').read_text().strip()}")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
            pristine.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
