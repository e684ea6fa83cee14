"""How long the analysis layer takes to turn a run's records into its figures.

``analysis.metrics`` promises that a million-request run summarises in seconds (every
column, the per-chunk lists included, converted to numpy once and folded vectorised).
This builds a synthetic records table of N ok requests at 100 req/s, each streaming K
one-token chunks 5 ms apart, and times, once each after one warm-up call:

- ``summarize`` (with an SLO, so goodput and attainment are folded too),
- ``timeseries`` (one HdrHistogram set per second),
- ``analyze_run`` on the table (summarize plus the throughput interval, frontier, capacity).

Run: ``python benchmarks/analysis_speed.py [--requests 1000000] [--chunks 50]``.
Memory grows with requests x chunks; the peak resident size is printed at the end.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from loadgen.analysis.metrics import SLO, summarize
from loadgen.analysis.points import analyze_run
from loadgen.analysis.timeseries import timeseries
from loadgen.records import SCHEMA
from loadgen.run_folder import write_json

MS = 1_000_000
BASE = 10**12


def records(n: int, k: int) -> pa.Table:
    """n ok requests 10 ms apart, each k one-token chunks 5 ms apart after a 50 ms TTFT."""
    sched = np.arange(n, dtype=np.int64) * 10 * MS + BASE
    first = sched + 50 * MS
    last = first + (k - 1) * 5 * MS
    offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
    chunk_ns = (first[:, None] + np.arange(k, dtype=np.int64) * 5 * MS).ravel()
    given = {
        "t_sched": pa.array(sched),
        "t_sent": pa.array(sched),
        "t_first": pa.array(first),
        "t_last": pa.array(last),
        "t_done": pa.array(last + 1),
        "chunk_ns": pa.ListArray.from_arrays(offsets, pa.array(chunk_ns)),
        "chunk_tokens": pa.ListArray.from_arrays(offsets, pa.array(np.ones(n * k, dtype=np.int32))),
        "output_tokens": pa.array(np.full(n, k, dtype=np.int32)),
        "point": pa.array(np.zeros(n, dtype=np.int32)),
        "status": pa.array(["ok"] * n),
        "run_id": pa.array([""] * n),
    }
    return pa.Table.from_arrays(
        [given[f.name].cast(f.type) if f.name in given else pa.nulls(n, f.type) for f in SCHEMA], schema=SCHEMA
    )


def timed(label: str, fn: Callable[[], Any]) -> None:
    fn()  # warm-up: imports, scipy's first calls
    start = time.perf_counter()
    fn()
    print(f"{label:<14} {time.perf_counter() - start:8.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--chunks", type=int, default=50, help="one-token chunks per request")
    args = ap.parse_args()
    n, k = args.requests, args.chunks
    start = time.perf_counter()
    table = records(n, k)
    print(
        f"{n:,} requests x {k} chunks ({table.nbytes / 1e6:,.0f} MB of records), built in "
        f"{time.perf_counter() - start:.1f} s"
    )
    slo = SLO(ttft_ms=100, tpot_ms=10)
    timed("summarize", lambda: summarize(table, slo=slo))
    timed("timeseries", lambda: timeseries(table))
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d)
        arrival = {"kind": "constant", "rate": 100.0, "label": "constant @ 100 req/s"}
        write_json(run_dir / "run.json", {"run_id": "bench", "settings": {"arrival": arrival}})
        timed("analyze_run", lambda: analyze_run(run_dir, slo=slo, table=table))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB")


if __name__ == "__main__":
    main()
