"""loadgen measured against the simulator's ground truth: how far off are its timestamps?"""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from loadgen.client.run import execute
from loadgen.client.settings import RunSettings
from loadgen.records import read_records
from loadgen.schedule import Arrival
from loadgen.sim.truth import timing_error
from loadgen.workload.base import SyntheticChat


@pytest.mark.timing
def test_client_timestamps_follow_the_servers_writes_at_light_load(tmp_path):
    """Real time: each chunk is stamped by the client as it arrives, after the server wrote it.

    How long after is how busy the client's core is: a few hundred microseconds on a quiet machine
    (benchmarks/timing_error.py has the figures), milliseconds on a loaded one, where the client waits
    for its core. A stamp that belonged to another token (the next one, the end of the answer) would
    be off by a whole inter-token gap or more, so the bounds are in gaps: half of one for the typical
    token, one for the first (fewer samples): bounds a loaded 2-core box meets."""
    truth = tmp_path / "truth.jsonl"
    settings = RunSettings(endpoint=None, model=None, arrival=Arrival("constant", rate=4), duration_s=4)
    execute(
        settings,
        SyntheticChat(input_tokens=64, output_tokens=32, seed=1),
        tmp_path / "run",
        sim_flags=["--truth", str(truth), "--ttft-ms", "20", "--itl-ms", "20"],  # gaps of 20 ms
    )
    records = read_records(tmp_path / "run")
    err = timing_error(records, truth)
    assert err.matched == records.num_rows and err.mismatched == 0  # every token seen, none invented
    assert (err.token >= 0).all()  # never seen before it was written: one clock, no mix-ups
    written = [orjson.loads(line)["written_ns"] for line in truth.read_bytes().splitlines()]
    gap_ms = float(np.median(np.concatenate([np.diff(w) for w in written]))) / 1e6  # the simulator's ITL
    assert gap_ms >= 19  # wide gaps: one token's stamp is far from the next one's, even on a loaded box
    assert np.median(err.token) < gap_ms / 2 and np.median(np.abs(err.itl)) < gap_ms / 2
    assert np.median(err.first_token) < gap_ms
