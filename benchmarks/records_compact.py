"""What a run's records take on disk, and what the end of a run takes to compact them.

While a run goes on, records are appended to crash-safe Arrow IPC streams (``records*.arrows``,
one per shard, each batch's buffers zstd-compressed: ``stream_file``); at the end
``record_compact.compact`` merges them into records.parquet. This writes N requests of up to 128
chunks (``report_scale``'s varied records: Poisson at 300 req/s, 1-3 tokens a chunk, ~2 %
failures) into 4 shard streams in batches of ``--batch`` rows (the engine flushes every 0.2 s:
60 rows at 300 req/s) through the same ``StreamFile`` the engine's ``RecordWriter`` uses, then
compacts them in a child process and prints, with the load average:

- the streams' and the Parquet file's bytes per request and per chunk, and their ratio;
- the compaction's wall time and peak resident memory (``getrusage`` of the child).

``--writer`` writes through ``RecordWriter`` itself (a ``Record`` object per request, as the
engine does: slow, for a few tens of thousands of requests) to check the fast path's bytes.

Run: ``python benchmarks/records_compact.py [--requests 1000000] [--batch 60] [--writer]``.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_scale import CHUNKS, SLICE, T0, _slice  # noqa: E402

from loadgen.record_version import stamped  # noqa: E402
from loadgen.records import SCHEMA, SCHEMA_VERSION, Record, RecordWriter  # noqa: E402
from loadgen.run_folder import PARQUET_NAME
from loadgen.stream_file import StreamFile  # noqa: E402

SHARDS = 4


def write_streams(folder: Path, n: int, batch: int, writer: bool) -> int:
    """N requests into SHARDS streams (request i to shard i % SHARDS); returns the chunks written."""
    rng = np.random.default_rng(0)
    paths = [folder / f"records-w{s:02d}.arrows" for s in range(SHARDS)]
    writers = [RecordWriter(p, batch_size=batch) for p in paths] if writer else []
    files = [] if writer else [StreamFile(p, stamped(SCHEMA, SCHEMA_VERSION)) for p in paths]
    t, chunks = T0, 0
    for start in range(0, n, SLICE):
        rows, t = _slice(rng, start, min(SLICE, n - start), t, CHUNKS)
        chunks += int(pa.compute.sum(pa.compute.list_value_length(rows.column("chunk_ns"))).as_py())
        for s in range(SHARDS):
            part = rows.filter(pa.array(np.arange(rows.num_rows) % SHARDS == s))
            if writer:
                for rec in part.to_pylist():
                    writers[s].add(Record(**rec))
                continue
            for i in range(0, part.num_rows, batch):
                files[s].append(bytes(part.slice(i, batch).serialize()), min(batch, part.num_rows - i))
            files[s].sync()
    for f in files:
        f.close()
    for w in writers:
        w.close()
    return chunks


def compact_in_child(folder: Path) -> tuple[float, float]:
    """(seconds, peak RSS GiB) of ``record_compact.compact(folder)`` in a child process."""
    code = f"from loadgen.record_compact import compact; compact({str(folder)!r})"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=60, help="rows per flushed batch")
    ap.add_argument("--writer", action="store_true", help="write through RecordWriter (slow)")
    args = ap.parse_args()
    n = args.requests
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        chunks = write_streams(folder, n, args.batch, args.writer)
        streams = sum(p.stat().st_size for p in folder.glob("*.arrows"))
        print(f"wrote {n:,} requests ({chunks:,} chunks) in {SHARDS} streams: {time.perf_counter() - t:.1f} s")
        took, peak = compact_in_child(folder)
        parquet = (folder / PARQUET_NAME).stat().st_size
        assert pq.read_metadata(folder / PARQUET_NAME).num_rows == n
        print(f"records*.arrows: {streams / n:,.0f} B per request, {streams / chunks:.2f} B per chunk")
        print(f"records.parquet: {parquet / n:,.0f} B per request, {parquet / chunks:.2f} B per chunk")
        print(f"streams / parquet: {streams / parquet:.2f}")
        print(f"compact: {took:.1f} s, peak RSS {peak:.2f} GiB")
        print(f"load average: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
