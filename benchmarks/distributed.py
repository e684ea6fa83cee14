"""Streams a distributed run holds on schedule, against one process and ``--workers 2``; the master's ingest.

    .venv/bin/python benchmarks/distributed.py [--streams 100,200,400] [--duration 4]

Against the built-in simulator with a fixed model (TTFT 50 ms, 20 ms between tokens, 100
tokens an answer: about 2 s a stream), each configuration sends open-loop points of rising
concurrent streams (rate = streams / E2E): a single ``loadgen run``, ``--workers 2``, and a
master with 2 ``loadgen worker`` processes on this machine. A configuration *holds* a level
when the run's schedule lag p99 is at most 5 ms. The master's ingest is what its control
process spent taking the records in (run.json ``client.distributed.ingest``): records and
chunks per second of its own time, the ceiling of one master. Prints one line per point and
a summary; a figure is worth as much as the load the box was under (printed with it).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadgen.analysis.run_summary import summarize_run  # noqa: E402
from loadgen.sim.process import start_sim  # noqa: E402

LOADGEN = [sys.executable, "-m", "loadgen"]
TTFT_MS, ITL_MS, TOKENS = 50.0, 20.0, 100
E2E_S = (TTFT_MS + ITL_MS * (TOKENS - 1)) / 1e3
LAG_LIMIT_MS = 5.0
_PORT = re.compile(r"127\.0\.0\.1:(\d+)")


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def run_args(url: str, out: Path, streams: int, duration: float) -> list[str]:
    rate = streams / E2E_S
    return [
        *LOADGEN,
        "run",
        "--endpoint",
        url,
        "--rate",
        f"{rate:.3f}",
        "--arrival",
        "constant",
        "--duration",
        str(duration),
        "--input-tokens",
        "32",
        "--output-tokens",
        str(TOKENS),
        "--seed",
        "1",
        "--no-live",
        "--no-report",
        "--out",
        str(out),
        "--force",
    ]


def distributed(args: list[str], workers: int) -> None:
    master = subprocess.Popen(
        [*args, "--master", "--master-bind-port", "0", "--expect-workers", str(workers)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert master.stderr is not None
    port = None
    while port is None:
        line = master.stderr.readline()
        assert line, "the master ended before it said where it listens"
        port = _PORT.search(line)
    procs = [
        subprocess.Popen(
            [*LOADGEN, "worker", "--master-host", "127.0.0.1", "--master-port", port.group(1)],
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    master.stderr.read()
    master.wait()
    for p in procs:
        p.wait(30)


def point(kind: str, url: str, out: Path, streams: int, duration: float) -> dict[str, Any]:
    args = run_args(url, out, streams, duration)
    t0 = time.monotonic()
    if kind == "master+2":
        distributed(args, 2)
    else:
        subprocess.run(args + (["--workers", "2"] if kind == "workers=2" else []), capture_output=True, check=False)
    wall = time.monotonic() - t0
    report = summarize_run(out, write=False)
    lag = report.summary.schedule_lag.pct(99)[0]
    client = orjson.loads((out / "run.json").read_bytes())["client"]
    return {
        "lag_p99_ms": lag,
        "ok": report.summary.ok,
        "requests": report.summary.requests,
        "wall_s": wall,
        "ingest": (client.get("distributed") or {}).get("ingest"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="100,200,400")
    ap.add_argument("--duration", type=float, default=4.0)
    a = ap.parse_args()
    levels = [int(x) for x in a.streams.split(",")]
    held: dict[str, int] = {}
    ingest: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, start_sim(["--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)]) as sim:
        for kind in ("single", "workers=2", "master+2"):
            for streams in levels:
                r = point(kind, sim.url, Path(tmp) / f"{kind}-{streams}", streams, a.duration)
                ok = r["lag_p99_ms"] <= LAG_LIMIT_MS
                verdict = "held" if ok else "NOT held"
                print(
                    f"{kind:10s} streams={streams:5d} lag p99={r['lag_p99_ms']:7.2f} ms ok={r['ok']}/{r['requests']} "
                    f"{verdict} (wall {r['wall_s']:.1f} s; loadavg {loadavg()})",
                    flush=True,
                )
                if ok:
                    held[kind] = max(held.get(kind, 0), streams)
                if r["ingest"]:
                    ingest.append(r["ingest"])
    print(f"held at lag p99 <= {LAG_LIMIT_MS:g} ms (of {levels}): {held}")
    for i in ingest:
        s = max(i["seconds"], 1e-9)
        print(
            f"master ingest: {i['records']} records in {i['chunks']} chunks, {i['bytes'] / 1e6:.1f} MB, "
            f"{i['seconds'] * 1e3:.1f} ms of its time: "
            f"{i['records'] / s:,.0f} records/s, {i['chunks'] / s:,.0f} chunks/s"
        )


if __name__ == "__main__":
    main()
