"""How fast the simulator runs in virtual time: a sweep of closed-loop points up to 1,000 streams.

    python benchmarks/sim_virtual.py                      # 20 points x 10 minutes (the issue's target: < 60 s)
    python benchmarks/sim_virtual.py --points 2 --minutes 1

Points are closed-loop concurrencies spread evenly up to ``--streams`` (1000), each ``--minutes``
of virtual traffic of 512-token prompts and 256-token answers into the roofline engine (H100,
Llama-3.1-8B FP8, max_num_seqs 1024, so every stream is in the batch). Prints per point the
virtual seconds, requests, tokens, wall and CPU seconds and tokens per wall second, then the
sweep's total, and ``/proc/loadavg`` (other processes on the machine slow it: say which figures
were taken under load; CPU seconds move less with load than wall seconds do). One core: nothing
here is parallel.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from loadgen.schedule import Arrival
from loadgen.sim.roofline import RooflineModel
from loadgen.sim.virtual import simulate_point
from loadgen.workload.base import SyntheticChat


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--points", type=int, default=20)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--streams", type=int, default=1000)
    a = p.parse_args()
    load = Path("/proc/loadavg")
    print("loadavg before:", load.read_text().strip() if load.exists() else "n/a")
    total_wall = total_tok = total_cpu = 0.0
    for k in range(1, a.points + 1):
        users = max(1, round(a.streams * k / a.points))
        eng = RooflineModel("h100", "llama-3.1-8b", weight_dtype="fp8", kv_dtype="fp8", max_num_seqs=1024)
        t0, c0 = time.perf_counter(), _cpu_s()
        vr = simulate_point(
            SyntheticChat(512, 256, seed=k),
            Arrival("closed", concurrency=users),
            eng,
            run_id="bench",
            seed=k,
            duration_s=a.minutes * 60,
            point=k,
            drain_s=0.0,
        )
        wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
        tok = float(vr.stats["generation_tokens_total"])
        total_wall += wall
        total_cpu += cpu
        total_tok += tok
        print(
            f"point {k:2d}: {users:5d} streams, {(vr.end_ns - 1e9) / 1e9:7.1f} virtual s, "
            f"{vr.records.num_rows:7d} requests, {tok / 1e6:6.2f}M tokens, {wall:6.2f} wall s, {cpu:6.2f} CPU s, "
            f"{tok / wall / 1e3:6.0f}k tok/s"
        )
    print(
        f"sweep: {a.points} points x {a.minutes:g} min: {total_wall:.1f} wall s, {total_cpu:.1f} CPU s, "
        f"{total_tok / 1e6:.1f}M tokens"
    )
    print("loadavg after:", load.read_text().strip() if load.exists() else "n/a")


def _cpu_s() -> float:
    """This process's CPU seconds (user + system) so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


if __name__ == "__main__":
    main()
