"""``loadgen compare RUN RUN ...``: a bake-off over run folders (terminal and compare.html)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen.cli.flags import finite_float
from loadgen.cli.sweep_cmd import resolve_slo

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from loadgen.analysis.compare import Comparison, Verdict


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare",
        help="bake-off: compare runs of the same traffic, winners only where intervals separate",
        description="Compare sweeps or runs of the same workload and seed against different "
        "endpoints: frontiers, capacity and goodput at SLO, cost, latency at matched load.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (from loadgen sweep or loadgen run)")
    p.add_argument("--name", action="append", default=None, help="a name per run, in order (default: folder names)")
    p.add_argument(
        "--slo",
        default=None,
        metavar="PROFILE",
        help="SLO to judge every run by (default: the first run's); profile or ttft=..,tpot=..,e2e=..",
    )
    p.add_argument(
        "--slo-target",
        type=finite_float(0, 100, above=True, unit=" %"),
        default=None,
        metavar="PCT",
        help="attainment target (default 99)",
    )
    p.add_argument("--out", default=None, metavar="DIR", help="folder for compare.html (default runs/compare-<time>)")
    p.set_defaults(func=main)


def _cell(v: tuple[float, float, float] | None) -> str:
    from loadgen.report.markup import fmt

    return "-" if v is None else f"{fmt(v[0])} [{fmt(v[1])}, {fmt(v[2])}]"


def verdict_table(c: Comparison, verdicts: list[Verdict], title: str) -> Table:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, show_edge=False)
    t.add_column("figure")
    for n in c.names:
        t.add_column(n, justify="right")
    t.add_column("winner")
    for v in verdicts:
        win = Text(v.winner, style="bold green") if v.winner else Text("no clear winner", style="dim")
        if v.withheld:
            win = Text("withheld (suspect)", style="yellow")
        t.add_row(f"{v.metric} ({v.unit})", *[_cell(v.values.get(n)) for n in c.names], win)
    return t


def print_comparison(c: Comparison, console: Console) -> None:
    from rich.text import Text

    for line in c.suspects:  # first: a verdict on suspect data is no verdict
        console.print(Text(line, style="bold red" if line.startswith(("SUSPECT", "INTERRUPTED")) else "bold yellow"))
    for m in c.mismatches:
        console.print(Text(f"WARNING: {m}", style="bold red"))
    for n in c.notes:
        console.print(Text(f"note: {n}", style="yellow"))
    head = [v for v in c.verdicts if v.group == "headline"]
    matched = [v for v in c.verdicts if v.group != "headline"]
    console.print(verdict_table(c, head, "bake-off (95% intervals; a winner only where they separate)"))
    if matched:
        console.print(verdict_table(c, matched, "at matched load"))


def main(args: argparse.Namespace) -> int:
    from loadgen.records import check_run_folder, make_folder

    for run in args.runs:
        check_run_folder(Path(run))  # before the analysis is imported
    from rich.console import Console

    from loadgen.analysis.compare import compare_runs
    from loadgen.report.compare import write_compare

    slo, slo_name, target = resolve_slo(args.slo)
    target = args.slo_target if args.slo_target is not None else target
    c = compare_runs(
        [Path(r) for r in args.runs], names=args.name, slo=slo, slo_name=slo_name or None, target_pct=target
    )
    out = make_folder(Path(args.out) if args.out else Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S"))
    path = write_compare(c, out)
    console = Console(width=None if sys.stdout.isatty() else 160)
    print_comparison(c, console)
    console.print(f"report: {path}")
    return 0
