"""``loadgen sweep``: load points (listed or searched) into one run folder, its Pareto curve and report.

With no endpoint it sweeps the built-in simulator; with no load option it runs
the automatic search (``--auto``); with no ``--point-duration`` each point runs until its
window holds the requests its p99 verdicts need (``sweep.sizing``), within a cap per
point and for the sweep; with no ``--slo`` it judges by the ``interactive-chat`` profile,
and with no ``--price-per-gpu-hour`` it prices tokens at a labelled example price. So a
bare ``loadgen sweep`` draws a real curve with goodput, capacity at SLO and $/M tokens,
with bounded p99s, in about three minutes. The plan (points and time), the SLO and the
price it uses are printed before anything is sent; the points a cap cut short, after.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen.cli.distributed_flags import add_master_options, point_sender_of
from loadgen.cli.endpoint_flags import warn_insecure
from loadgen.cli.flags import finite_float
from loadgen.cli.gate_cmd import add_gate_options, gate_after_run, gate_profile
from loadgen.cli.overrides import add_set_flag
from loadgen.cli.run_cmd import ending, preflight
from loadgen.cli.run_flags import (
    EXIT_CODES,
    POSITIVE_SECONDS,
    SECONDS,
    add_counting_options,
    add_output_options,
    add_target_options,
    add_timing_options,
    add_traffic_options,
)
from loadgen.cli.run_settings import load_unit_of, resolve_workload, shared_settings
from loadgen.cli.sim_cmd import add_sim_options, sim_args
from loadgen.cli.sweep_defaults import (
    DEFAULT_SLO,
    EXAMPLE_PRICE,
    UNSIZED_START_RATE,
    defaults_note,
    prices_from_args,
    sizing_from_args,
    sizing_note,
    slo_choice,
    start_rate,
)
from loadgen.client.settings import MAX_CONCURRENCY, MAX_RATE
from loadgen.errors import ConfigError, LoadgenError
from loadgen.sweep.sizing import MAX_POINT_S, MAX_TOTAL_S, MIN_POINT_S

if TYPE_CHECKING:
    from loadgen.analysis.metrics import SLO
    from loadgen.schedule import Arrival
    from loadgen.sweep.run import SweepSettings
    from loadgen.workload.base import Workload


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sweep",
        help="sweep load points; Pareto frontier, goodput, capacity at SLO, report.html",
        description="Send a series of load points (or search for saturation and capacity at SLO) "
        "and draw the throughput-vs-interactivity Pareto curve.",
        epilog=EXIT_CODES + "\n\nrun.json, and each point's entry in it, says running while it runs, then\n"
        "complete or interrupted (with the reason); an interrupted point is kept and shown,\n"
        "and no further point is sent.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_options(p)
    g = p.add_argument_group("load points")
    m = g.add_mutually_exclusive_group()
    m.add_argument(
        "--rates",
        default=None,
        metavar="LIST",
        help="offered rates in req/s (open loop): 1,2,4,8 or 1:64:x2 or 5:50:+5 (default: none: --auto)",
    )
    m.add_argument(
        "--concurrency",
        default=None,
        metavar="LIST",
        help="closed-loop concurrencies: 1,4,16,64 (default: none: --auto)",
    )
    m.add_argument(
        "--auto",
        action="store_true",
        help="search: ramp to saturation, spread points below it, bisect for capacity at SLO (default)",
    )
    g.add_argument(
        "--arrival", default="poisson", help="constant | poisson | gamma:CV for rate points (default: %(default)s)"
    )
    rate = finite_float(0, MAX_RATE, above=True, unit=" requests/s")
    g.add_argument(
        "--point-duration",
        type=POSITIVE_SECONDS,
        default=None,
        metavar="S",
        help="measured seconds of every point, fixed (default: sized: each point runs until its window "
        "holds the requests a bounded p99 needs, within --min-point-duration and --max-point-duration)",
    )
    g.add_argument(
        "--min-point-duration",
        type=POSITIVE_SECONDS,
        default=MIN_POINT_S,
        metavar="S",
        help="sized points: shortest measured window (default: %(default)g s)",
    )
    g.add_argument(
        "--max-point-duration",
        type=POSITIVE_SECONDS,
        default=MAX_POINT_S,
        metavar="S",
        help="sized points: cap on one point's measured window; a point that needs longer is cut here "
        "and named (default: %(default)g s)",
    )
    g.add_argument(
        "--max-sweep-duration",
        type=POSITIVE_SECONDS,
        default=MAX_TOTAL_S,
        metavar="S",
        help="sized points: cap on all measured windows together (warm-ups and drains come on top); "
        "the search stops when it is used up (default: %(default)g s)",
    )
    g.add_argument(
        "--warmup",
        type=SECONDS,
        default=2.0,
        metavar="S",
        help="seconds sent before each window (default: %(default)g s)",
    )
    g.add_argument(
        "--start-rate",
        type=rate,
        default=None,
        help="--auto: first (light) rate, req/s (default: sized: the lowest rate whose point fills its "
        f"window within --max-point-duration, rounded up; {UNSIZED_START_RATE:g} req/s with --point-duration)",
    )
    g.add_argument(
        "--max-rate", type=rate, default=256.0, help="--auto: never offer more than this (default: %(default)g req/s)"
    )
    g.add_argument(
        "--no-point-salt",
        dest="point_salt",
        action="store_false",
        help="reuse the same prompts at every point (prefix caches then carry over; not recommended)",
    )
    j = p.add_argument_group("judging")
    j.add_argument(
        "--slo",
        default=None,
        metavar="PROFILE",
        help="SLO profile (conformance name or YAML file) or inline ttft=200,tpot=30,e2e=2000 (ms); "
        f"none for no SLO (default: {DEFAULT_SLO}, said so in the terminal and run.json)",
    )
    j.add_argument(
        "--slo-target",
        type=finite_float(0, 100, above=True, unit=" %"),
        default=None,
        metavar="PCT",
        help="SLO attainment that counts as meeting it (default: the profile's, else 99)",
    )
    j.add_argument(
        "--gpus",
        type=finite_float(0, 1e6, above=True),
        default=None,
        help="GPUs behind the endpoint, for per-GPU throughput and cost (default: the simulator's --sim-tp; "
        "against an endpoint, without it figures are per endpoint)",
    )
    j.add_argument(
        "--price-per-gpu-hour",
        nargs="+",
        action="extend",
        default=None,
        metavar="P",
        help="price(s) per GPU-hour, optionally labelled: 2.49 or spot=1.2 (gives $/M output tokens; "
        f"default: an example ${EXAMPLE_PRICE:g}, labelled as one)",
    )
    add_traffic_options(p)
    add_set_flag(p)
    add_counting_options(p)
    add_timing_options(p)
    add_master_options(p)
    p.set_defaults(drain=15.0)  # a sweep moves on: answers still running 15 s after a point are cancelled
    p.add_argument("--keep-text", action="store_true", help="store each answer's text in the records")
    add_output_options(p)
    add_sim_options(p)
    add_gate_options(p)
    p.set_defaults(func=main)


# --------------------------------------------------------------------------- options


def resolve_slo(text: str | None) -> tuple[SLO | None, str, float | None]:
    """(per-request SLO, its name, the profile's attainment target if it states one)."""
    if not text:
        return None, "", None
    if "=" in text and not Path(text).exists():  # inline bounds
        return _inline_slo(text), text, None
    from loadgen.conformance.slo import load_profile

    profile = load_profile(text)
    if profile.slo is None:
        raise ConfigError(
            f"--slo {text}: the profile has no `slo:` block of per-request bounds "
            "(ttft_ms/tpot_ms/e2e_ms), which goodput and capacity at SLO need"
        )
    target = next((c.bound for c in profile.criteria if c.metric == "attainment"), None)
    return profile.slo, profile.name, target


def _inline_slo(text: str) -> SLO:
    from loadgen.analysis.metrics import SLO

    keys = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
    values: dict[str, float] = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        k = k.strip().lower().removesuffix("_ms")
        if k not in keys:
            raise ConfigError(f"--slo {text!r}: {k!r} is not one of ttft, tpot, e2e (bounds in ms)")
        try:
            values[keys[k]] = float(v.strip().removesuffix("ms"))
        except ValueError:
            raise ConfigError(f"--slo {text!r}: {v!r} is not a number of milliseconds") from None
    try:
        return SLO(**values)
    except LoadgenError as e:  # MetricsError: bounds that are not positive milliseconds
        raise ConfigError(f"--slo {text!r}: {e}") from None


def _arrivals(args: argparse.Namespace) -> tuple[str, tuple[Arrival, ...]]:
    """The listed load points (each within a run's limits), checked before the sweep starts."""
    from loadgen.schedule import parse_arrival  # its ScheduleError is a ConfigError
    from loadgen.sweep.plan import parse_list

    if args.concurrency is not None:
        values = parse_list(args.concurrency, "--concurrency", integer=True)
        _at_most(values, MAX_CONCURRENCY, f"--concurrency {args.concurrency}")
        return "concurrency", tuple(parse_arrival("closed", concurrency=int(v)) for v in values)
    if args.rates is not None:
        values = parse_list(args.rates, "--rates")
        _at_most(values, MAX_RATE, f"--rates {args.rates}")
        return "rates", tuple(parse_arrival(args.arrival, rate=v) for v in values)
    parse_arrival(args.arrival, rate=1.0)  # validate the kind before the search starts
    return "auto", ()


def _at_most(values: list[float], limit: float, flag: str) -> None:
    top = max(values)
    if top > limit:
        shown = f"{int(top):,}" if top.is_integer() and top < 1e18 else f"{top:g}"
        raise ConfigError(f"{flag}: {shown} is above the limit of {limit:,.0f}")


def settings_from_args(args: argparse.Namespace, workload: Workload | None = None) -> SweepSettings:
    """The sweep's settings from its flags (and its workload, whose spec may name the tokenizer)."""
    from loadgen.client.settings import RunSettings
    from loadgen.schedule import parse_arrival
    from loadgen.sweep.plan import SweepPlan
    from loadgen.sweep.run import SweepSettings
    from loadgen.sweep.search import AutoSearch, count_cv

    mode, arrivals = _arrivals(args)
    slo_text, slo_is_default = slo_choice(args)
    slo, slo_name, profile_target = resolve_slo(slo_text)
    target = args.slo_target if args.slo_target is not None else (profile_target or 99.0)
    kind = parse_arrival(args.arrival, rate=1.0)
    sizing = sizing_from_args(args, target if slo is not None else None)
    start = start_rate(args, sizing, count_cv(kind.kind, kind.cv))
    auto = AutoSearch(start_rate=start, max_rate=args.max_rate, target_pct=target)
    point_s = args.point_duration if sizing is None else sizing.min_s
    plan = SweepPlan(
        mode=mode,
        arrivals=arrivals,
        point_duration_s=point_s,
        warmup_s=args.warmup,
        drain_s=args.drain,
        auto=auto,
        has_slo=slo is not None,
        kind=kind.kind,
        cv=kind.cv,
        sizing=sizing,
    )
    base = RunSettings(**shared_settings(args, workload), duration_s=point_s + args.warmup)
    prices, example = prices_from_args(args)
    gpus, gpus_default = args.gpus, False
    if gpus is None and base.endpoint is None:  # the built-in simulator: its own tensor-parallel degree
        gpus, gpus_default = float(getattr(args, "sim_tp", 1) or 1), True
    return SweepSettings(
        base=base,
        plan=plan,
        slo=slo,
        slo_name=slo_name,
        gpus=gpus,
        prices=prices,
        point_salt=args.point_salt,
        salt=args.salt,
        slo_is_default=slo_is_default,
        price_is_example=example,
        gpus_is_default=gpus_default,
    )


# --------------------------------------------------------------------------- main


def main(args: argparse.Namespace) -> int:
    from loadgen.client.run import new_run_id
    from loadgen.client.settings import api_key_from_env

    # everything is checked before anything is started or sent (and before the reports' imports)
    preflight(args)
    workload = resolve_workload(args)  # a bad workload spec (each point builds its own, salted)
    settings = settings_from_args(args, workload)
    if args.slo is not None and args.slo.strip().lower() == "none":
        args.slo = None  # no SLO: nothing for --gate to judge by (it says so)
    gate_profile(args)  # --gate's profile, tolerance and baseline
    api_key = api_key_from_env(args.api_key_env)
    warn_insecure(settings.base.http)
    out = Path(args.out) if args.out else Path("runs") / new_run_id()
    if args.sim_virtual:  # no server, no client: every point in virtual time (cli/virtual_flags.py)
        from loadgen.cli.virtual_flags import sweep_virtual

        return sweep_virtual(args, settings, lambda salt: resolve_workload(args, salt=salt), out)

    from rich.console import Console
    from rich.text import Text

    from loadgen.cli.live import SweepView
    from loadgen.report.sweep_view import render_sweep
    from loadgen.sweep.run import run_sweep

    console = Console(stderr=True)
    target = settings.base.endpoint or "the built-in simulator"
    console.print(Text(f"loadgen sweep -> {target}; {settings.plan.describe()}", style="bold"), highlight=False)
    for line in defaults_note(settings):
        console.print(line, style="dim", highlight=False)
    view = SweepView(settings, enabled=args.live, console=console, unit=load_unit_of(workload))
    with point_sender_of(args) as sender, view:  # with --master: every point goes to the same workers
        result = run_sweep(
            settings,
            lambda salt: resolve_workload(args, salt=salt),
            out,
            api_key=api_key,
            sim_flags=sim_args(args),
            on_point=view.on_point,
            on_engine=view.attach,
            force=args.force,
            on_live=view.on_shard,
            point_sender=sender,
        )
    cut = result.cut_inflight if result.drain_cut else None
    if not result.points:
        if not result.interrupted:
            raise LoadgenError("the sweep ended before its first point was sent")
        return ending(True, result.stop_reason, cut, None)
    report = render_sweep(out, html=getattr(args, "report", True))
    report.print(Console(width=None if sys.stdout.isatty() else 160))
    if (note := sizing_note(settings.plan.sizing, [p.step for p in result.points])) is not None:
        console.print(note, style="yellow" if "hit a cap" in note else "dim", highlight=False)
    return ending(result.interrupted, result.stop_reason, cut, result.failure) or gate_after_run(out, args)
