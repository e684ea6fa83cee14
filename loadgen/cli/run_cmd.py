"""``loadgen run``: one load point against an endpoint (or the built-in simulator).

Its flags are ``cli.run_flags``' (shared with ``sweep``), turned into a workload and
``RunSettings`` by ``cli.run_settings``; every value is checked twice before anything is sent:
by its argparse type as the line is parsed, and by ``RunSettings`` when it is built.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen.cli.distributed_flags import add_master_options, point_sender_of
from loadgen.cli.endpoint_flags import warn_insecure
from loadgen.cli.flags import bounded_int, finite_float
from loadgen.cli.gate_cmd import add_gate_options, gate_after_run, slo_of
from loadgen.cli.overrides import add_set_flag
from loadgen.cli.sim_cmd import add_sim_options, check_sim_options, sim_args
from loadgen.cli.virtual_flags import run_virtual
from loadgen.client.settings import (
    DEFAULT_CLOSED_REQUESTS,
    DEFAULT_DURATION_S,
    MAX_CONCURRENCY,
    MAX_RATE,
    MAX_REQUESTS,
)
from loadgen.errors import LoadgenError

if TYPE_CHECKING:
    pass

from loadgen.cli.run_flags import (
    EXIT_CODES,
    POSITIVE_SECONDS,
    RUN_DEFAULTS,
    SECONDS,
    add_counting_options,
    add_output_options,
    add_target_options,
    add_timing_options,
    add_traffic_options,
)
from loadgen.cli.run_settings import arrival_label, load_unit_of, resolve_workload, settings_from_args, what_is_sent


def preflight(args: argparse.Namespace) -> None:
    """What must hold before a simulator is started or anything sent: a known event loop
    (LOADGEN_LOOP) and good simulator options."""
    from loadgen.clock import loop_name

    loop_name()
    check_sim_options(args)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="send one load point and record every request",
        description="Send traffic at a rate (open loop) or concurrency (closed loop), "
        "time every streamed chunk, and write a run folder.",
        epilog=EXIT_CODES
        + "\n\nrun.json says running while the run runs, then complete or interrupted (with the reason).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_options(p)
    g = p.add_argument_group("load")
    g.add_argument(
        "--rate",
        type=finite_float(0, MAX_RATE, above=True, unit=" requests/s"),
        default=None,
        help="requests per second, open loop (sessions per second for a multi-turn workload); "
        "required without --concurrency, except for a trace workload, which carries its own "
        "arrival times (default: none)",
    )
    g.add_argument(
        "--arrival",
        default=None,
        help="constant | poisson | gamma:CV (default: poisson; a trace workload: trace, its own times)",
    )
    g.add_argument(
        "--speed",
        type=finite_float(0, MAX_RATE, above=True, unit=" times as fast"),
        default=None,
        metavar="X",
        help="replay a trace workload X times as fast as recorded, e.g. 2 halves every gap; "
        "the same as --set speed=X (default: the spec's speed, 1)",
    )
    g.add_argument(
        "--concurrency",
        type=bounded_int(1, MAX_CONCURRENCY),
        default=None,
        help="closed loop: N users each sending when their previous answer ends (default: none: open loop at --rate)",
    )
    g.add_argument(
        "--duration",
        type=POSITIVE_SECONDS,
        default=None,
        metavar="S",
        help="seconds of sending; cuts a trace short (default: a trace workload's whole span, "
        f"a finite workload's every session; else {DEFAULT_DURATION_S:g} s, or for a closed loop "
        f"{DEFAULT_CLOSED_REQUESTS} requests)",
    )
    g.add_argument(
        "--requests",
        type=bounded_int(1, MAX_REQUESTS),
        default=None,
        metavar="N",
        help=f"number of requests (sessions), at most {MAX_REQUESTS:,} (so is --rate x --duration); "
        "cuts a trace to its first N (default: see --duration)",
    )
    g.add_argument(
        "--warmup",
        type=SECONDS,
        default=RUN_DEFAULTS["warmup_s"],
        metavar="S",
        help="seconds excluded at the start (default: %(default)g s)",
    )
    g.add_argument(
        "--cooldown",
        type=SECONDS,
        default=RUN_DEFAULTS["cooldown_s"],
        metavar="S",
        help="seconds excluded at the end (default: %(default)g s)",
    )
    add_traffic_options(p)
    add_set_flag(p)
    add_counting_options(p)
    add_timing_options(p)
    add_master_options(p)
    p.add_argument("--keep-text", action="store_true", help="store each answer's text in the records")
    add_output_options(p)
    add_sim_options(p)
    add_gate_options(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from loadgen.client.settings import api_key_from_env

    # everything is checked before anything is started or sent (most of it before the heavy imports)
    preflight(args)
    slo = slo_of(args)  # a bad profile, tolerance or baseline
    from loadgen.workload.salt import resolve_salt

    salt = resolve_salt(args.salt)  # a bad --salt, before anything starts
    workload = resolve_workload(args, salt=salt.text)
    settings = settings_from_args(args, workload)
    api_key = api_key_from_env(args.api_key_env)
    warn_insecure(settings.http)
    sent = what_is_sent(args, settings, workload)
    if sent:
        print(sent)
    label = arrival_label(settings.arrival, load_unit_of(workload))
    if args.sim_virtual:  # no server, no client: the engine in virtual time (cli/virtual_flags.py)
        return run_virtual(args, settings, workload, salt, slo)

    from loadgen.analysis.run_summary import summarize_run
    from loadgen.cli.live import LiveView
    from loadgen.client.run import execute, new_run_id

    out = Path(args.out) if args.out else Path("runs") / new_run_id()
    view = LiveView.for_run(settings, enabled=args.live, title=f"loadgen run: {label}")
    with point_sender_of(args) as sender, view:  # with --master: its workers are ready before anything starts
        result = execute(
            settings,
            workload,
            out,
            api_key=api_key,
            sim_flags=sim_args(args),
            on_engine=view.attach,
            force=args.force,
            on_live=view.on_shard,
            salt=salt,
            point_sender=sender,
        )
    try:
        from loadgen.records import read_records

        records = read_records(out)  # read once: the summary and report.html share its figures
        report = summarize_run(out, lag_limit_ms=settings.lag_limit_ms, slo=slo, table=records)
    except LoadgenError as e:
        if not result.interrupted:
            raise
        print(f"no report: {e}")  # stopped before anything could be summarised
    else:
        from loadgen.report.terminal import print_run

        print_run(report)
        if getattr(args, "report", True):
            from loadgen.report.html import write_report  # matplotlib's half second, only for a report

            print(f"report: {write_report(out, table=records)}")
    cut = result.cut_inflight if result.drain_cut else None
    return ending(result.interrupted, result.stop_reason, cut, result.failure) or gate_after_run(out, args)


def ending(interrupted: bool, stop_reason: str | None, cut_inflight: int | None, failure: str | None) -> int:
    """Say how a run or sweep ended, if not plainly; its exit code (0: go on to the gate)."""
    import sys

    from loadgen.client.interrupts import exit_code

    if cut_inflight is not None:
        print(f"second interrupt: drain cut short; {cut_inflight} in flight recorded as cancelled")
    if interrupted:
        print(f"interrupted ({stop_reason}): sending stopped; every request sent is in the records")
        return exit_code(stop_reason) or 130
    if failure:
        print(f"loadgen: every request failed: {failure}", file=sys.stderr)
        return 4
    return 0
