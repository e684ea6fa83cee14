"""How long a run's end takes on its records: compacting the streams, then annotating the Parquet file.

At the end of a run ``records.compact`` merges the record streams (one per shard) into
records.parquet; after the figures are computed ``analysis.annotate.annotate_run`` rewrites
it with ``in_window``, the derived latency columns and the window in its metadata. This
writes N ok requests (each K chunks of 4 tokens) through ``RecordWriter`` into 4 shard
streams, then times, on fresh copies, ``compact`` and ``annotate_run`` (given the table, as
the summary writers call it), printing the fastest and the median of R repeats.

Run: ``python benchmarks/records_compact.py [--requests 200000] [--chunks 32] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from loadgen.analysis.annotate import annotate_run
from loadgen.analysis.window import choose_window
from loadgen.records import PARQUET_NAME, Record, RecordWriter, compact, read_records

SHARDS = 4


def write_streams(folder: Path, requests: int, chunks: int) -> None:
    for shard in range(SHARDS):
        with RecordWriter(folder / f"records-{shard}.arrows", batch_size=512) as w:
            for i in range(shard, requests, SHARDS):
                t = 1_000_000_000 + i * 1_000_000
                arrivals = [t + 100_000 + k * 20_000 for k in range(chunks)]
                w.add(
                    Record(
                        run_id="bench",
                        shard=shard,
                        request=i,
                        session=i,
                        endpoint="e",
                        model="m",
                        t_sched=t,
                        t_sent=t + 10,
                        t_first=arrivals[0],
                        t_last=arrivals[-1],
                        t_done=arrivals[-1] + 5,
                        chunk_ns=arrivals,
                        chunk_tokens=[4] * chunks,
                        prompt_tokens_requested=512,
                        output_tokens=4 * chunks,
                        output_tokens_reported=4 * chunks,
                        output_tokens_source="usage",
                        finish_reason="length",
                    )
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "streams"
        src.mkdir()
        t = time.perf_counter()
        write_streams(src, args.requests, args.chunks)
        print(f"wrote {args.requests} records in {SHARDS} streams: {time.perf_counter() - t:.2f} s")
        took: dict[str, list[float]] = {"compact": [], "annotate_run": []}
        for k in range(args.repeats):
            run = Path(tmp) / f"run{k}"
            shutil.copytree(src, run)
            (run / "run.json").write_bytes(orjson.dumps({"run_id": "bench", "settings": {}}))
            t = time.perf_counter()
            compact(run)
            took["compact"].append(time.perf_counter() - t)
            table = read_records(run)
            window = choose_window(table)
            t = time.perf_counter()
            annotate_run(run, window, table=table)
            took["annotate_run"].append(time.perf_counter() - t)
            size = (run / PARQUET_NAME).stat().st_size
            shutil.rmtree(run)
        for name, times in took.items():
            print(f"{name}: fastest {min(times):.3f} s, median {statistics.median(times):.3f} s")
        print(f"records.parquet: {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
