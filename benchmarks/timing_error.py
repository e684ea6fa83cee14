"""loadgen's own timing and token-count error against the simulator's ground truth, per stream shape and rate.

    python benchmarks/timing_error.py [--rates 4,40] [--seconds 6] [--scenarios plain,tool-call,...]
                                      [--sim-tree DIR]

Per scenario and offered rate (Poisson, 256-token prompts, 64 tokens out, the default roofline
simulator), p50/p99 of: TTFT error (the record's first output chunk minus the first token the
server wrote), per-chunk arrival error (each output chunk, in order, minus the instant the server
wrote it), and |token-count error| (per chunk: the record's chunk_tokens minus the tokens the
server put in that chunk), with the share of chunks whose count is wrong and the requests whose
record has another number of output chunks than the server wrote.

Scenarios: ``plain`` (a token a chunk), ``tool-call`` (every answer a tool call, vLLM's shape;
``-sglang`` and ``-llamacpp`` in theirs; ``tool-call-2-4-usage`` with 2-4 tokens a fragment and
continuous usage),
``multi-3`` (3 tokens a chunk), and 2-4 tokens a chunk drawn per chunk (what speculative decoding
sends) counted three ways: ``multi-2-4`` (final usage spread over the chunks),
``multi-2-4-usage`` (the client asks for continuous usage) and ``multi-2-4-tokenizer`` (the client
counts each chunk's text with the built-in tokenizer, the simulator's own).

The simulator runs in its own process from ``--sim-tree`` (default: this checkout), so the client
can be another checkout's. Before/after: run this file with the old client on the path and the
new simulator, e.g. ``cd /tmp/before && PYTHONPATH=/tmp/before python /work/main/benchmarks/
timing_error.py --sim-tree /work/main``; a scenario the client cannot ask for is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from loadgen.client.run import execute
from loadgen.client.settings import RunSettings
from loadgen.records import read_records
from loadgen.schedule import Arrival
from loadgen.workload.base import SyntheticChat

HERE = Path(__file__).resolve().parents[1]
READY = "LOADGEN_SIM_READY "
# scenario: (simulator flags, client settings it needs: RunSettings field -> value)
SCENARIOS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "plain": ([], {"per_chunk_usage": "off"}),
    "tool-call": (["--tool-calls", "1", "--tool-call-shape", "vllm"], {"per_chunk_usage": "off"}),
    "tool-call-sglang": (["--tool-calls", "1", "--tool-call-shape", "sglang"], {"per_chunk_usage": "off"}),
    "tool-call-llamacpp": (["--tool-calls", "1", "--tool-call-shape", "llamacpp"], {"per_chunk_usage": "off"}),
    "tool-call-2-4-usage": (["--tool-calls", "1", "--tokens-per-chunk", "2-4"], {"per_chunk_usage": "on"}),
    "multi-3": (["--tokens-per-chunk", "3"], {"per_chunk_usage": "off"}),
    "multi-2-4": (["--tokens-per-chunk", "2-4"], {"per_chunk_usage": "off"}),
    "multi-2-4-usage": (["--tokens-per-chunk", "2-4"], {"per_chunk_usage": "on"}),
    "multi-2-4-tokenizer": (["--tokens-per-chunk", "2-4"], {"per_chunk_usage": "off", "tokenizer": "builtin"}),
}
# Settings a client without the field runs as it is told to anyway (an old client never asks
# for per-chunk usage, so "off" is what it does); any other missing field skips the scenario.
_DEFAULT_BEHAVIOUR = {("per_chunk_usage", "off")}


def _truth_module(tree: Path) -> ModuleType:
    """The simulator tree's own ``loadgen/sim/truth.py`` (it reads that tree's truth files), loaded by
    path: the ``loadgen`` imported here may be another checkout's."""
    spec = importlib.util.spec_from_file_location("_sim_truth", tree / "loadgen" / "sim" / "truth.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _settings(rate: float, seconds: float, url: str, wanted: dict[str, Any]) -> RunSettings | None:
    """The run's settings, or None when this client cannot be told what the scenario needs."""
    fields = {f.name for f in dataclasses.fields(RunSettings)}
    extra = {}
    for name, value in wanted.items():
        if name in fields:
            extra[name] = value
        elif (name, value) not in _DEFAULT_BEHAVIOUR:
            return None
    return RunSettings(endpoint=url, model=None, arrival=Arrival("poisson", rate=rate), duration_s=seconds, **extra)


class Sim:
    """``loadgen sim`` from ``tree``, in its own process and session, on a free loopback port."""

    def __init__(self, tree: Path, flags: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "loadgen", "sim", *flags, "--host", "127.0.0.1", "--port", "0", "--announce"]
        self.errlog = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=self.errlog, text=True, start_new_session=True
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith(READY):
            self.proc.kill()
            raise SystemExit(f"the simulator did not start: {line!r}")
        self.url = line[len(READY) :].strip()

    def stop(self) -> str:
        """Stop it; what it said on stderr (that it fell behind its model, say), on one line."""
        self.proc.terminate()
        self.proc.wait(10)
        self.errlog.seek(0)
        said = " ".join(self.errlog.read().split())
        self.errlog.close()
        return said.removeprefix("loadgen sim: ")


def run_one(tree: Path, scenario: str, rate: float, seconds: float) -> str:
    flags, wanted = SCENARIOS[scenario]
    with tempfile.TemporaryDirectory() as d:
        truth = Path(d) / "truth.jsonl"
        sim = Sim(tree, ["--truth", str(truth), *flags])
        try:
            settings = _settings(rate, seconds, sim.url, wanted)
            if settings is None:
                return f"{scenario:20s} {rate:5g} req/s: skipped (this client cannot be told {wanted})"
            execute(settings, SyntheticChat(input_tokens=256, output_tokens=64), Path(d) / "run")
        finally:
            said = sim.stop()
        err = _truth_module(tree).timing_error(read_records(Path(d) / "run"), truth)
    p = err.percentiles()
    wrong = err.wrong_counts()
    return (
        f"{scenario:20s} {rate:5g} req/s ({err.matched + err.mismatched:4d} req): "
        f"TTFT err p50 {p['ttft'][0]:7.3f} p99 {p['ttft'][1]:7.3f} ms | "
        f"chunk err p50 {p['chunk'][0]:7.3f} p99 {p['chunk'][1]:7.3f} ms | "
        f"|count err| p50 {p['count'][0]:.0f} p99 {p['count'][1]:.0f} tok, {wrong:6.1%} of chunks wrong | "
        f"{err.chunks_mismatched} req with other chunk counts" + (f" [sim: {said}]" if said else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rates", default="4,40")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--sim-tree", type=Path, default=HERE, help="checkout whose simulator to run (default: this one)")
    args = ap.parse_args()
    names = args.scenarios.split(",")
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}: choose from {', '.join(SCENARIOS)}")
    print(f"client: {Path(sys.modules['loadgen'].__file__ or '').parent.parent}  simulator: {args.sim_tree}")
    for name in names:
        for rate in (float(r) for r in args.rates.split(",")):
            print(run_one(args.sim_tree.resolve(), name, rate, args.seconds), flush=True)


if __name__ == "__main__":
    main()
