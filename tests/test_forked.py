"""Work beside the report (``analysis.forked``): its answer, or its exception, comes back to the parent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadgen.analysis.forked import Beside, start_beside
from loadgen.errors import ConfigError


def test_the_answer_comes_back_and_the_work_ran_elsewhere(tmp_path: Path) -> None:
    def work() -> tuple[int, list[int]]:
        (tmp_path / "written").write_text("by the child")
        return os.getpid(), [1, 2, 3]

    pid, answer = start_beside(work).result()
    assert answer == [1, 2, 3]
    assert pid != os.getpid() or not hasattr(os, "fork")  # (a thread where there is no fork)
    assert (tmp_path / "written").read_text() == "by the child"  # its files are the parent's to see


def test_its_exception_is_raised_by_result_and_returned_by_exception() -> None:
    def work() -> None:
        raise ConfigError("records.parquet: cannot annotate (no space)")

    beside = start_beside(work)
    assert isinstance(beside.exception(), ConfigError)
    with pytest.raises(ConfigError, match="cannot annotate"):
        beside.result()


def test_an_answer_that_does_not_pickle_is_an_error_said_in_words() -> None:
    with pytest.raises(RuntimeError, match="lambda"):
        start_beside(lambda: lambda: 1).result()


def test_work_already_done_is_its_answer() -> None:
    assert Beside.done(7).result() == 7
    assert Beside.done(None).exception() is None


def test_the_time_series_computed_beside_is_the_one_computed_here() -> None:
    from report_scale_run import varied_table

    from loadgen.analysis.timeseries import start_timeseries, timeseries

    here = timeseries(varied_table())
    table = varied_table()  # (a table of its own: Cols.of keeps what was computed per table)
    start_timeseries(table)
    assert timeseries(table) == here and here


def test_rows_started_beside_and_dropped_leave_no_child_behind() -> None:
    from report_scale_run import varied_table

    from loadgen.analysis.columns import Cols
    from loadgen.analysis.timeseries import drop_timeseries, start_timeseries

    table = varied_table()
    start_timeseries(table)
    [pending] = [v for v in Cols.of(table).memo.values() if isinstance(v, Beside)]
    drop_timeseries(table)
    assert not any(isinstance(v, Beside) for v in Cols.of(table).memo.values())
    if pending.pid is not None:  # reaped: no such child any more
        with pytest.raises(ChildProcessError):
            os.waitpid(pending.pid, os.WNOHANG)
