"""A record the writer refuses, in a real run: the request still ends as one record on disk, in its
degraded form; run.json counts it, and the run's first lines say its figures are suspect."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.cli.main import main
from loadgen.records import Record, RecordWriter, read_records


def test_a_record_the_writer_refuses_is_kept_degraded_counted_and_said_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add = RecordWriter.add

    def refusing(self: RecordWriter, record: Record) -> None:
        if record.request == 3:
            raise MemoryError("no room for request 3")
        add(self, record)

    monkeypatch.setattr(RecordWriter, "add", refusing)
    out = tmp_path / "run"
    args = ["run", "--sim-ttft-ms", "5", "--sim-itl-ms", "2", "--requests", "8", "--rate", "40"]
    args += ["--input-tokens", "8", "--output-tokens", "4", "--out", str(out), "--no-live", "--no-report"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    t = read_records(out).to_pydict()
    assert sorted(t["request"]) == list(range(8))  # every scheduled request, once
    three = t["request"].index(3)
    assert t["status"][three] == "ok" and t["t_first"][three] is None  # its timings are what was lost
    assert t["error"][three] == "record could not be written in full: MemoryError: no room for request 3"
    client = orjson.loads((out / "run.json").read_bytes())["client"]
    assert client["records_degraded"] == 1 and client["writer_errors"] == 1
    assert "writer_degraded" in printed.splitlines()[0], printed.splitlines()[:2]
    assert "writer_degraded" in orjson.loads((out / "summary.json").read_bytes())["validity"]["codes"]
