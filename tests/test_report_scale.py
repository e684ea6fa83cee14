"""The analysis at a million requests gives the very figures it gave before it was made to scale.

``pins/report_scale_before.json`` holds the figures of a small, varied run (``report_scale_run``)
as the code before the one-pass analysis computed them (issue 18): the summary with and without
a window and an SLO, the time series at two intervals, the sessions, and the CDF and gate samples
(as hashes of their bytes). Every figure must be equal, except the means and their intervals
(and a Dist's ``mean_ci``), which are now summed block by block rather than over one sorted
array: those agree to 1e-12 relative.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from report_scale_run import varied_table

from loadgen import record_annotation, record_compact
from loadgen.analysis import forked, interval_counts, selection, value_buckets
from loadgen.analysis import timeseries as timeseries_module
from loadgen.analysis.annotate import annotate_run
from loadgen.analysis.chunk_walk import chunk_blocks, itl_icl
from loadgen.analysis.columns import Cols
from loadgen.analysis.interval_counts import hist_percentile
from loadgen.analysis.latency_samples import latency_samples
from loadgen.analysis.metrics import SLO, summarize, summary_to_json
from loadgen.analysis.selection import describe_blocks
from loadgen.analysis.sessions import session_summary
from loadgen.analysis.stats import describe
from loadgen.analysis.timeseries import chart_interval, timeseries
from loadgen.analysis.window import choose_window
from loadgen.record_annotation import DERIVED
from loadgen.record_compact import compact
from loadgen.record_parquet import ROW_GROUP_ROWS, parquet_writer
from loadgen.records import SCHEMA, Record, RecordWriter, file_metadata, read_records, read_stream, to_batch
from loadgen.run_folder import PARQUET_NAME
from loadgen.stream_file import StreamFile

PINS = Path(__file__).parent / "pins" / "report_scale_before.json"
SUMMED = {"mean", "lo", "hi"}  # keys whose values are sums (a Dist's mean and its interval)


def _hash(a: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float64).tobytes()).hexdigest()


def figures(t: pa.Table) -> dict[str, Any]:
    w = choose_window(t, warmup_s=1.0, cooldown_s=1.0)
    c = Cols.of(t)
    itl, icl = itl_icl(c, w.contains(c.t_sched))
    return {
        "summary": summary_to_json(summarize(t, w, SLO(ttft_ms=400, tpot_ms=20, e2e_ms=3000))),
        "summary_whole": summary_to_json(summarize(t)),
        "timeseries": timeseries(t),
        "timeseries_half": timeseries(t, 0.5),
        "sessions": session_summary(t, w).to_json(),
        "samples": {k: [int(v.size), _hash(v)] for k, v in latency_samples(t, w).items()},
        "itl_icl": [_hash(itl), _hash(icl)],
    }


def differences(old: Any, new: Any, path: str = "", summed: bool = False) -> list[str]:
    """Where ``new`` differs from ``old``: exactly, or beyond 1e-12 under a summed key."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{path}: keys {sorted(set(old) ^ set(new))}"] if set(old) != set(new) else []
        for k in old.keys() & new.keys():
            inside = summed or (k == "mean_ci")
            out += differences(old[k], new[k], f"{path}.{k}", inside or (k in SUMMED and path.count(".") <= 2))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if summed and isinstance(old, float) and isinstance(new, float) and math.isclose(old, new, rel_tol=1e-12):
        return []
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def test_every_figure_is_what_it_was_before_the_one_pass_analysis() -> None:
    new = orjson.loads(orjson.dumps(figures(varied_table())))  # as summary.json writes them
    old = orjson.loads(PINS.read_bytes())
    assert differences(old, new) == []


def test_only_the_means_may_differ_in_their_last_digits() -> None:
    old = orjson.loads(PINS.read_bytes())
    bent = orjson.loads(PINS.read_bytes())
    bent["summary"]["itl"]["mean"] *= 1 + 1e-15
    bent["summary"]["itl"]["mean_ci"]["hi"] *= 1 + 1e-15
    assert differences(old, bent) == []
    bent["summary"]["itl"]["percentiles"]["p99"]["value"] *= 1 + 1e-15
    bent["summary"]["ttft"]["n"] += 1
    assert len(differences(old, bent)) == 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_describe_blocks_is_describe_of_the_expanded_sample(seed: int) -> None:
    rng = np.random.default_rng(seed)
    blocks = [(rng.lognormal(2.0, 1.0, 5000).round(rng.integers(0, 4)), rng.integers(0, 4, 5000)) for _ in range(4)] + [
        (np.array([-3.5, 0.0, 0.0, 1e30, np.nan]), np.array([1, 2, 1, 1, 3]))
    ]
    expanded = np.concatenate([np.repeat(v, k) for v, k in blocks])
    want, got = describe(expanded), describe_blocks(lambda: iter(blocks))
    assert (got.n, got.min, got.max, got.pcts) == (want.n, want.min, want.max, want.pcts)
    assert got.mean == pytest.approx(want.mean, rel=1e-12) or math.isnan(want.mean)


def test_a_few_samples_and_none() -> None:
    for values in ([], [4.0], [4.0, 1.0], [2.0] * 7):
        blocks: list[tuple[np.ndarray, None]] = [(np.asarray(values, float), None)]
        want, got = describe(values), describe_blocks(blocks.copy)  # each pass: the one block again
        assert orjson.dumps(got.to_json()) == orjson.dumps(want.to_json())


def test_chunk_blocks_walk_whole_requests_in_order() -> None:
    t = varied_table(400)
    c = Cols.of(t)
    rows = np.arange(c.n) % 3 != 0
    blocks = list(chunk_blocks(c, rows, size=500))
    assert len(blocks) > 3
    got = np.concatenate([b.row0 + b.owner for b in blocks])
    assert np.array_equal(got, c.c_owner[rows[c.c_owner]])
    assert np.array_equal(np.concatenate([b.ns for b in blocks]), c.c_ns[rows[c.c_owner]])
    assert Cols.of(t) is c  # converted once per table

    sound = t.filter(pa.array(np.arange(t.num_rows) != 7))  # (row 7's token list is malformed: one part)
    whole = Cols.of(sound)
    parted = Cols.of(pa.concat_tables([sound.slice(0, 150), sound.slice(150, 100), sound.slice(250)]))  # row groups
    assert (len(whole.c_parts), len(parted.c_parts)) == (1, 3)
    for a, b in zip(itl_icl(whole, rows[1:]), itl_icl(parted, rows[1:]), strict=True):
        assert np.array_equal(a, b)


def test_the_stream_is_compressed_and_reads_back_whole(tmp_path: Path) -> None:
    recs = [
        Record(
            run_id="r",
            request=i,
            t_sched=10**12 + i,
            chunk_ns=list(range(10**12, 10**12 + 64 * 997, 997)),
            chunk_tokens=[1] * 64,
            output_tokens=64,
        )
        for i in range(600)
    ]
    with RecordWriter(tmp_path / "records.arrows", batch_size=300) as w:
        for r in recs:
            w.add(r)
    raw = StreamFile(tmp_path / "raw.arrows", SCHEMA, compression=None)
    for i in (0, 300):
        raw.append(bytes(to_batch(recs[i : i + 300]).serialize()), 300)
    raw.close()
    assert (tmp_path / "records.arrows").stat().st_size < 0.5 * (tmp_path / "raw.arrows").stat().st_size
    back = read_stream(tmp_path / "records.arrows")
    assert back.column("chunk_ns").to_pylist() == [r.chunk_ns for r in recs]
    assert back.equals(read_stream(tmp_path / "raw.arrows"))


def test_a_cdf_can_take_its_steps_without_sorting_every_token() -> None:
    t = varied_table(600)
    got = latency_samples(t, choose_window(t))
    for kind in ("itl", "ttft"):
        drawn = np.sort(got[kind][np.isfinite(got[kind]) & (got[kind] > 0)])
        ranks = np.unique(np.linspace(0, drawn.size - 1, 37).round().astype(int))
        assert got.positive_count(kind) == drawn.size
        assert np.array_equal(got.positive_at(kind, ranks), drawn[ranks])


def test_many_ranks_are_gathered_a_few_buckets_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "_GATHER", 64)  # a CDF's 400 ranks of a run: here, of 3,000 samples
    rng = np.random.default_rng(3)
    blocks = [(rng.lognormal(1.0, 0.7, 1000), rng.integers(1, 4, 1000)) for _ in range(3)]
    expanded = np.sort(np.concatenate([np.repeat(v, k) for v, k in blocks]))
    ranks = np.unique(np.linspace(0, expanded.size - 1, 400).round().astype(int))
    assert np.array_equal(selection.order_statistics(blocks.copy, ranks), expanded[ranks])


def test_a_cdfs_ranks_take_one_pass_after_the_first_from_the_fine_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "_GATHER", 4000)  # a first-pass bucket's samples: too many to gather 400 of
    rng = np.random.default_rng(5)
    blocks = [(rng.lognormal(3.0, 0.5, 20_000), rng.integers(1, 4, 20_000)) for _ in range(3)]
    expanded = np.sort(np.concatenate([np.repeat(v, k) for v, k in blocks]))
    ranks = np.unique(np.linspace(0, expanded.size - 1, 400).round().astype(int))
    walks: list[int] = []

    def counted() -> list[tuple[Any, Any]]:
        walks.append(1)
        return blocks.copy()

    assert np.array_equal(selection.order_statistics(counted, ranks), expanded[ranks])
    assert len(walks) == 2  # the first pass, then one gathering the ranks' fine buckets
    coarse = selection.first_passes(lambda: ([b] for b in blocks), 1, finely=[False])[0]
    walks.clear()
    assert np.array_equal(selection.order_statistics(counted, ranks, coarse), expanded[ranks])
    assert len(walks) == 2  # without fine counts: a pass narrowing the crowded buckets, then one gathering


def test_ranks_beyond_the_finely_counted_octaves_are_exact_too() -> None:
    rng = np.random.default_rng(8)
    wide = np.concatenate([rng.lognormal(0.0, 12.0, 3000), np.zeros(200), rng.lognormal(2.0, 0.3, 3000)])
    rng.shuffle(wide)
    blocks = [(wide[i::4], rng.integers(1, 3, wide[i::4].size)) for i in range(4)]
    expanded = np.sort(np.concatenate([np.repeat(v, k) for v, k in blocks]))
    ranks = np.arange(0, expanded.size, 7)  # first-pass and fine buckets alike, in the same passes
    assert np.array_equal(selection.order_statistics(blocks.copy, ranks), expanded[ranks])


def test_a_fine_window_over_the_end_of_the_buckets_counts_every_sample_too() -> None:
    # a median near the floats' largest magnitude: its fine window reaches past the last bucket
    rng = np.random.default_rng(12)
    blocks = [np.float64(1.7e308) * (0.5 + 0.5 * rng.random(3000)) for _ in range(3)]
    with np.errstate(over="ignore", invalid="ignore"):  # (the mean of such values overflows: not counted here)
        first = selection.first_passes(lambda: ([(b, None)] for b in blocks), 1)[0]
    keys = np.concatenate([value_buckets.ordered(b) >> value_buckets.FINE_SHIFT for b in blocks])
    shift = value_buckets.KEY_SHIFT - value_buckets.FINE_SHIFT
    want = np.bincount((keys >> shift) + value_buckets.KEYS // 2, minlength=value_buckets.KEYS)
    assert (first.fine0 >> shift) + value_buckets.KEYS // 2 + value_buckets.FINE // (1 << shift) > value_buckets.KEYS
    assert np.array_equal(first.counts, want) and first.n == keys.size


@pytest.mark.parametrize("weighted", [True, False])
def test_first_pass_counts_are_each_samples_bucket_whether_inside_the_fine_window_or_not(weighted: bool) -> None:
    # after the first block only the fine window is counted whole: its sums per bucket, plus the
    # samples outside it, must be the first-pass counts of every sample, and the fine counts its own
    rng = np.random.default_rng(11)
    blocks = [np.concatenate([rng.lognormal(3.0, 0.4, 5000), rng.lognormal(0.0, 9.0, 500), [0.0, -1.5]])]
    blocks += [rng.lognormal(3.0 + i, 0.4 + i, 5000) for i in range(3)]  # later ones drift past the window
    weights = [rng.integers(1, 4, b.size) if weighted else None for b in blocks]
    pairs = list(zip(blocks, weights, strict=True))
    first = selection.first_passes(lambda: ([pair] for pair in pairs), 1)[0]
    keys = np.concatenate([value_buckets.ordered(b) >> value_buckets.FINE_SHIFT for b in blocks])
    each = np.concatenate([np.ones(b.size, dtype=np.int64) if w is None else w for b, w in pairs])
    shift = value_buckets.KEY_SHIFT - value_buckets.FINE_SHIFT
    want = np.bincount((keys >> shift) + value_buckets.KEYS // 2, weights=each, minlength=value_buckets.KEYS)
    assert np.array_equal(first.counts, want.astype(np.int64))
    assert first.fine is not None
    at = keys - first.fine0
    inside = (at >= 0) & (at < value_buckets.FINE)
    assert 0 < inside.sum() < keys.size  # both paths taken
    fine = np.bincount(at[inside], weights=each[inside], minlength=value_buckets.FINE)
    assert np.array_equal(first.fine, fine.astype(np.int64))
    assert first.n == int(each.sum())


# --------------------------------------------------------------------------- the passes over the records


def test_the_chart_interval_comes_from_the_same_pass_and_is_what_it_would_be_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(timeseries_module, "CHART_INTERVALS", 5)  # 20 s of requests: charted every 4 s
    t = varied_table(1000)
    span_s = (pc.max(t.column("t_sched")).as_py() - pc.min(t.column("t_sched")).as_py()) / 1e9
    chart = chart_interval(t)
    assert chart == span_s / 5 > 3.5
    passes: list[tuple[float, ...]] = []
    one_pass = timeseries_module._all_series

    def counted(table: pa.Table, intervals: tuple[float, ...], t0_ns: int | None) -> Any:
        passes.append(intervals)
        return one_pass(table, intervals, t0_ns)

    monkeypatch.setattr(timeseries_module, "_all_series", counted)
    every_second = timeseries(t)
    charted = timeseries(t, chart)
    assert passes == [(1.0, chart)]  # both from one pass over the chunks
    alone = pa.Table.from_batches(t.to_batches())  # another table: its own passes, one interval each
    assert timeseries(alone, chart) == charted and len(charted) >= 5
    assert timeseries(alone, 1.0) == every_second and passes[1:] == [(chart,), (1.0,)]


def test_compact_sorts_row_group_by_row_group_as_one_sort_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = varied_table(400).drop_columns(["point"]).append_column("point", pa.array([0, 1] * 200, pa.int32()))
    t = t.select(SCHEMA.names)
    rng = np.random.default_rng(3)
    shuffled = t.take(rng.permutation(t.num_rows))  # out of order within and across the streams' batches
    for shard in range(2):
        rows = shuffled.slice(shard * 200, 200)
        stream = StreamFile(tmp_path / f"records-w0{shard}.arrows", SCHEMA)
        for b in rows.to_batches(max_chunksize=17):
            stream.append(bytes(b.serialize()), b.num_rows)
        stream.close()
    monkeypatch.setattr(record_compact, "ROW_GROUP_ROWS", 64)
    compact(tmp_path)
    got = pq.ParquetFile(tmp_path / PARQUET_NAME)
    assert [got.metadata.row_group(i).num_rows for i in range(got.num_row_groups)] == [64] * 6 + [16]
    group = got.metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    for delta in ("chunk_ns.list.element", "t_sched", "t_first", "request"):  # instants and ids as deltas
        assert "DELTA_BINARY_PACKED" in encodings[delta] and "RLE_DICTIONARY" not in encodings[delta]
    for coded in ("chunk_tokens.list.element", "status", "http_status"):  # few distinct values: by dictionary
        assert "RLE_DICTIONARY" in encodings[coded]
    in_order = shuffled.sort_by([("point", "ascending"), ("t_sched", "ascending")])
    assert got.read().equals(in_order)
    assert read_records(tmp_path).equals(in_order.replace_schema_metadata(None))  # 7 groups, read 2 at a time


def test_annotate_writes_from_the_table_it_is_given_reading_only_the_footer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = varied_table(300)
    newer = t.append_column("from_a_newer_minor", pa.array(range(t.num_rows), pa.int64()))
    pq.write_table(newer.replace_schema_metadata(file_metadata()), tmp_path / PARQUET_NAME, row_group_size=100)
    (tmp_path / "run.json").write_bytes(orjson.dumps({"run_id": "r", "settings": {}}))
    table = read_records(tmp_path)
    whole = pq.read_table
    asked: list[object] = []

    def only_new_columns(where: Path, columns: list[str] | None = None, **kw: Any) -> pa.Table:
        asked.append(columns)
        return whole(where, columns=columns, **kw)

    monkeypatch.setattr(pq, "read_table", only_new_columns)
    monkeypatch.setattr(record_annotation, "ROW_GROUP_ROWS", 128)
    monkeypatch.setattr(forked, "_FORK", False)  # the rewrite in a thread: its reads are seen here
    annotate_run(tmp_path, table=table)
    assert asked == [["from_a_newer_minor"]]  # the records themselves are not read again
    monkeypatch.undo()
    out = pq.ParquetFile(tmp_path / PARQUET_NAME)
    groups = [out.metadata.row_group(i).num_rows for i in range(out.num_row_groups)]
    assert groups == [128, 128, 44]  # as compaction writes them, whatever the file had (100 a group)
    back = out.read()
    assert back.column_names == [*SCHEMA.names, "from_a_newer_minor", *DERIVED]
    assert back.select(SCHEMA.names).equals(t.select(SCHEMA.names)) and back["from_a_newer_minor"].equals(
        newer["from_a_newer_minor"]
    )
    with pytest.raises(ValueError, match="the table given has 299 rows, the file 300"):
        annotate_run(tmp_path, table=table.slice(1))


def test_interval_percentiles_are_the_histograms_own_without_building_one() -> None:
    rng = np.random.default_rng(5)
    bucket = np.sort(rng.choice([0, 1, 2, 5, 9], 500))  # intervals 3, 4, 6, 7, 8 hold nothing
    value_ms = rng.lognormal(np.log(30), 1.5, bucket.size)
    counts = rng.integers(1, 4, bucket.size)
    sp = interval_counts.IntervalCounts.of(bucket, value_ms, counts)
    for p, got in interval_counts.percentiles(sp, 10, (1, 50, 99, 100)).items():
        want = [hist_percentile(sp.hist(i), p) if sp.hist(i).get_total_count() else -1 for i in range(10)]
        assert got.tolist() == want


def test_ranks_in_crowded_buckets_are_found_by_narrowing_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "_GATHER", 16)  # no bucket may be gathered whole: each is narrowed first
    rng = np.random.default_rng(11)
    crowded = np.concatenate([np.full(300, 7.25), np.full(200, -0.0), np.full(50, 0.0), -rng.lognormal(0, 1, 300)])
    blocks = [(crowded[i::3], rng.integers(1, 4, crowded[i::3].size)) for i in range(3)] + [
        (rng.normal(7.25, 1e-9, 400), None)
    ]
    expanded = np.sort(np.concatenate([np.repeat(v, 1 if k is None else k) for v, k in blocks]))
    ranks = np.arange(expanded.size)
    got = selection.order_statistics(blocks.copy, ranks)
    assert np.array_equal(got, expanded)  # (-0.0 and 0.0 are equal: a sort puts them in any order)


def test_a_report_run_again_leaves_the_annotated_file_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pq.write_table(varied_table(300).replace_schema_metadata(file_metadata()), tmp_path / PARQUET_NAME)
    (tmp_path / "run.json").write_bytes(orjson.dumps({"run_id": "r", "settings": {"warmup_s": 1.0}}))
    annotate_run(tmp_path)
    first = (tmp_path / PARQUET_NAME).read_bytes()
    written: list[Path] = []
    monkeypatch.setattr("loadgen.analysis.annotate.annotate", lambda run, *a, **kw: written.append(run))
    monkeypatch.setattr(forked, "_FORK", False)  # the rewrite in a thread: its calls are seen here
    annotate_run(tmp_path)
    assert written == [] and (tmp_path / PARQUET_NAME).read_bytes() == first  # the same annotation: not rewritten
    annotate_run(tmp_path, choose_window(read_records(tmp_path), warmup_s=2.0))
    assert written == [tmp_path]  # another window: another annotation


def test_the_series_counts_are_the_same_merged_every_few_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    t = varied_table(1500)
    shuffled = t.take(np.random.default_rng(4).permutation(t.num_rows))  # rows out of time order
    want = [timeseries(t), timeseries(t, 0.5), timeseries(shuffled)]
    monkeypatch.setattr(interval_counts, "_MERGE_PAIRS", 64)  # merged after nearly every block
    monkeypatch.setattr(timeseries_module, "_SERIES_BLOCK", 500)
    again = [pa.Table.from_batches(x.to_batches()) for x in (t, t, shuffled)]  # new tables: not memoised
    assert [timeseries(again[0]), timeseries(again[1], 0.5), timeseries(again[2])] == want
    assert want[0] == want[2] and len(want[0]) > 10
    monkeypatch.setattr(interval_counts, "_DENSE_CELLS", 0)  # closing intervals counted by sorting, not densely
    again = [pa.Table.from_batches(x.to_batches()) for x in (t, t, shuffled)]
    assert [timeseries(again[0]), timeseries(again[1], 0.5), timeseries(again[2])] == want


def test_a_file_of_pyarrows_default_layout_reads_as_one_of_ours(tmp_path: Path) -> None:
    t = varied_table(500).replace_schema_metadata(file_metadata())
    old, new = tmp_path / "old", tmp_path / "new"
    for d in (old, new):
        d.mkdir()
    pq.write_table(t.drop_columns(["stage", "inputs"]), old / PARQUET_NAME, row_group_size=200)  # before: defaults
    with parquet_writer(new / PARQUET_NAME, t.schema) as w:
        w.write_table(t, row_group_size=ROW_GROUP_ROWS)
    got_old, got_new = read_records(old), read_records(new)
    assert got_new.equals(t.select(SCHEMA.names).replace_schema_metadata(None))
    assert got_old.drop_columns(["stage", "inputs"]).equals(got_new.drop_columns(["stage", "inputs"]))
    assert got_old.column("stage").null_count == got_old.num_rows  # a column the file lacks reads as null
    assert (new / PARQUET_NAME).stat().st_size < (old / PARQUET_NAME).stat().st_size


@pytest.mark.parametrize("cells", [interval_counts._DENSE_CELLS, 0], ids=["dense table", "pairs"])
def test_an_intervals_itl_percentiles_are_taken_once_it_is_complete_as_its_histogram_gives(
    monkeypatch: pytest.MonkeyPatch, cells: int
) -> None:
    monkeypatch.setattr(interval_counts, "_DENSE_CELLS", cells)  # 0: every open interval held as pairs
    monkeypatch.setattr(timeseries_module, "_SERIES_BLOCK", 300)
    t = varied_table(800)
    late = t.num_rows // 3  # one early row's chunks arrive long after the later rows': its intervals stay open
    ns: list[list[int]] = [v or [] for v in t.column("chunk_ns").to_pylist()]
    ns[late] = [v + 5 * 10**9 for v in ns[late]]
    t = t.set_column(t.column_names.index("chunk_ns"), "chunk_ns", pa.array(ns, t.schema.field("chunk_ns").type))
    handed: list[int] = []
    table_percentiles, feed = interval_counts._table_percentiles, interval_counts.IntervalPercentiles.feed

    def from_table(at: Any, b0: int, c0: int, table: Any) -> None:
        handed.append(table.shape[0])
        table_percentiles(at, b0, c0, table)

    def fed(self: interval_counts.IntervalPercentiles, keys: Any, totals: Any) -> None:
        handed.append(keys.size)
        feed(self, keys, totals)

    monkeypatch.setattr(interval_counts, "_table_percentiles", from_table)
    monkeypatch.setattr(interval_counts.IntervalPercentiles, "feed", fed)
    rows = timeseries(t)
    assert len(handed) > 3  # taken interval by interval as the walk went, not all at the end
    for row, h in zip(rows, timeseries_module.iter_interval_histograms(t), strict=True):
        for p in (50, 99):
            want = hist_percentile(h.itl, p) / 1000 if h.itl.get_total_count() else None
            assert row[f"itl_p{p}_ms"] == want
