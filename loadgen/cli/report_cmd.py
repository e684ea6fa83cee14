"""``loadgen report RUN_DIR``: re-render every figure from a run folder's records."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.cli.run_flags import LAG_MS, SECONDS


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="recompute and show a run's figures from its records",
        description="Recompute summary.json (and the reports) from records.parquet.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument(
        "--warmup",
        type=SECONDS,
        default=None,
        metavar="S",
        help="seconds excluded at the start (default: as the run was configured)",
    )
    p.add_argument(
        "--cooldown",
        type=SECONDS,
        default=None,
        metavar="S",
        help="seconds excluded at the end (default: as the run was configured)",
    )
    p.add_argument(
        "--lag-limit-ms",
        type=LAG_MS,
        default=None,
        help="schedule-lag p99 bound for validity, ms (default: as the run was configured)",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from loadgen.records import check_run_folder
    from loadgen.run_folder import read_run_meta

    run_dir = Path(args.run_dir)
    check_run_folder(run_dir)  # before the analysis is imported
    from loadgen.analysis.run_summary import summarize_run
    from loadgen.report.html import write_report

    if read_run_meta(run_dir).get("points"):  # a sweep: per point, the frontier, capacity at SLO
        from loadgen.report.sweep_view import render_sweep

        options = {"lag_limit_ms": args.lag_limit_ms} if args.lag_limit_ms is not None else {}
        render_sweep(run_dir, **options).print()
        return 0
    from loadgen.records import read_records

    table = read_records(run_dir)  # read once: the summary, the terminal and report.html share its figures
    report = summarize_run(
        run_dir, warmup_s=args.warmup, cooldown_s=args.cooldown, lag_limit_ms=args.lag_limit_ms, table=table
    )
    from loadgen.report.terminal import print_run

    print_run(report)
    print(f"report: {write_report(run_dir, table=table)}")
    return 0
