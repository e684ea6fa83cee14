"""``--sim-virtual`` on ``loadgen run`` and ``loadgen sweep``: the simulator in virtual time.

With it no server starts and no client runs: the workload and the schedule feed the simulated
engine directly (``sim.virtual``), configured by the same ``--sim-*`` options as the real-time
simulator, and the run folder is an ordinary one whose run.json and report say first that it is
virtual. Wiring only: the run is ``client.virtual_run``, the sweep ``sweep.virtual``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen.errors import ConfigError

if TYPE_CHECKING:
    from loadgen.analysis.metrics import SLO
    from loadgen.client.settings import RunSettings
    from loadgen.sim.answer import SimConfig
    from loadgen.sim.roofline import RooflineModel
    from loadgen.sweep.run import SweepSettings
    from loadgen.workload.base import Workload
    from loadgen.workload.salt import Salt

__all__ = ["add_virtual_option", "virtual_engine", "run_virtual", "sweep_virtual", "VIRTUAL_BANNER"]

VIRTUAL_BANNER = "VIRTUAL TIME: no server, no client; the simulated engine stepped on a virtual clock (sim-virtual)"


def add_virtual_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sim-virtual",
        action="store_true",
        help="run the built-in simulator in virtual time: no server, no client, no real clock; minutes of "
        "traffic in seconds, records as a perfect client would stamp them (default: off)",
    )


def virtual_engine(args: argparse.Namespace) -> tuple[RooflineModel, SimConfig]:
    """A fresh roofline engine and the answers' configuration from the ``--sim-*`` options."""
    from loadgen.cli.sim_cmd import sim_config
    from loadgen.sim.roofline import RooflineModel

    if getattr(args, "endpoint", None):
        raise ConfigError("--sim-virtual runs the built-in simulator: drop --endpoint")
    model, cfg = sim_config(args)
    if not isinstance(model, RooflineModel):
        raise ConfigError("--sim-virtual steps the roofline engine: drop --sim-ttft-ms / --sim-itl-ms")
    if cfg.truth_path:
        raise ConfigError("--sim-virtual: the ground truth is the records themselves; drop --sim-truth")
    return model, cfg


def run_virtual(
    args: argparse.Namespace, settings: RunSettings, workload: Workload, salt: Salt, slo: SLO | None
) -> int:
    """``loadgen run --sim-virtual``: the run, its report, and the gate after it."""
    from loadgen.analysis.run_summary import summarize_run
    from loadgen.cli.gate_cmd import gate_after_run
    from loadgen.cli.sim_cmd import sim_args
    from loadgen.client.run import new_run_id
    from loadgen.client.virtual_run import execute_virtual
    from loadgen.report.html import write_report
    from loadgen.report.terminal import print_run

    engine, cfg = virtual_engine(args)
    out = Path(args.out) if args.out else Path("runs") / new_run_id()
    execute_virtual(
        settings, workload, out, engine=engine, sim=cfg, sim_flags=sim_args(args), force=args.force, salt=salt
    )
    print_run(summarize_run(out, lag_limit_ms=settings.lag_limit_ms, slo=slo))
    if getattr(args, "report", True):
        print(f"report: {write_report(out)}")
    print(VIRTUAL_BANNER)
    return gate_after_run(out, args)


def sweep_virtual(
    args: argparse.Namespace, settings: SweepSettings, make_workload: Callable[[str], Workload], out: Path
) -> int:
    """``loadgen sweep --sim-virtual``: every point in virtual time, the sweep's report, the gate."""
    import sys

    from rich.console import Console

    from loadgen.cli.gate_cmd import gate_after_run
    from loadgen.cli.sim_cmd import sim_args
    from loadgen.report.sweep_view import render_sweep
    from loadgen.sweep.virtual import run_sweep_virtual

    virtual_engine(args)  # bad options, before anything runs
    console = Console(stderr=True)
    console.print(f"{VIRTUAL_BANNER}; {settings.plan.describe()}", style="bold", highlight=False)
    result = run_sweep_virtual(
        settings,
        make_workload,
        out,
        engine=lambda: virtual_engine(args),
        sim_flags=sim_args(args),
        force=args.force,
    )
    if not result.points:
        raise ConfigError("the sweep's plan has no point")
    render_sweep(out, html=getattr(args, "report", True)).print(Console(width=None if sys.stdout.isatty() else 160))
    console.print(VIRTUAL_BANNER, style="bold", highlight=False)
    return gate_after_run(out, args)
