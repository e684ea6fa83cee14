"""Run folders built by hand: records with the timings a test names, and the run.json around them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.records import Record, RecordWriter, read_stream, to_batch

MS = 1_000_000
T0 = 10_000_000_000


def make_run(
    d: Path,
    ttft_ms: list[float],
    *,
    itl_ms: float = 10.0,
    tokens: int = 8,
    gap_ms: float = 100.0,
    failed: int = 0,
    failed_status: str = "http_error",
    model: str = "m",
    turns: int = 1,
    meta: dict[str, Any] | None = None,
    point: int = 0,
    append: bool = False,
    lag_ms: float = 0.0,
) -> Path:
    """A run folder whose request i has TTFT ttft_ms[i]; ``failed`` more requests fail: with an
    HTTP 500 (a failure, no latency sample), or ``failed_status="timeout"``: never answered (a
    censored sample: its TTFT is at least its wait).

    Every request is sent ``lag_ms`` after its intended instant (the client fell behind by
    that much; give TTFTs above it, as TTFT counts from the intended instant).
    """
    d.mkdir(parents=True, exist_ok=True)
    recs = []
    lag = int(lag_ms * MS)
    for i, t in enumerate(ttft_ms):
        sched = T0 + point * 10**12 + int(i * gap_ms * MS)
        first = sched + int(t * MS)
        chunks = [first + int(k * itl_ms * MS) for k in range(tokens)]
        recs.append(
            Record(
                run_id="r",
                point=point,
                request=i,
                session=i // turns,
                turn=i % turns,
                model=model,
                t_sched=sched,
                t_sent=sched + lag,
                t_first=first,
                t_last=chunks[-1],
                t_done=chunks[-1] + MS,
                chunk_ns=chunks,
                chunk_tokens=[1] * tokens,
                output_tokens=tokens,
                output_tokens_requested=tokens,
                output_tokens_source="usage",
                finish_reason="length",
            )
        )
    for j in range(failed):
        sched = T0 + point * 10**12 + int((len(ttft_ms) + j) * gap_ms * MS)
        recs.append(
            Record(
                run_id="r",
                point=point,
                request=len(ttft_ms) + j,
                session=10**6 + j,
                t_sched=sched,
                t_sent=sched + lag,
                t_done=sched + lag + MS,
                status=failed_status,
                http_status=500 if failed_status == "http_error" else None,
                error="boom" if failed_status == "http_error" else "no data before the first-byte timeout",
            )
        )
    table = pa.Table.from_batches([to_batch(recs)])
    path = d / "records.parquet"
    if append and path.exists():
        table = pa.concat_tables([pq.read_table(path), table])
    pq.write_table(table, path)
    doc: dict[str, Any] = {
        "run_id": "r",
        "endpoint": "http://127.0.0.1:1/v1",
        "model": model,
        "settings": {"arrival": {"kind": "constant", "rate": 1000 / gap_ms}, "warmup_s": 0, "cooldown_s": 0},
        "workload": {"name": "w"},
    }
    doc.update(meta or {})
    (d / "run.json").write_bytes(orjson.dumps(doc))
    return d


def point_entry(k: int, rate: float, **extra: Any) -> dict[str, Any]:
    """A sweep's run.json entry for point k at ``rate`` req/s (``extra``: client, state, ...)."""
    arrival = {"kind": "constant", "rate": rate, "label": f"constant @ {rate:g} req/s"}
    return {"index": k, "phase": "list", "arrival": arrival, "warmup_s": 0.0, "cooldown_s": 0.0, **extra}


def make_sweep(
    d: Path,
    points: list[tuple[float, list[float], float]],
    *,
    clients: list[dict[str, Any]] | None = None,
    **meta: Any,
) -> Path:
    """A sweep folder: per point (rate req/s, TTFTs in ms, schedule lag in ms), spaced as the rate says;
    ``clients``: each point's run.json "client" block."""
    for k, (rate, ttft, lag) in enumerate(points):
        make_run(d, ttft, gap_ms=1000.0 / rate, point=k, append=k > 0, lag_ms=lag)
    entries = [point_entry(k, rate) for k, (rate, _, _) in enumerate(points)]
    for entry, client in zip(entries, clients or [], strict=False):
        entry["client"] = client
    doc: dict[str, Any] = {
        "run_id": "s",
        "endpoint": "http://127.0.0.1:1/v1",
        "model": "m",
        "settings": {"lag_limit_ms": 10.0},
        "workload": {"name": "w"},
        "sweep": {"mode": "rates"},
        "points": entries,
    }
    doc.update(meta)
    (d / "run.json").write_bytes(orjson.dumps(doc))
    return d


def profile(tmp_path: Path, criteria: str, head: str = "") -> Path:
    """An SLO profile file (prof.yaml in ``tmp_path``) with these criteria lines (YAML list items)."""
    p = tmp_path / "prof.yaml"
    p.write_text(f"name: test\n{head}criteria:\n{criteria}")
    return p


TTFT_P99 = '  - {name: TTFT p99, metric: ttft, statistic: p99, bound: "<= 200 ms"}\n'


def written(tmp_path: Path, *records: Record) -> pa.Table:
    """The records as the engine writes them: through RecordWriter (numbered in order), read
    back from the stream."""
    path = tmp_path / "records.arrows"
    with RecordWriter(path) as w:
        for i, r in enumerate(records):
            r.request = i
            w.add(r)
    return read_stream(path)
