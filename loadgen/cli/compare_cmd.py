"""``loadgen compare RUN RUN ...``: a bake-off over run folders (terminal, compare.html, .json, .md).

The terminal's first lines say what withholds a verdict (interrupted and suspect runs) and
whether the runs sent the same traffic; then the verdict tables. The files go to ``--out``
(compare.html, compare.json, compare.md), or JSON and Markdown where ``--json`` and
``--markdown`` say. ``--out`` may be any writable folder, a run folder too: compare writes
only its own files there.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen.cli.command_secrets import secrets_of
from loadgen.cli.flags import finite_float
from loadgen.cli.sweep_cmd import resolve_slo
from loadgen.untrusted import clean_text

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
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for compare.html, compare.json and compare.md (default runs/compare-<time>)",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="write the comparison as JSON here (default: in --out)")
    p.add_argument("--markdown", default=None, metavar="FILE", help="write a Markdown summary here (default: in --out)")
    p.set_defaults(func=main)


def verdict_table(c: Comparison, verdicts: list[Verdict], title: str) -> Table:
    from rich.table import Table
    from rich.text import Text

    from loadgen.report.compare_outputs import cell_text

    t = Table(title=title, show_edge=False)
    t.add_column("figure")
    for n in c.names:
        t.add_column(Text(clean_text(n, 60)), justify="right")
    t.add_column("winner")
    for v in verdicts:
        win = Text(clean_text(v.winner, 60), style="bold green") if v.winner else Text("no clear winner", style="dim")
        if v.withheld:
            win = Text("withheld (suspect)", style="yellow")
        t.add_row(Text(f"{v.metric} ({v.unit})"), *[Text(cell_text(v, n)) for n in c.names], win)
    return t


def print_comparison(c: Comparison, console: Console) -> None:
    from rich.text import Text

    for line in c.suspects:  # first: a verdict on suspect data is no verdict
        style = "bold red" if line.startswith(("SUSPECT", "INTERRUPTED")) else "bold yellow"
        console.print(Text(clean_text(line, 500), style=style))
    if c.same_traffic is not None:  # then whether the runs saw the same traffic
        same = c.same_traffic.identical
        style = "green" if same is True else "bold red" if same is False else "yellow"
        console.print(Text(clean_text(c.same_traffic.line, 500), style=style))
    for m in c.mismatches:
        console.print(Text(f"WARNING: {clean_text(m, 500)}", style="bold red"))
    for n in c.notes:
        console.print(Text(f"note: {clean_text(n, 500)}", style="yellow"))
    head = [v for v in c.verdicts if v.group == "headline"]
    matched = [v for v in c.verdicts if v.group != "headline"]
    console.print(verdict_table(c, head, "bake-off (95% intervals; a winner only where they separate)"))
    if matched:
        console.print(verdict_table(c, matched, "at matched load"))


def main(args: argparse.Namespace) -> int:
    from loadgen.records import check_run_folder
    from loadgen.run_folder import writable_folder

    for run in args.runs:
        check_run_folder(Path(run))  # before the analysis is imported
    from rich.console import Console
    from rich.text import Text

    from loadgen.analysis.compare import compare_runs
    from loadgen.report.compare import write_compare
    from loadgen.report.compare_outputs import write_compare_outputs

    slo, slo_name, target = resolve_slo(args.slo)
    target = args.slo_target if args.slo_target is not None else target
    out = writable_folder(Path(args.out) if args.out else Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S"))
    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path:
            writable_folder(Path(path).parent, flag)
    c = compare_runs(
        [Path(r) for r in args.runs], names=args.name, slo=slo, slo_name=slo_name or None, target_pct=target
    )
    secrets = secrets_of(args)
    html = write_compare(c, out, secrets)
    files = write_compare_outputs(
        c,
        json_path=Path(args.json) if args.json else out / "compare.json",
        markdown_path=Path(args.markdown) if args.markdown else out / "compare.md",
        secrets=secrets,
    )
    console = Console(width=None if sys.stdout.isatty() else 160)
    print_comparison(c, console)
    console.print(Text(f"report: {html}; " + ", ".join(str(f) for f in files)))
    return 0
