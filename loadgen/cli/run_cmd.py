"""``loadgen run``: one load point against an endpoint (or the built-in simulator).

The flags' defaults are ``RunSettings``'s and ``Timeouts``'s (read from the dataclasses,
not repeated here), and every value is checked twice before anything is sent: by
its argparse type as the line is parsed, and by ``RunSettings`` when it is built.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen.cli.endpoint_flags import add_endpoint_options, endpoint_options_of, warn_insecure
from loadgen.cli.flags import bounded_int, finite_float
from loadgen.cli.gate_cmd import add_gate_options, gate_after_run, slo_of
from loadgen.cli.overrides import add_set_flag, parse_sets
from loadgen.cli.sim_cmd import add_sim_options, check_sim_options, sim_args
from loadgen.client.config import APIS, MAX_INFLIGHT, Timeouts
from loadgen.client.endpoint_options import MAX_TOKENS_FIELDS
from loadgen.client.settings import (
    DEFAULT_CLOSED_REQUESTS,
    DEFAULT_DURATION_S,
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_WORKERS,
    PER_CHUNK_USAGE,
    RunSettings,
)
from loadgen.errors import ConfigError, LoadgenError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from loadgen.schedule import Arrival
    from loadgen.workload.base import Workload

RUN_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(RunSettings) if f.default is not MISSING}
TIMEOUT_DEFAULTS = Timeouts()
MAX_TOKENS = 10_000_000  # prompt or answer length: longer than any model's context
INPUT_TOKENS, OUTPUT_TOKENS = 512, 128  # the synthetic chat sent without --workload
SECONDS = finite_float(0, MAX_DURATION_S, unit=" seconds")
POSITIVE_SECONDS = finite_float(0, MAX_DURATION_S, above=True, unit=" seconds")
LAG_MS = finite_float(0, 3.6e6, above=True, unit=" ms")

EXIT_CODES = """\
exit codes:
  0    done (and the --gate verdict, if any, is PASS)
  1    --gate verdict FAIL
  2    usage error or bad input: nothing was sent
  3    --gate verdict INCONCLUSIVE: a suspect run would decide it
  4    every request failed: one line names the most common failure and its count
  130  stopped by SIGINT (Ctrl-C): sending stopped, answers in flight drained, everything written
  143  stopped by SIGTERM: the same

A second Ctrl-C (or SIGTERM) ends the drain at once: what is still in flight is recorded
as cancelled, what was never sent as not_sent."""


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
    g.add_argument(
        "--api",
        choices=APIS,
        default=RUN_DEFAULTS["api"],
        help="API to call: chat, completions, responses (the Responses API, POST /v1/responses), "
        "embeddings or rerank (one JSON answer: latency and inputs/s, no tokens streamed) (default: %(default)s)",
    )
    g.add_argument(
        "--server-metrics",
        default=RUN_DEFAULTS["server_metrics"],
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
    g.add_argument(
        "--max-tokens-field",
        choices=MAX_TOKENS_FIELDS,
        default=RUN_DEFAULTS["max_tokens_field"],
        help="the request field of the answer's length; newer OpenAI-style servers want "
        "max_completion_tokens (default: %(default)s)",
    )
    g.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="skip the checks before the schedule (the model is listed by /models, one tiny request "
        "is not refused with HTTP 401, 403 or 404)",
    )
    add_endpoint_options(p)


def add_traffic_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("traffic")
    g.add_argument(
        "--salt",
        default=None,
        metavar="S",
        help="prompt salt (default: a fresh random one per run, recorded in run.json, so prefix caches "
        "start cold); S replays a run's exact prompts; 'none' sends them unsalted (warm caches on purpose)",
    )
    g.add_argument(
        "--workload",
        default=None,
        metavar="NAME|PATH",
        help="workload spec (built-in name or YAML file); default: fixed-length chat "
        "from --input-tokens/--output-tokens",
    )
    tokens = bounded_int(1, MAX_TOKENS)
    g.add_argument(
        "--input-tokens", type=tokens, default=None, help=f"prompt length in tokens (default {INPUT_TOKENS})"
    )
    g.add_argument(
        "--output-tokens", type=tokens, default=None, help=f"answer length in tokens (default {OUTPUT_TOKENS})"
    )
    g.add_argument(
        "--batch-size",
        type=bounded_int(1, 4096),
        default=None,
        metavar="N",
        help="inputs per request for --api embeddings, documents per query for --api rerank (default 1)",
    )
    g.add_argument(
        "--seed",
        type=bounded_int(0, MAX_SEED),
        default=RUN_DEFAULTS["seed"],
        help="seed of schedule and workload: same seed, same traffic (default: %(default)s)",
    )
    g.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not send ignore_eos (answers may end before the requested length)",
    )
    g.add_argument(
        "--extra-body",
        default=None,
        metavar="JSON",
        help="extra JSON fields merged into every request body (default: none)",
    )


def add_counting_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("token counting")
    g.add_argument(
        "--per-chunk-usage",
        choices=PER_CHUNK_USAGE,
        default=RUN_DEFAULTS["per_chunk_usage"],
        help="ask for running usage on every chunk (stream_options.continuous_usage_stats), which gives "
        "each chunk its exact token count: auto probes the endpoint with one tiny request first (once "
        "per endpoint), on asks without probing, off never asks (default: %(default)s)",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH|builtin|none",
        help="without running usage, count each chunk's text with this tokenizer (a Hugging Face "
        "tokenizer.json or its folder; builtin: loadgen's approximate one); prompts are still built by "
        "the workload's own (default: the workload spec's tokenizer file, if it names one; else none: "
        "the final usage is spread evenly over the chunks)",
    )


def add_timing_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("timeouts and limits")
    t = TIMEOUT_DEFAULTS
    g.add_argument(
        "--connect-timeout",
        type=POSITIVE_SECONDS,
        default=t.connect,
        metavar="S",
        help="longest wait to connect (default: %(default)g s)",
    )
    g.add_argument(
        "--first-byte-timeout",
        type=POSITIVE_SECONDS,
        default=t.first_byte,
        metavar="S",
        help="longest wait for the first output token of an answer, queueing included (SSE comments, "
        "keep-alives, role and tool-call-header chunks do not count) (default: %(default)g s)",
    )
    g.add_argument(
        "--idle-timeout",
        type=POSITIVE_SECONDS,
        default=t.idle,
        metavar="S",
        help="longest gap between two reads of an answer once its body began (any bytes count, "
        "comments included) (default: %(default)g s)",
    )
    g.add_argument(
        "--request-timeout",
        type=POSITIVE_SECONDS,
        default=t.total,
        metavar="S",
        help="total time per request (default: %(default)g s)",
    )
    g.add_argument(
        "--max-inflight",
        type=bounded_int(1, MAX_INFLIGHT),
        default=RUN_DEFAULTS["max_inflight"],
        help="safety cap on requests in flight; reaching it is reported as a distortion "
        "(default: %(default)s requests)",
    )
    g.add_argument(
        "--drain",
        type=SECONDS,
        default=RUN_DEFAULTS["drain_s"],
        metavar="S",
        help="after the last scheduled send (or Ctrl-C), wait this long for answers in flight (default: %(default)g s)",
    )
    g.add_argument(
        "--lag-limit-ms",
        type=LAG_MS,
        default=RUN_DEFAULTS["lag_limit_ms"],
        help="schedule lag p99 above this marks the result suspect (default: %(default)g ms)",
    )
    g.add_argument(
        "--workers",
        type=bounded_int(1, MAX_WORKERS),
        default=RUN_DEFAULTS["workers"],
        help="client processes sharing the schedule, for more load than one core can time "
        "(default: %(default)s process)",
    )


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
    p.add_argument("--keep-text", action="store_true", help="store each answer's text in the records")
    add_output_options(p)
    add_sim_options(p)
    add_gate_options(p)
    p.set_defaults(func=main)


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, metavar="DIR", help="run folder (default runs/<run id>)")
    p.add_argument(
        "--force",
        action="store_true",
        help="let --out replace a run already in that folder (default: refuse)",
    )
    p.add_argument("--no-live", dest="live", action="store_false", help="no live view while running")
    p.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help="write no report.html (records, run.json and summary.json are written; `loadgen report DIR` "
        "makes the report later, from the records alone)",
    )


def preflight(args: argparse.Namespace) -> None:
    """What must hold before a simulator is started or anything sent: a known event loop
    (LOADGEN_LOOP) and good simulator options."""
    from loadgen.clock import loop_name

    loop_name()
    check_sim_options(args)


def resolve_arrival(args: argparse.Namespace) -> Arrival:
    from loadgen.schedule import parse_arrival  # its ScheduleError is a ConfigError

    if args.rate is not None and args.concurrency is not None:
        raise ConfigError("give --rate (open loop) or --concurrency (closed loop), not both")
    if args.rate is None and args.concurrency is None:
        raise ConfigError("give --rate R (requests/s, open loop) or --concurrency N (closed loop)")
    if args.concurrency is not None:
        return parse_arrival("closed", concurrency=args.concurrency)
    return parse_arrival(getattr(args, "arrival", None) or "poisson", rate=args.rate)


def workload_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--set KEY=VALUE``, ``--speed`` and ``--input-tokens``/``--output-tokens`` change in a
    workload spec (``load_workload``'s ``overrides``); any of them without ``--workload`` is refused."""
    sets = parse_sets(args)
    speed = getattr(args, "speed", None)
    if speed is not None:
        if "speed" in sets:
            raise ConfigError("give --speed X or --set speed=X, not both")
        sets["speed"] = speed
    if not args.workload and sets:
        flag = "--speed" if speed is not None else "--set"
        raise ConfigError(f"{flag} changes a workload spec: give --workload NAME|PATH too")
    for key in ("input_tokens", "output_tokens"):
        if getattr(args, key) is not None:
            sets[key] = getattr(args, key)
    return sets


def resolve_workload(args: argparse.Namespace, salt: str = "") -> Workload:
    from loadgen.workload.base import SyntheticChat
    from loadgen.workload.distributions import Fixed
    from loadgen.workload.load import load_workload
    from loadgen.workload.pooled import POOLED_APIS, PooledWorkload
    from loadgen.workload.text import TextSource

    overrides = workload_overrides(args)
    api = getattr(args, "api", "chat")
    if args.workload:
        w = load_workload(args.workload, seed=args.seed, salt=salt, overrides=overrides)
        kind = w.describe().get("kind")
        if (kind in POOLED_APIS or api in POOLED_APIS) and kind != api:
            raise ConfigError(f"--workload {args.workload}: its kind is {kind}; run it with --api {kind}")
        return w
    if getattr(args, "batch_size", None) is not None and api not in POOLED_APIS:
        raise ConfigError("--batch-size applies to --api embeddings and --api rerank only")
    if api in POOLED_APIS:
        return PooledWorkload(
            api=api,
            batch=Fixed(value=args.batch_size or 1),
            input=Fixed(value=args.input_tokens or INPUT_TOKENS),
            seed=args.seed,
            text=TextSource(seed=args.seed, salt=salt),
        )
    return SyntheticChat(
        input_tokens=args.input_tokens or INPUT_TOKENS,
        output_tokens=args.output_tokens or OUTPUT_TOKENS,
        seed=args.seed,
        salt=salt,
    )


def resolve_extra(args: argparse.Namespace) -> dict[str, Any]:
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


def resolve_tokenizer(args: argparse.Namespace, workload: Workload | None = None) -> str | None:
    """What ``--tokenizer`` names: a tokenizer file (its absolute path, loaded once here so one that
    does not load is refused before anything is sent), "builtin", or None ("none"); not given, the
    workload spec's tokenizer file when it names one."""
    from loadgen.workload.tokenizer import HFTokenizer

    given = getattr(args, "tokenizer", None)
    if given is None:
        tok = getattr(getattr(workload, "text", None), "tokenizer", None)
        return str(tok.path.resolve()) if isinstance(tok, HFTokenizer) else None
    name = given.strip()
    if name.lower() in ("none", "builtin"):
        return None if name.lower() == "none" else "builtin"
    try:
        return str(HFTokenizer(name).path.resolve())
    except LoadgenError as e:
        raise ConfigError(f"--tokenizer: {e}") from None


def timeouts(args: argparse.Namespace) -> Timeouts:
    return Timeouts(args.connect_timeout, args.first_byte_timeout, args.idle_timeout, args.request_timeout)


def settings_from_args(args: argparse.Namespace, workload: Workload | None = None) -> RunSettings:
    """The run's settings from its flags and its workload (None: the flag-built chat).

    A trace workload (its own arrival times) is replayed whole, at its spec's speed, unless
    ``--duration`` / ``--requests`` cut it (``trace_settings``); a finite workload (a trace's
    sessions) sends each of its sessions once; any other, ``--duration`` 10 s (a closed loop:
    100 requests) when neither length is given."""
    trace = workload.offsets_ns() if workload is not None else None
    if workload is not None and trace is not None and args.concurrency is None:
        return trace_settings(args, workload, trace)
    arrival = resolve_arrival(args)
    if arrival.kind == "trace":
        name = workload.name if workload is not None else "synthetic-chat"
        raise ConfigError(
            f"--arrival trace: {name} has no arrival times of its own (only mooncake, azure and burstgpt "
            "traces do); give it --arrival poisson, constant or gamma:CV"
        )
    duration, requests = args.duration, args.requests
    if duration is None and requests is None:
        size = workload.size if workload is not None else None
        if size is not None:
            if size > MAX_REQUESTS:
                raise ConfigError(
                    f"the workload holds {size:,} sessions, more than a run's limit of {MAX_REQUESTS:,}; "
                    "cut it with --requests N or --duration S"
                )
            requests = size
        elif arrival.kind == "closed":
            requests = DEFAULT_CLOSED_REQUESTS
        else:
            duration = DEFAULT_DURATION_S
    return RunSettings(
        **shared_settings(args, workload),
        arrival=arrival,
        duration_s=duration,
        requests=requests,
        cooldown_s=args.cooldown,
    )


def trace_settings(args: argparse.Namespace, workload: Workload, trace: npt.NDArray[np.int64]) -> RunSettings:
    """A trace's replay: its own times (no --rate), whole unless --duration / --requests cut it,
    within a run's limits; run.json's arrival says ``trace`` and the speed."""
    from loadgen.client.trace_cut import check_trace_limits, cut_trace
    from loadgen.schedule import Arrival

    if args.rate is not None:
        raise ConfigError(
            f"--rate {args.rate:g}: workload {workload.name} is a trace that carries its own arrival times; "
            "leave --rate out (replay it faster or slower with --speed X, e.g. --speed 2 for twice as fast)"
        )
    given = getattr(args, "arrival", None)
    if given is not None and given.strip().lower() != "trace":
        raise ConfigError(
            f"--arrival {given}: workload {workload.name} is a trace that carries its own arrival times; "
            "leave --arrival out (or use --concurrency N to replay its requests closed loop)"
        )
    cut = cut_trace(trace, args.duration, args.requests)
    check_trace_limits(cut, warmup_s=args.warmup, cooldown_s=args.cooldown)
    speed = workload.describe().get("speed")
    return RunSettings(
        **shared_settings(args, workload),
        arrival=Arrival("trace", rate=cut.mean_rate, speed=float(speed) if speed is not None else None),
        duration_s=args.duration,
        requests=cut.replayed,
        cooldown_s=args.cooldown,
    )


def what_is_sent(args: argparse.Namespace, settings: RunSettings, workload: Workload) -> str | None:
    """The line that says how much of a finite workload the run sends (None: nothing to say):
    ``replaying 738 of 8,819 requests over 10.0 s at 1x speed (cut by --duration 10)``."""
    from loadgen.client.trace_cut import cut_trace

    trace = workload.offsets_ns()
    if trace is not None and settings.arrival.kind == "trace":
        return cut_trace(trace, args.duration, args.requests).line(settings.arrival.speed) + spec_selection(
            workload.describe(), len(trace)
        )
    size = workload.size
    if size is None or settings.requests is None:
        return None
    unit = "sessions" if load_unit_of(workload) == "sessions/s" else "requests"
    closed = " (closed loop: the trace's arrival times are not used)" if trace is not None else ""
    if args.duration is None and args.requests is None:
        return f"sending each of the workload's {size:,} {unit} once{closed}"
    return None


def spec_selection(described: dict[str, Any], selected: int) -> str:
    """``; the spec's window 600 s selects 1,482 of the file's 8,819 rows (--set window=null for all)``,
    when the spec selects fewer rows than the trace file holds; else nothing."""
    rows = described.get("rows")
    if not isinstance(rows, int) or rows <= selected:
        return ""
    parts, undo = [], []
    for name, key, unit, off in (
        ("start", "start_s", " s", "0"),
        ("window", "window_s", " s", "null"),
        ("max_requests", "max_requests", "", "null"),
    ):
        value = described.get(key)
        if isinstance(value, (int, float)) and (value or key != "start_s"):
            parts.append(f"{name} {value:g}{unit}")
            undo.append(f"--set {name}={off}")
    by = f"the spec's {', '.join(parts)}" if parts else "the spec"
    hint = f" ({' '.join(undo)} for all)" if undo else ""
    return f"; {by} selects {selected:,} of the file's {rows:,} rows{hint}"


def load_unit_of(workload: Workload) -> str:
    """``sessions/s`` when the workload's sessions have more than one turn, else ``req/s``."""
    from loadgen.analysis.sessions import load_unit

    return load_unit(workload.describe())


def arrival_label(arrival: Arrival, unit: str) -> str:
    """The arrival as the terminal shows it, in the load's unit: ``poisson @ 0.5 sessions/s``."""
    text = str(arrival)
    return text.replace(" req/s", f" {unit}") if unit != "req/s" and arrival.kind != "trace" else text


def shared_settings(args: argparse.Namespace, workload: Workload | None = None) -> dict[str, Any]:
    """The RunSettings fields that ``run`` and ``sweep`` take from the same flags (and the
    workload, whose spec may name the tokenizer)."""
    return {
        "endpoint": resolve_endpoint(args),
        "model": args.model,
        "api": args.api,
        "seed": args.seed,
        "warmup_s": args.warmup,
        "timeouts": timeouts(args),
        "ignore_eos": args.ignore_eos,
        "keep_text": args.keep_text,
        "max_inflight": args.max_inflight,
        "drain_s": args.drain,
        "lag_limit_ms": args.lag_limit_ms,
        "extra_body": resolve_extra(args),
        "workers": args.workers,
        "server_metrics": args.server_metrics,
        "per_chunk_usage": args.per_chunk_usage,
        "tokenizer": resolve_tokenizer(args, workload),
        "http": endpoint_options_of(args),
        "max_tokens_field": args.max_tokens_field,
        "preflight": args.preflight,
    }


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

    from loadgen.analysis.run_summary import summarize_run
    from loadgen.cli.live import LiveView
    from loadgen.client.run import execute, new_run_id

    out = Path(args.out) if args.out else Path("runs") / new_run_id()
    view = LiveView.for_run(settings, enabled=args.live, title=f"loadgen run: {label}")
    with view:
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
        )
    try:
        report = summarize_run(out, lag_limit_ms=settings.lag_limit_ms, slo=slo)
    except LoadgenError as e:
        if not result.interrupted:
            raise
        print(f"no report: {e}")  # stopped before anything could be summarised
    else:
        from loadgen.report.html import write_report
        from loadgen.report.terminal import print_run

        print_run(report)
        if getattr(args, "report", True):
            print(f"report: {write_report(out)}")
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
