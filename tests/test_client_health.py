"""The client's own health: a loop-lag probe late beyond the run's lag limit makes the run suspect
(``client_loop_lag``), and the reports show its figures (read-stamp lateness included)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hand_runs import make_run, make_sweep

from loadgen.analysis.client_health import health_line
from loadgen.analysis.points import analyze_run
from loadgen.analysis.run_summary import summarize_run
from loadgen.analysis.validity import SUSPECT_CODES, Validity, client_caveats
from loadgen.report.html_tables import points_section


@pytest.mark.parametrize(
    ("client", "limit", "suspect"),
    [
        ({"loop_lag_p99_ms": 8.0, "loop_lag_max_ms": 20.0}, 10.0, False),  # issue 15's 160 req/s run: 7.6 ms
        ({"loop_lag_p99_ms": 12.5, "loop_lag_max_ms": 20.0}, 10.0, True),
        ({"loop_lag_p99_ms": 12.5}, 50.0, False),  # a run given --lag-limit-ms 50 holds the probe to 50 too
        ({"loop_lag_p99_ms": 10.0}, 10.0, False),  # at the limit is within it
        ({"loop_lag_p99_ms": 30.0, "loop_lag_samples": 40}, 10.0, False),  # 40 samples: that "p99" is their max
        ({"loop_lag_p99_ms": 30.0, "loop_lag_samples": 400}, 10.0, True),
        ({"loop_lag_p99_ms": None, "loop_lag_max_ms": 3.0}, 10.0, False),  # no probe figure: nothing to say
        ({}, 10.0, False),  # a run from before the probe
    ],
)
def test_the_loop_lag_probe_is_held_to_the_runs_lag_limit(
    client: dict[str, object], limit: float, suspect: bool
) -> None:
    caveats = client_caveats(client, limit)
    assert ("client_loop_lag" in [c.code for c in caveats]) is suspect
    assert Validity.of(caveats).suspect is suspect


def test_the_message_names_the_figure_and_what_it_does_to_the_stamps() -> None:
    (c,) = client_caveats({"loop_lag_p99_ms": 14.2, "read_lateness_p99_ms": 8.1}, 10.0)
    assert c.code == "client_loop_lag" and "client_loop_lag" in SUSPECT_CODES
    assert c.message == (
        "the client's event loop ran late: loop lag p99 is 14.2 ms (limit 10 ms); reads were stamped an "
        "estimated 8.1 ms late at p99: chunk and first-token stamps may be late by about that much; result suspect"
    )


def test_a_single_run_uses_its_recorded_lag_limit(tmp_path: Path) -> None:
    """summarize_run reads --lag-limit-ms from run.json: the same limit client_lag uses."""
    lagging = {"client": {"loop_lag_p99_ms": 30.0, "loop_lag_max_ms": 40.0}}
    d = make_run(tmp_path / "r", [50.0] * 400, meta={**lagging, "settings": {"lag_limit_ms": 10.0}})
    report = summarize_run(d, write=False)
    assert report.validity.codes == ("client_loop_lag",)
    relaxed = make_run(tmp_path / "q", [50.0] * 400, meta={**lagging, "settings": {"lag_limit_ms": 50.0}})
    assert not summarize_run(relaxed, write=False).validity.suspect


def test_a_sweep_point_whose_probe_ran_late_is_suspect_and_left_out(tmp_path: Path) -> None:
    clients = [{"loop_lag_p99_ms": 2.0}, {"loop_lag_p99_ms": 25.0, "read_lateness_p99_ms": 9.0}]
    d = make_sweep(tmp_path / "s", [(10.0, [50.0] * 40, 0.0), (20.0, [60.0] * 40, 0.0)], clients=clients)
    a = analyze_run(d)
    assert [p.validity.withholding.codes for p in a.points] == [(), ("client_loop_lag",)]
    assert [p.index for p in a.trusted] == [0]
    html = points_section(a)
    table = html[html.index('id="points-client"') :]
    table = table[: table.index("</table>")]
    assert "event-loop lag p99 ms" in table and "read stamps late p99 ms (est.)" in table
    assert '<tr class="suspect"><td>1</td><td class="l">20 req/s</td><td>25</td><td>9</td></tr>' in table


def test_health_line_says_what_the_client_measured() -> None:
    client = {
        "cpu_utilisation": 0.31,
        "wall_seconds": 10.0,
        "loop_lag_p99_ms": 7.6,
        "loop_lag_max_ms": 20.0,
        "read_lateness_p99_ms": 8.0,
    }
    assert health_line(client) == (
        "client: CPU 31% of a core over 10.0 s, event-loop lag p99 7.6 ms (max 20.0 ms), "
        "reads stamped ~8.0 ms late at p99 (estimate)"
    )
    assert health_line({"loop_lag_max_ms": 3.0}) == "client: event-loop lag max 3.0 ms"
    assert health_line({}) is None and health_line({"loop_lag_p99_ms": "x"}) is None


def test_a_run_json_without_the_probe_reads_as_before(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r", [50.0] * 400, meta={"client": {"loop_lag_max_ms": 1.0}})
    assert not summarize_run(d, write=False).validity.suspect
    doc = orjson.loads((d / "run.json").read_bytes())
    assert "loop_lag_p99_ms" not in doc["client"]
