"""How long a schedule takes to draw before a run starts (``loadgen.schedule.offsets_ns``).

A run draws its whole schedule up front, so the largest one a run may ask for
(``client.settings.MAX_REQUESTS``, ten million requests) is drawn while the user
waits. This times each arrival kind at one million and at that cap, by count and
by duration, best of ``--repeat`` (a figure, not a test: tests/test_schedule.py
pins what the arrays hold).

Run: ``python benchmarks/schedule.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from loadgen.client.settings import MAX_REQUESTS
from loadgen.schedule import Arrival, offsets_ns

ARRIVALS = (Arrival("constant", rate=1000.0), Arrival("poisson", rate=1000.0), Arrival("gamma", rate=1000.0, cv=2.0))


def best_of(repeat: int, arrival: Arrival, count: int | None, duration_s: float | None) -> tuple[float, int]:
    """(seconds, requests) of the fastest of ``repeat`` draws."""
    best, n = float("inf"), 0
    for _ in range(repeat):
        t = time.perf_counter()
        n = len(offsets_ns(arrival, 1, count=count, duration_s=duration_s))
        best = min(best, time.perf_counter() - t)
    return best, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'arrival':<32} {'bounded by':<24} {'requests':>11} {'seconds':>8} {'ns/request':>10}")
    for arrival in ARRIVALS:
        for label, count, duration_s in (
            ("count 1,000,000", 1_000_000, None),
            (f"count {MAX_REQUESTS:,}", MAX_REQUESTS, None),
            ("duration 10,000 s", None, 10_000.0),
        ):
            seconds, n = best_of(args.repeat, arrival, count, duration_s)
            print(f"{str(arrival):<32} {label:<24} {n:>11,} {seconds:>8.3f} {1e9 * seconds / n:>10.1f}")


if __name__ == "__main__":
    main()
