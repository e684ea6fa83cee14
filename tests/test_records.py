"""The records file: a writer that never takes the run down, readers that forgive a crash.

Every test writes and reads real Arrow/Parquet files in tmp_path.
"""

from __future__ import annotations

import errno
import json
import math
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen import record_fit
from loadgen.errors import ConfigError, SpecError
from loadgen.record_compact import compact
from loadgen.records import SCHEMA, STATUSES, Record, RecordWriter, read_records, read_stream
from loadgen.run_folder import PARQUET_NAME, json_bytes, write_json

UNSAFE = ("\x1b", "\x00", "\n", "\u202e", "\u200b", "\ud800")  # nothing of these may reach a short column


def rec(i: int, **kw: Any) -> Record:
    base = 1_000_000_000 + i * 1_000_000
    values: dict[str, Any] = {
        "run_id": "r1",
        "request": i,
        "session": i,
        "t_sched": base,
        "t_sent": base + 10,
        "t_first": base + 100,
        "t_last": base + 900,
        "t_done": base + 950,
        "chunk_ns": [base + 100, base + 900],
        "chunk_tokens": [1, 1],
        "output_tokens": 2,
        "output_tokens_reported": 2,
        "finish_reason": "stop",
    }
    return Record(**{**values, **kw})


def write(path: Path, records: list[Record], batch_size: int = 16) -> RecordWriter:
    with RecordWriter(path, batch_size=batch_size) as w:
        for r in records:
            w.add(r)
    return w


def rows(path: Path) -> list[dict[str, Any]]:
    return list(read_stream(path).to_pylist())


# --------------------------------------------------------------------------- schema


def test_the_schema_has_the_new_nullable_columns_and_status() -> None:
    assert "not_sent" in STATUSES
    assert SCHEMA.field("t_first_content").type == pa.int64()
    assert SCHEMA.field("reasoning_tokens").type == pa.int32()
    assert [f.name for f in fields(Record)] == SCHEMA.names
    r = Record()
    assert r.t_first_content is None and r.reasoning_tokens is None


def test_the_new_columns_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    write(path, [rec(0, t_first_content=1_000_000_500, reasoning_tokens=17), rec(1, status="not_sent", t_sent=None)])
    got = rows(path)
    assert (got[0]["t_first_content"], got[0]["reasoning_tokens"]) == (1_000_000_500, 17)
    assert (got[1]["status"], got[1]["t_sent"], got[1]["reasoning_tokens"]) == ("not_sent", None, None)


# --------------------------------------------------------------------------- bounded values


def test_an_impossible_token_count_loses_nothing(tmp_path: Path) -> None:
    """The issue's case: completion_tokens 3,000,000,000 used to fail the batch (38 of 100 on disk)."""
    path = tmp_path / "records.arrows"
    w = write(path, [rec(i, output_tokens_reported=3_000_000_000 if i == 40 else 2) for i in range(100)])
    got = rows(path)
    assert len(got) == 100 and w.written == 100 and w.degraded == 0 and w.bounded == 1
    bad = got[40]
    assert bad["status"] == "ok" and bad["output_tokens_reported"] is None
    assert "output_tokens_reported 3000000000 does not fit its column" in bad["error"]
    assert [r["output_tokens_reported"] for r in got[:40]] == [2] * 40


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (2**31 - 1, 2**31 - 1),
        (-(2**31), -(2**31)),
        (2**31, None),
        (-(2**31) - 1, None),
        (10**40, None),
        (7.0, 7),
        (7.5, None),
        (math.nan, None),
        (True, None),
        ("7", None),
        (np.int64(9), 9),
    ],
)
def test_an_int32_column_keeps_what_fits_and_nulls_the_rest(tmp_path: Path, value: object, written: object) -> None:
    path = tmp_path / "records.arrows"
    write(path, [rec(0, prompt_tokens_reported=value)])
    (got,) = rows(path)
    assert got["prompt_tokens_reported"] == written
    assert (got["error"] is None) == (written is not None)
    if written is None:
        assert got["error"].startswith("prompt_tokens_reported ")


def test_an_int64_column_out_of_range_is_null_and_named(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    write(path, [rec(0, t_first=2**63, error="HTTP 200 but odd")])
    (got,) = rows(path)
    assert got["t_first"] is None and got["t_sched"] == 1_000_000_000
    assert got["error"].startswith("HTTP 200 but odd; t_first 9223372036854775808 does not fit")


def test_a_list_with_an_element_that_does_not_fit_is_null(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    w = write(path, [rec(0), rec(1, chunk_tokens=[1, 2**31]), rec(2, chunk_ns=[1, 2**63]), rec(3)])
    got = rows(path)
    assert [r["chunk_tokens"] for r in got] == [[1, 1], None, [1, 1], [1, 1]]
    assert got[2]["chunk_ns"] is None and got[3]["chunk_ns"] == [1_003_000_100, 1_003_000_900]
    assert "chunk_tokens holds a value that does not fit" in got[1]["error"]
    assert w.written == 4 and w.degraded == 0


def test_short_strings_are_one_clean_capped_line(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    hostile = "st\x1b[31mop\u202e\n" + "x" * 5000
    write(path, [rec(0, finish_reason=hostile, model="m\x00\u200bodel", error="bad\r\nthing " * 400)])
    (got,) = rows(path)
    assert got["finish_reason"].startswith("stop x") and len(got["finish_reason"]) <= 300
    assert got["finish_reason"].endswith("…") and got["model"] == "model"
    assert len(got["error"]) <= 1000 and "\n" not in got["error"]
    for col in ("finish_reason", "model", "error"):
        assert not any(c in got[col] for c in UNSAFE)


def test_output_text_is_kept_whole_but_valid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    long = "word\n" * 50_000
    write(path, [rec(0, output_text=long), rec(1, output_text="a\ud800b\ud83d\ude00")])
    got = rows(path)
    assert got[0]["output_text"] == long and got[0]["error"] is None
    assert got[1]["output_text"] == "a\ufffdb\U0001f600"
    assert "output_text: invalid UTF-8" in got[1]["error"]


# --------------------------------------------------------------------------- never raises


def test_a_record_arrow_still_refuses_is_written_degraded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the list check out of the way, a bool in chunk_ns reaches Arrow, which refuses it."""
    monkeypatch.setattr(record_fit.RowFitter, "fit_lists", lambda self, row: row)
    path = tmp_path / "records.arrows"
    w = write(path, [rec(0), rec(1, chunk_ns=[1, True], status="timeout", turn=3), rec(2)])
    got = rows(path)
    assert [r["request"] for r in got] == [0, 1, 2] and w.written == 3 and w.degraded == 1
    bad = got[1]
    assert (bad["status"], bad["turn"], bad["t_sched"], bad["run_id"]) == ("timeout", 3, 1_001_000_000, "r1")
    assert bad["chunk_ns"] is None and bad["t_first"] is None and bad["output_tokens"] is None
    assert bad["error"].startswith("record could not be written in full: ")
    assert got[0]["chunk_ns"] == [1_000_000_100, 1_000_000_900]


class _Broken:
    """Not a Record at all: one attribute raises, another cannot even be printed."""

    def __init__(self) -> None:
        self.request = 5
        self.status = "ok"

    def __getattr__(self, name: str) -> object:
        if name == "model":
            raise RuntimeError("boom")
        return None


def test_add_takes_anything_and_writes_a_row_for_it(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    w = RecordWriter(path)
    w.add(_Broken())  # type: ignore[arg-type]  # the point: whatever the caller hands over
    assert w.close() == 0
    (got,) = rows(path)
    assert (got["request"], got["status"]) == (5, "ok")
    assert got["error"] == "record could not be written in full: RuntimeError: boom"
    assert w.degraded == 1


_INT_OR_NONE = st.one_of(st.none(), st.integers())
# any code point: controls, bidi, lone surrogates too (text() leaves surrogates out)
_ANY_CHAR = st.one_of(st.characters(), st.characters(categories=["Cs"]))
_ANY_TEXT = st.lists(_ANY_CHAR, max_size=400).map("".join)


def _field_strategy(annotation: str) -> st.SearchStrategy[Any]:
    return {
        "str": _ANY_TEXT,
        "str | None": st.one_of(st.none(), _ANY_TEXT),
        "int": st.integers(),
        "int | None": _INT_OR_NONE,
        "list[int]": st.lists(st.integers(), max_size=8),
    }[annotation]


_RECORDS = st.builds(Record, **{f.name: _field_strategy(str(f.type)) for f in fields(Record)})


# (drawing a record's thirty fields is most of this test's time: a few records, enough batches)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_RECORDS, min_size=1, max_size=7), batch=st.integers(1, 5))
def test_any_record_is_written_one_row_per_add(tmp_path: Path, records: list[Record], batch: int) -> None:
    path = tmp_path / "records.arrows"
    w = write(path, records, batch_size=batch)
    table = read_stream(path)
    assert table.num_rows == len(records) == w.written
    assert table.column("request").to_pylist() == [
        r.request if -(2**63) <= r.request < 2**63 else None for r in records
    ]
    for col in ("run_id", "endpoint", "model", "finish_reason", "status", "error"):
        for value in table.column(col).to_pylist():
            assert value is None or not any(c in value for c in UNSAFE)


# --------------------------------------------------------------------------- a full disk


class _FullDisk:
    """A file whose writes fail (half-written first, as a real ENOSPC can) while ``full`` is set."""

    def __init__(self, real: Any) -> None:
        self.real, self.full = real, False

    def write(self, data: memoryview) -> int:
        if self.full:
            self.real.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(self.real.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _full_disk_writer(path: Path) -> tuple[RecordWriter, _FullDisk]:
    w = RecordWriter(path, batch_size=4)
    disk = _FullDisk(w._file._file)
    w._file._file = disk  # type: ignore[assignment]  # the one seam: the file under the stream
    return w, disk


def test_a_full_disk_keeps_the_records_and_writes_them_when_space_returns(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    w, disk = _full_disk_writer(path)
    for i in range(4):
        w.add(rec(i))
    disk.full = True
    for i in range(4, 12):
        w.add(rec(i))  # two batches, both refused by the disk: neither raises
    w.flush()
    assert w.written == 4 and w.unwritten == 8 and w.write_failures >= 2
    assert "No space left on device" in (w.last_error or "")
    assert [r["request"] for r in rows(path)] == [0, 1, 2, 3]  # the half-written batch was cut off
    disk.full = False
    w.flush()
    assert w.written == 12 and w.unwritten == 0
    assert w.close() == 0
    assert [r["request"] for r in rows(path)] == list(range(12))


def test_close_on_a_disk_still_full_reports_what_was_not_written(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    w, disk = _full_disk_writer(path)
    for i in range(6):
        w.add(rec(i))
    disk.full = True
    w.add(rec(6))
    assert w.close() == 3  # records 4..6: the batch of 4 went out before the disk filled
    assert w.written == 4
    assert [r["request"] for r in rows(path)] == [0, 1, 2, 3]


# --------------------------------------------------------------------------- readers


def _stream_bytes(records: list[Record], tmp_path: Path, batch_size: int) -> bytes:
    path = tmp_path / "whole.arrows"
    write(path, records, batch_size=batch_size)
    data = path.read_bytes()
    path.unlink()
    return data


def test_a_torn_tail_reads_up_to_the_last_whole_batch(tmp_path: Path) -> None:
    data = _stream_bytes([rec(i) for i in range(10)], tmp_path, batch_size=4)
    torn = tmp_path / "records.arrows"
    torn.write_bytes(data[:-300])  # killed inside the last batch (the end marker and more gone)
    assert [r["request"] for r in rows(torn)] == list(range(8))


@pytest.mark.parametrize("cut", [0, 2, 6])
def test_a_stream_killed_as_it_started_is_empty(tmp_path: Path, cut: int) -> None:
    data = _stream_bytes([rec(0)], tmp_path, batch_size=4)
    path = tmp_path / "records.arrows"
    path.write_bytes(data[:cut])
    assert read_stream(path).num_rows == 0


def test_a_file_that_is_no_stream_is_one_line_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    path.write_bytes(b"PAR1 this is not an arrow stream at all")
    with pytest.raises(SpecError, match=r"records.arrows: unreadable records \(not an Arrow stream") as e:
        read_stream(path)
    assert "\n" not in str(e.value)


_OLD_SCHEMA = pa.schema([f for f in SCHEMA if f.name not in ("t_first_content", "reasoning_tokens")])


def _old_table() -> pa.Table:
    return pa.Table.from_pylist([{"run_id": "old", "request": 0, "status": "ok", "output_tokens": 3}], _OLD_SCHEMA)


def test_an_older_stream_reads_with_the_new_columns_null(tmp_path: Path) -> None:
    path = tmp_path / "records.arrows"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, _OLD_SCHEMA) as w:
        w.write_table(_old_table())
    table = read_stream(path)
    assert table.schema.equals(SCHEMA)
    assert table.to_pylist()[0]["output_tokens"] == 3
    assert table.column("t_first_content").to_pylist() == table.column("reasoning_tokens").to_pylist() == [None]


def test_an_older_parquet_reads_with_the_new_columns_null(tmp_path: Path) -> None:
    pq.write_table(_old_table(), tmp_path / PARQUET_NAME)
    table = read_records(tmp_path)
    assert table.schema.equals(SCHEMA)
    assert table.column("reasoning_tokens").to_pylist() == [None]


# --------------------------------------------------------------------------- compaction


def test_compact_after_a_crash_keeps_every_whole_batch(tmp_path: Path) -> None:
    data = _stream_bytes([rec(i) for i in range(10)], tmp_path, batch_size=4)
    (tmp_path / "records-w00.arrows").write_bytes(data[:-300])
    write(tmp_path / "records-w01.arrows", [rec(i, shard=1) for i in range(100, 103)])
    compact(tmp_path)
    assert not list(tmp_path.glob("*.arrows"))
    got = read_records(tmp_path).column("request").to_numpy()
    assert np.sort(got).tolist() == [*range(8), 100, 101, 102]


def test_compact_twice_keeps_the_records(tmp_path: Path) -> None:
    write(tmp_path / "records.arrows", [rec(i) for i in range(5)])
    compact(tmp_path)
    compact(tmp_path)  # used to overwrite records.parquet with an empty table
    assert read_records(tmp_path).num_rows == 5


def test_compact_cut_short_is_finished_without_duplicates(tmp_path: Path) -> None:
    """Killed after records.parquet was written, before every stream was removed."""
    write(tmp_path / "records-w00.arrows", [rec(i) for i in range(0, 6, 2)])
    write(tmp_path / "records-w01.arrows", [rec(i, shard=1) for i in range(1, 6, 2)])
    leftover = (tmp_path / "records-w01.arrows").read_bytes()
    compact(tmp_path)
    (tmp_path / "records-w01.arrows").write_bytes(leftover)
    write(tmp_path / "records-w02.arrows", [rec(9, shard=2)])  # and one the Parquet file lacks
    compact(tmp_path)
    assert np.sort(read_records(tmp_path).column("request").to_numpy()).tolist() == [0, 1, 2, 3, 4, 5, 9]
    assert not list(tmp_path.glob("*.arrows"))


def test_compact_refuses_a_bad_stream_in_one_line_and_keeps_it(tmp_path: Path) -> None:
    write(tmp_path / "records-w00.arrows", [rec(0)])
    (tmp_path / "records-w01.arrows").write_bytes(b"garbage, not arrow")
    with pytest.raises(SpecError, match="records-w01.arrows: unreadable records"):
        compact(tmp_path)
    assert (tmp_path / "records-w00.arrows").exists() and not (tmp_path / PARQUET_NAME).exists()


def test_compact_on_a_full_disk_is_a_config_error_and_keeps_the_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "records.arrows", [rec(0)])

    def full(*args: object, **kw: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)  # compact writes row group by row group
    with pytest.raises(
        ConfigError, match=r"cannot write \(No space left on device\); the records stay in records.arrows"
    ):
        compact(tmp_path)
    assert read_stream(tmp_path / "records.arrows").num_rows == 1


# --------------------------------------------------------------------------- JSON


def _strict(data: bytes) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(data, parse_constant=refuse)


def test_json_never_holds_nan_or_infinity(tmp_path: Path) -> None:
    data = {
        "p99": math.inf,
        "p50": -math.inf,
        "mean": math.nan,
        "np": np.float64("nan"),
        "arr": np.array([1.0, np.inf]),
    }
    assert _strict(json_bytes(data)) == {"p99": None, "p50": None, "mean": None, "np": None, "arr": [1.0, None]}
    write_json(tmp_path / "summary.json", data)
    assert _strict((tmp_path / "summary.json").read_bytes())["p99"] is None
    assert not list(tmp_path.glob("*.tmp"))


def test_write_json_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_json(path, {"state": "running"})
    write_json(path, {"state": "complete"})
    assert _strict(path.read_bytes()) == {"state": "complete"}
    assert sorted(os.listdir(tmp_path)) == ["run.json"]
