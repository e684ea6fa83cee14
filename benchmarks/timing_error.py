"""loadgen's own timing error against the simulator's ground truth, at light and heavier load.

    python benchmarks/timing_error.py [--rates 4,40] [--seconds 6]

Prints, per offered rate, p50/p99 of: TTFT error (first chunk seen - first token
written by the server), per-token error, and |ITL error|. Target (issue
"Built-in simulated engine"): within 1 ms at p99 at light load.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from loadgen.client.run import execute
from loadgen.client.settings import RunSettings
from loadgen.records import read_records
from loadgen.schedule import Arrival
from loadgen.sim.truth import timing_error
from loadgen.workload.base import SyntheticChat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="4,40")
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    for rate in (float(r) for r in args.rates.split(",")):
        with tempfile.TemporaryDirectory() as d:
            truth = Path(d) / "truth.jsonl"
            settings = RunSettings(
                endpoint=None, model=None, arrival=Arrival("poisson", rate=rate), duration_s=args.seconds
            )
            execute(
                settings,
                SyntheticChat(input_tokens=256, output_tokens=64),
                Path(d) / "run",
                sim_flags=["--truth", str(truth)],
            )
            err = timing_error(read_records(Path(d) / "run"), truth)
        p = err.percentiles()
        print(
            f"{rate:6g} req/s ({err.matched} requests): TTFT error p50 {p['ttft'][0]:.3f} p99 {p['ttft'][1]:.3f} ms; "
            f"token p50 {p['token'][0]:.3f} p99 {p['token'][1]:.3f} ms; |ITL error| p50 {p['itl'][0]:.3f} "
            f"p99 {p['itl'][1]:.3f} ms"
        )


if __name__ == "__main__":
    main()
