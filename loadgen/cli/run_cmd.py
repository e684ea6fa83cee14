"""``loadgen run``: one load point against an endpoint (or the built-in simulator)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen.cli.gate_cmd import add_gate_options, gate_after_run, slo_of
from loadgen.cli.sim_cmd import add_sim_options, sim_args
from loadgen.errors import ConfigError

if TYPE_CHECKING:
    from loadgen.client.config import Timeouts
    from loadgen.client.settings import RunSettings
    from loadgen.schedule import Arrival
    from loadgen.workload.base import Workload


def add_target_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL, "
        "else the built-in simulator started on loopback)",
    )
    g.add_argument("--model", default=None, help="model to ask for (default: the first /v1/models lists)")
    g.add_argument("--api", choices=("chat", "completions"), default="chat", help="API to call")
    g.add_argument(
        "--server-metrics",
        default=None,
        metavar="URL|off",
        help="scrape the server's Prometheus metrics every second into server_metrics.jsonl "
        "(default: the endpoint's /metrics, when it answers)",
    )
    g.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="read the API key from $NAME (default $OPENAI_API_KEY); it is never written anywhere",
    )


def add_traffic_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("traffic")
    g.add_argument(
        "--workload",
        default=None,
        metavar="NAME|PATH",
        help="workload spec (built-in name or YAML file); default: fixed-length chat "
        "from --input-tokens/--output-tokens",
    )
    g.add_argument("--input-tokens", type=int, default=None, help="prompt length in tokens (default 512)")
    g.add_argument("--output-tokens", type=int, default=None, help="answer length in tokens (default 128)")
    g.add_argument("--seed", type=int, default=0, help="seed of schedule and workload (same seed, same traffic)")
    g.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not send ignore_eos (answers may end before the requested length)",
    )
    g.add_argument(
        "--extra-body", default=None, metavar="JSON", help="extra JSON fields merged into every request body"
    )


def add_timing_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("timeouts and limits")
    g.add_argument("--connect-timeout", type=float, default=10.0, metavar="S")
    g.add_argument(
        "--first-byte-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="longest wait for the first data of an answer (queueing included)",
    )
    g.add_argument(
        "--idle-timeout", type=float, default=60.0, metavar="S", help="longest gap between chunks of an answer"
    )
    g.add_argument("--request-timeout", type=float, default=3600.0, metavar="S", help="total per request")
    g.add_argument(
        "--max-inflight",
        type=int,
        default=10_000,
        help="safety cap on requests in flight; reaching it is reported as a distortion",
    )
    g.add_argument(
        "--drain",
        type=float,
        default=60.0,
        metavar="S",
        help="after the last send (or Ctrl-C), wait this long for answers in flight",
    )
    g.add_argument(
        "--lag-limit-ms", type=float, default=10.0, help="schedule lag p99 above this marks the result suspect"
    )
    g.add_argument(
        "--workers",
        type=int,
        default=1,
        help="client processes sharing the schedule (more load than one core can time)",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="send one load point and record every request",
        description="Send traffic at a rate (open loop) or concurrency (closed loop), "
        "time every streamed chunk, and write a run folder.",
    )
    add_target_options(p)
    g = p.add_argument_group("load")
    g.add_argument("--rate", type=float, default=None, help="requests (sessions) per second, open loop")
    g.add_argument("--arrival", default="poisson", help="constant | poisson | gamma:CV (default poisson)")
    g.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop: N users each sending when their previous answer ends",
    )
    g.add_argument("--duration", type=float, default=None, metavar="S", help="seconds of sending")
    g.add_argument("--requests", type=int, default=None, metavar="N", help="number of requests (sessions)")
    g.add_argument("--warmup", type=float, default=0.0, metavar="S", help="seconds excluded at the start")
    g.add_argument("--cooldown", type=float, default=0.0, metavar="S", help="seconds excluded at the end")
    add_traffic_options(p)
    add_timing_options(p)
    p.add_argument("--keep-text", action="store_true", help="store each answer's text in the records")
    p.add_argument("--out", default=None, metavar="DIR", help="run folder (default runs/<run id>)")
    p.add_argument("--no-live", dest="live", action="store_false", help="no live view while running")
    add_sim_options(p)
    add_gate_options(p)
    p.set_defaults(func=main)


def resolve_arrival(args: argparse.Namespace) -> Arrival:
    from loadgen.schedule import ScheduleError, parse_arrival

    if args.rate is not None and args.concurrency is not None:
        raise ConfigError("give --rate (open loop) or --concurrency (closed loop), not both")
    if args.rate is None and args.concurrency is None:
        raise ConfigError("give --rate R (requests/s, open loop) or --concurrency N (closed loop)")
    try:
        if args.concurrency is not None:
            return parse_arrival("closed", concurrency=args.concurrency)
        return parse_arrival(args.arrival, rate=args.rate)
    except ScheduleError as e:
        raise ConfigError(str(e)) from None


def resolve_workload(args: argparse.Namespace, salt: str = "") -> Workload:
    from loadgen.workload.base import SyntheticChat
    from loadgen.workload.load import load_workload

    if args.workload:
        overrides = {
            k: v
            for k, v in (("input_tokens", args.input_tokens), ("output_tokens", args.output_tokens))
            if v is not None
        }
        return load_workload(args.workload, seed=args.seed, salt=salt, overrides=overrides)
    for flag, v in (("--input-tokens", args.input_tokens), ("--output-tokens", args.output_tokens)):
        if v is not None and v < 1:
            raise ConfigError(f"{flag} {v}: must be >= 1")
    return SyntheticChat(
        input_tokens=args.input_tokens or 512, output_tokens=args.output_tokens or 128, seed=args.seed, salt=salt
    )


def resolve_extra(args: argparse.Namespace) -> dict:
    if not args.extra_body:
        return {}
    import orjson

    try:
        extra = orjson.loads(args.extra_body)
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"--extra-body is not valid JSON: {e}") from None
    if not isinstance(extra, dict):
        raise ConfigError("--extra-body must be a JSON object")
    return extra


def resolve_endpoint(args: argparse.Namespace) -> str | None:
    import os

    return args.endpoint or os.environ.get("OPENAI_BASE_URL") or None


def timeouts(args: argparse.Namespace) -> Timeouts:
    from loadgen.client.config import Timeouts

    values = (args.connect_timeout, args.first_byte_timeout, args.idle_timeout, args.request_timeout)
    if min(values) <= 0:
        raise ConfigError("timeouts must be > 0 seconds")
    return Timeouts(*values)


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    from loadgen.client.settings import RunSettings

    if args.duration is None and args.requests is None:
        args.duration = 10.0 if args.concurrency is None else None
        if args.duration is None:
            args.requests = 100
    return RunSettings(
        endpoint=resolve_endpoint(args),
        model=args.model,
        api=args.api,
        arrival=resolve_arrival(args),
        duration_s=args.duration,
        requests=args.requests,
        seed=args.seed,
        warmup_s=args.warmup,
        cooldown_s=args.cooldown,
        timeouts=timeouts(args),
        ignore_eos=args.ignore_eos,
        keep_text=args.keep_text,
        max_inflight=args.max_inflight,
        drain_s=args.drain,
        lag_limit_ms=args.lag_limit_ms,
        extra_body=resolve_extra(args),
        workers=args.workers,
        server_metrics=args.server_metrics,
    )


def main(args: argparse.Namespace) -> int:
    from loadgen.analysis.run_summary import summarize_run
    from loadgen.cli.live import LiveView
    from loadgen.client.run import execute, new_run_id
    from loadgen.client.settings import api_key_from_env

    slo = slo_of(args)  # a bad profile, tolerance or baseline fails here, before any traffic
    settings = settings_from_args(args)
    workload = resolve_workload(args)
    api_key = api_key_from_env(args.api_key_env)
    out = Path(args.out) if args.out else Path("runs") / new_run_id()
    view = LiveView(enabled=args.live and settings.workers == 1, title=f"loadgen run: {settings.arrival}")
    with view:
        result = execute(settings, workload, out, api_key=api_key, sim_flags=sim_args(args), on_engine=view.attach)
    report = summarize_run(out, lag_limit_ms=settings.lag_limit_ms, slo=slo)
    from loadgen.report.terminal import print_run

    print_run(report)
    from loadgen.report.html import write_report

    print(f"report: {write_report(out)}")
    if result.interrupted:
        print("interrupted: sending stopped; every finished request is in the records")
        return 130
    return gate_after_run(out, args)
