"""records.parquet as a machine-readable output: its schema version, its annotation (in_window,
the derived latency columns, the window in its metadata), and the documented one-line queries
(docs/metrics.md, "Querying the records") giving exactly the summary's figures.

duckdb is not a dependency: the queries are run with pyarrow.compute and numpy, which the
docs give as the equivalents of ``quantile_disc`` (nearest rank).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from loadgen.analysis.annotate import annotate_run, annotation
from loadgen.analysis.metrics import Summary, summarize
from loadgen.analysis.points import point_window
from loadgen.analysis.window import choose_window
from loadgen.errors import ConfigError, SpecError
from loadgen.record_annotation import DERIVED, annotate, read_metadata
from loadgen.record_compact import compact
from loadgen.record_version import VERSION_KEY, parse_version
from loadgen.records import (
    SCHEMA,
    SCHEMA_VERSION,
    Record,
    RecordWriter,
    check_run_folder,
    read_records,
    read_stream,
    tool_info,
)
from loadgen.run_folder import PARQUET_NAME, STREAM_NAME

MS = 1_000_000
T0 = 50_000_000_000
PERCENTILES = (50, 90, 95, 99, 99.9)


# --------------------------------------------------------------------------- hand-built runs


def ns(ms: float) -> int:
    return T0 + round(ms * MS)


def mixed_records(point: int = 0, n: int = 160, seed: int = 7, offset_ms: float = 0.0) -> list[Record]:
    """Requests every 10 ms, every way a request can end: ok, cut after its first token, cut or
    timed out before one, never sent, an empty ok answer, and a 2-turn session whose second turn
    was never due (its first timed out)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sched = offset_ms + i * 10.0
        ttft = float(rng.lognormal(math.log(40.0), 0.5))
        base: dict[str, Any] = dict(run_id="r1", point=point, request=i, session=i, t_sched=ns(sched))
        kind = i % 16
        if kind == 3:  # cut after its first token: exact TTFT, censored E2E
            first = ns(sched + ttft)
            chunks = [first, first + 5 * MS]
            out.append(
                Record(
                    **base,
                    status="cancelled",
                    t_sent=ns(sched + 0.1),
                    t_first=first,
                    t_last=chunks[-1],
                    t_done=chunks[-1] + MS,
                    chunk_ns=chunks,
                    chunk_tokens=[1, 1],
                    output_tokens=2,
                )
            )
        elif kind == 5:  # cancelled while waiting: censored at t_done - t_sched
            out.append(Record(**base, status="cancelled", t_sent=ns(sched + 0.1), t_done=ns(sched + 900 + i)))
        elif kind == 7:  # a timeout before any token
            out.append(Record(**base, status="timeout", t_sent=ns(sched + 0.1), t_done=ns(sched + 1500 + i)))
        elif kind == 9:  # never sent: censored at the end of observation
            out.append(Record(**base, status="not_sent", error="the run was stopped"))
        elif kind == 11:  # an empty ok answer: no TTFT sample at all
            out.append(Record(**base, status="ok", t_sent=ns(sched + 0.1), t_done=ns(sched + 30)))
        elif kind == 13:  # a session whose first turn timed out: its second was never due
            out.append(Record(**base, status="timeout", t_sent=ns(sched + 0.1), t_done=ns(sched + 2000 + i)))
            out.append(Record(**{**base, "request": 10_000 + i, "t_sched": ns(sched + 1)}, turn=1, status="not_sent"))
        else:
            first = ns(sched + ttft)
            chunks = [first + k * 7 * MS for k in range(6)]
            out.append(
                Record(
                    **base,
                    status="ok",
                    t_sent=ns(sched + 0.1),
                    t_first=first,
                    t_last=chunks[-1],
                    t_done=chunks[-1] + MS,
                    chunk_ns=chunks,
                    chunk_tokens=[1, 2, 1, 1, 3, 1],
                    output_tokens=9,
                    output_tokens_source="chunks",
                    finish_reason="stop",
                )
            )
    return out


def run_folder(d: Path, records: list[Record], meta: dict[str, Any] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    with RecordWriter(d / STREAM_NAME, batch_size=37) as w:
        for r in records:
            w.add(r)
    compact(d)
    (d / "run.json").write_bytes(orjson.dumps(meta or {"run_id": "r1", "settings": {"warmup_s": 0.2}}))
    return d


# --------------------------------------------------------------------------- the documented queries


def quantile_disc(values: pa.ChunkedArray | pa.Array, p: float) -> float:
    """docs/metrics.md's pyarrow recipe: nearest rank over the non-null values."""
    v = pc.drop_null(values)
    return float(v.take(pc.sort_indices(v))[max(math.ceil(p / 100 * len(v)), 1) - 1].as_py())


def in_window(table: pa.Table, column: str, point: int | None = None) -> pa.ChunkedArray:
    keep = table["in_window"] if point is None else pc.and_(table["in_window"], pc.equal(table["point"], point))
    return table.filter(keep)[column]


def lower_bound(table: pa.Table, p: float, point: int | None = None) -> bool:
    """docs/metrics.md's recipe for the flag: a censored sample ranks at or below the estimate
    (a censored sample ranks after an exact one of the same value)."""
    t = table.filter(pc.and_(table["in_window"], pc.is_valid(table["ttft_ms"])))
    if point is not None:
        t = t.filter(pc.equal(t["point"], point))
    order = t.sort_by([("ttft_ms", "ascending"), ("ttft_censored", "ascending")])
    k = max(math.ceil(p / 100 * t.num_rows), 1) - 1
    return bool(pc.any(order["ttft_censored"].slice(0, k + 1)).as_py())


def expected(summary: Summary, name: str, p: float) -> float:
    return float(getattr(summary, name).pct(p)[0])


# --------------------------------------------------------------------------- the one-liners


SIZES = (160, 161)  # an even and an odd count of TTFT samples in the window


@pytest.mark.parametrize("n", SIZES)
def test_a_one_line_query_over_in_window_gives_the_summarys_percentiles(tmp_path: Path, n: int) -> None:
    d = run_folder(tmp_path / "run", mixed_records(n=n))
    table = read_records(d)
    window = choose_window(table, warmup_s=0.2)
    summary = summarize(table, window)
    assert summary.ttft.censored > 0 and summary.e2e.censored > 0  # the rule is exercised
    assert annotate_run(d, window) == d / PARQUET_NAME

    annotated = pq.read_table(d / PARQUET_NAME)
    assert pc.sum(annotated["in_window"]).as_py() == summary.requests < annotated.num_rows
    for p in PERCENTILES:
        assert quantile_disc(in_window(annotated, "ttft_ms"), p) == expected(summary, "ttft", p)
        assert quantile_disc(in_window(annotated, "e2e_ms"), p) == expected(summary, "e2e", p)
        assert quantile_disc(in_window(annotated, "tpot_ms"), p) == expected(summary, "tpot", p)
        assert lower_bound(annotated, p) == summary.ttft.lower_bound(p)
        values = pc.drop_null(in_window(annotated, "ttft_ms")).to_numpy()
        assert np.quantile(values, p / 100, method="inverted_cdf") == expected(summary, "ttft", p)
    assert summary.ttft.lower_bound(99) and not summary.ttft.lower_bound(50)
    assert len(pc.drop_null(in_window(annotated, "ttft_ms"))) == summary.ttft.n
    assert pc.sum(in_window(annotated, "ttft_censored")).as_py() == summary.ttft.censored


def test_the_percentile_method_matters_on_these_records(tmp_path: Path) -> None:
    """The test above could not pass with another quantile definition: each of pyarrow's own
    methods gives another value for some percentile of these records."""
    ours, theirs = [], {m: [] for m in ("linear", "lower", "higher", "nearest", "midpoint")}
    for n in SIZES:
        d = run_folder(tmp_path / f"run{n}", mixed_records(n=n))
        annotate_run(d)
        values = pc.drop_null(in_window(pq.read_table(d / PARQUET_NAME), "ttft_ms"))
        ours += [quantile_disc(values, p) for p in PERCENTILES]
        for method, found in theirs.items():
            found += [pc.quantile(values, q=p / 100, interpolation=method)[0].as_py() for p in PERCENTILES]
    for method, found in theirs.items():
        assert found != ours, method


def test_ttft_ms_counts_each_request_as_the_censoring_rule_says(tmp_path: Path) -> None:
    records = mixed_records(n=16)
    d = run_folder(tmp_path / "run", records, {"run_id": "r1", "settings": {}})
    annotate_run(d)
    rows = {(r["request"]): r for r in pq.read_table(d / PARQUET_NAME).to_pylist()}
    end_ms = max(r.t_done or 0 for r in records) / MS - T0 / MS  # the end of observation (the last t_done)
    assert rows[3]["ttft_censored"] is False and rows[3]["e2e_censored"] is True  # cut after its first token
    assert rows[5]["ttft_ms"] == pytest.approx(905.0) and rows[5]["ttft_censored"] is True
    assert rows[7]["ttft_ms"] == pytest.approx(1507.0) and rows[7]["ttft_censored"] is True
    assert rows[9]["ttft_ms"] == pytest.approx(end_ms - 90.0) and rows[9]["ttft_censored"] is True
    assert rows[11]["ttft_ms"] is None and rows[11]["ttft_censored"] is None  # an empty answer: nothing owed
    assert rows[11]["e2e_ms"] == pytest.approx(30.0) and rows[11]["e2e_censored"] is False
    assert rows[10_013]["ttft_ms"] is None and rows[10_013]["e2e_ms"] is None  # never due: no sample
    assert rows[0]["ttft_censored"] is False and rows[0]["tpot_ms"] == pytest.approx(35.0 / 8)


def test_each_sweep_point_is_judged_in_its_own_window(tmp_path: Path) -> None:
    records = mixed_records(point=0, seed=1) + mixed_records(point=1, seed=2, offset_ms=60_000.0)
    points = [{"index": 0, "warmup_s": 0.1, "cooldown_s": 0.0}, {"index": 1, "warmup_s": 0.5, "cooldown_s": 0.3}]
    d = run_folder(tmp_path / "sweep", records, {"run_id": "s1", "points": points, "sweep": {}})
    assert annotate_run(d) is not None  # windows as the report chooses them from run.json
    annotated = pq.read_table(d / PARQUET_NAME)
    table = read_records(d)
    windows = json.loads(read_metadata(d)["loadgen.windows"])
    assert [w["point"] for w in windows] == [0, 1]
    for k, pm in enumerate(points):
        rows = table.filter(pc.equal(table["point"], k))
        window, _ = point_window(rows, pm["warmup_s"], pm["cooldown_s"])
        summary = summarize(rows, window)
        assert (windows[k]["start_ns"], windows[k]["end_ns"]) == (window.start_ns, window.end_ns)
        assert windows[k]["requests_in_window"] == summary.requests
        for p in PERCENTILES:
            assert quantile_disc(in_window(annotated, "ttft_ms", k), p) == expected(summary, "ttft", p)
            assert lower_bound(annotated, p, k) == summary.ttft.lower_bound(p)


# --------------------------------------------------------------------------- the annotation


def test_annotate_keeps_every_record_and_its_order(tmp_path: Path) -> None:
    d = run_folder(tmp_path / "run", mixed_records())
    before = pq.read_table(d / PARQUET_NAME)
    annotate_run(d)
    after = pq.read_table(d / PARQUET_NAME)
    assert after.column_names == [*SCHEMA.names, *DERIVED]
    assert after.select(SCHEMA.names).equals(before)
    assert read_records(d).equals(before)  # readers see the records alone, as before
    assert read_records(d).schema.names == SCHEMA.names


def test_the_metadata_names_the_run_the_schema_the_window_and_the_tool(tmp_path: Path) -> None:
    d = run_folder(tmp_path / "run", mixed_records(), {"run_id": "run-42", "settings": {"warmup_s": 0.2}})
    table = read_records(d)
    window = choose_window(table, warmup_s=0.2)
    annotate_run(d, window, table=table)
    meta = read_metadata(d)
    assert meta[VERSION_KEY] == SCHEMA_VERSION
    assert meta["loadgen.version"] == tool_info()["version"]
    assert meta["loadgen.run_id"] == "run-42"
    (w,) = json.loads(meta["loadgen.windows"])
    assert (w["point"], w["start_ns"], w["end_ns"], w["how"]) == (0, window.start_ns, window.end_ns, window.how)
    assert w["warmup_s"] == 0.2 and "warm-up 0.2 s" in w["how"]
    assert "quantile_disc" in meta["loadgen.percentiles"] and "in_window" in meta["loadgen.example_query"]


def test_annotating_again_replaces_the_first_annotation(tmp_path: Path) -> None:
    d = run_folder(tmp_path / "run", mixed_records())
    table = read_records(d)
    annotate_run(d, choose_window(table))
    everything = pc.sum(pq.read_table(d / PARQUET_NAME)["in_window"]).as_py()
    later = choose_window(table, warmup_s=0.5)
    annotate_run(d, later)
    after = pq.read_table(d / PARQUET_NAME)
    assert after.column_names == [*SCHEMA.names, *DERIVED]
    assert pc.sum(after["in_window"]).as_py() == summarize(table, later).requests < everything
    assert json.loads(read_metadata(d)["loadgen.windows"])[0]["warmup_s"] == 0.5


def test_a_failed_rewrite_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = run_folder(tmp_path / "run", mixed_records())
    before = (d / PARQUET_NAME).read_bytes()

    def full_disk(writer: pq.ParquetWriter, table: pa.Table, **kw: Any) -> None:
        raise OSError(28, "No space left on device")  # (the writer has begun the file)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk)
    with pytest.raises(ConfigError, match="cannot annotate .*No space left.*unchanged"):
        annotate_run(d)
    assert (d / PARQUET_NAME).read_bytes() == before
    assert sorted(p.name for p in d.iterdir()) == [PARQUET_NAME, "run.json"]


def test_a_run_never_compacted_is_left_alone(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    with RecordWriter(d / STREAM_NAME) as w:
        w.add(mixed_records(n=1)[0])
    (d / "run.json").write_bytes(orjson.dumps({"run_id": "r1"}))
    assert annotate_run(d) is None
    with pytest.raises(ConfigError, match="no records.parquet to annotate"):
        annotate(d, np.ones(1, dtype=bool), {})


def test_annotate_refuses_values_that_do_not_fit_the_rows(tmp_path: Path) -> None:
    d = run_folder(tmp_path / "run", mixed_records(n=16))
    n = pq.read_metadata(d / PARQUET_NAME).num_rows
    with pytest.raises(ValueError, match=f"in_window must be {n} bools"):
        annotate(d, np.ones(n - 1, dtype=bool), {})
    with pytest.raises(ValueError, match="in_window must be"):
        annotate(d, np.ones(n), {})  # floats, not bools
    with pytest.raises(ValueError, match="not a derived column: status"):
        annotate(d, np.ones(n, dtype=bool), {}, {"status": np.zeros(n)})
    with pytest.raises(ValueError, match="must be a str starting 'loadgen.'"):
        annotate(d, np.ones(n, dtype=bool), {"run_id": "x"})


def test_a_column_left_out_is_written_null(tmp_path: Path) -> None:
    d = run_folder(tmp_path / "run", mixed_records(n=16))
    n = pq.read_metadata(d / PARQUET_NAME).num_rows
    annotate(d, np.zeros(n, dtype=bool), {"loadgen.note": "by hand"}, {"ttft_ms": np.full(n, 1.5)})
    t = pq.read_table(d / PARQUET_NAME)
    assert t["ttft_ms"].to_pylist() == [1.5] * n and t["e2e_ms"].null_count == n
    assert read_metadata(d)["loadgen.note"] == "by hand" and read_metadata(d)[VERSION_KEY] == SCHEMA_VERSION


def test_compact_leaves_an_annotated_folder_as_it_is(tmp_path: Path) -> None:
    d = run_folder(tmp_path / "run", mixed_records(n=16), {"run_id": "r1", "settings": {}})
    annotate_run(d)
    before = (d / PARQUET_NAME).read_bytes()
    compact(d)
    assert (d / PARQUET_NAME).read_bytes() == before


def test_a_single_run_has_one_window() -> None:
    table = SCHEMA.empty_table()
    window = choose_window(table)
    with pytest.raises(ValueError, match="one window"):
        annotation(table, {0: window, 1: window})
    assert annotation(table, window).in_window.shape == (0,)


# --------------------------------------------------------------------------- the schema version


def test_every_records_file_carries_the_schema_version(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    with RecordWriter(d / STREAM_NAME) as w:
        w.add(mixed_records(n=1)[0])
    with pa.ipc.open_stream(d / STREAM_NAME) as reader:
        assert reader.schema.metadata[VERSION_KEY.encode()] == SCHEMA_VERSION.encode()
    compact(d)
    meta = pq.read_schema(d / PARQUET_NAME).metadata
    assert meta[VERSION_KEY.encode()] == SCHEMA_VERSION.encode()
    assert meta[b"loadgen.version"] == tool_info()["version"].encode()
    assert parse_version(SCHEMA_VERSION) >= (1, 1)


def write_parquet(d: Path, version: str | None, extra: dict[str, str] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([{"run_id": "r", "t_sched": 5, "status": "ok"}], schema=SCHEMA)
    meta = {} if version is None else {VERSION_KEY: version}
    pq.write_table(table.replace_schema_metadata({**meta, **(extra or {})}), d / PARQUET_NAME)
    (d / "run.json").write_bytes(b'{"run_id": "r"}')
    return d


@pytest.mark.parametrize("version", [None, "1", "1.0", "1.1", "1.9"])
def test_an_older_or_newer_minor_file_is_read(tmp_path: Path, version: str | None) -> None:
    d = write_parquet(tmp_path / "run", version)
    check_run_folder(d)
    assert read_records(d).num_rows == 1


def test_a_newer_major_version_is_refused_in_one_line(tmp_path: Path) -> None:
    d = write_parquet(tmp_path / "run", "2.0")
    for read in (check_run_folder, read_records, annotate_run):
        with pytest.raises(SpecError) as e:
            read(d)
        message = str(e.value)
        assert "records schema version 2.0 is newer than this loadgen reads" in message and "\n" not in message


def test_a_newer_major_stream_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / STREAM_NAME
    schema = SCHEMA.with_metadata({VERSION_KEY: "3.1"})
    with pa.ipc.new_stream(path, schema) as w:
        w.write_table(pa.Table.from_pylist([{"run_id": "r", "t_sched": 1, "status": "ok"}], schema=schema))
    with pytest.raises(SpecError, match="version 3.1 is newer"):
        read_stream(path)


def test_a_malformed_version_is_a_spec_error(tmp_path: Path) -> None:
    d = write_parquet(tmp_path / "run", "one point one")
    with pytest.raises(SpecError, match="not a MAJOR.MINOR version"):
        read_records(d)


def test_an_older_file_annotated_gains_the_columns_it_lacked(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    old = pa.Table.from_pylist(
        [{"run_id": "r", "t_sched": ns(i * 10), "status": "timeout", "t_done": ns(i * 10 + 50)} for i in range(4)],
        schema=SCHEMA,
    ).drop_columns(["t_first_content", "reasoning_tokens"])
    pq.write_table(old, d / PARQUET_NAME)  # version 1: no version stamped, the columns of then
    (d / "run.json").write_bytes(b'{"run_id": "r"}')
    annotate_run(d)
    after = pq.read_table(d / PARQUET_NAME)
    assert after.column_names == [*SCHEMA.names, *DERIVED]
    assert after["reasoning_tokens"].null_count == 4 and read_metadata(d)[VERSION_KEY] == SCHEMA_VERSION
    assert after["ttft_ms"].to_pylist() == [50.0] * 4 and all(after["ttft_censored"].to_pylist())


def test_a_newer_minor_file_keeps_its_columns_and_version(tmp_path: Path) -> None:
    major, minor = parse_version(SCHEMA_VERSION)
    newer = f"{major}.{minor + 1}"
    d = write_parquet(tmp_path / "run", newer)
    table = pq.read_table(d / PARQUET_NAME)
    pq.write_table(table.append_column("t_future", pa.array([7], pa.int64())), d / PARQUET_NAME)
    annotate(d, np.ones(1, dtype=bool), {})
    after = pq.read_table(d / PARQUET_NAME)
    assert after.column_names == [*SCHEMA.names, "t_future", *DERIVED]
    assert after["t_future"].to_pylist() == [7] and read_metadata(d)[VERSION_KEY] == newer
