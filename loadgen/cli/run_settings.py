"""From ``loadgen run``'s (and ``sweep``'s) flags to what the run sends: its workload and ``RunSettings``.

Every value is checked before anything is started or sent: a contradiction (a stage flag
without a pipeline, a trace given a rate, a warm-up longer than the run) is one line naming the
flags, exit 2.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from loadgen.cli.endpoint_flags import endpoint_options_of
from loadgen.cli.overrides import parse_sets
from loadgen.cli.run_flags import INPUT_TOKENS, OUTPUT_TOKENS
from loadgen.cli.stage_flags import stages_of
from loadgen.client.config import Timeouts
from loadgen.client.settings import (
    DEFAULT_CLOSED_REQUESTS,
    DEFAULT_DURATION_S,
    MAX_REQUESTS,
    RunSettings,
)
from loadgen.errors import ConfigError, LoadgenError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from loadgen.schedule import Arrival
    from loadgen.workload.base import Workload


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
    urls, models = stages_of(args)
    if (urls or models) and not args.workload:
        raise ConfigError(
            f"--{'endpoint' if urls else 'model'}-{[*urls, *models][0]} applies to --workload rag-pipeline only"
        )
    if args.workload:
        w = load_workload(args.workload, seed=args.seed, salt=salt, overrides=overrides)
        kind = w.describe().get("kind")
        if (urls or models) and kind != "rag-pipeline":
            flag = f"--{'endpoint' if urls else 'model'}-{[*urls, *models][0]}"
            raise ConfigError(f"{flag}: workload {args.workload} is {kind}; stage endpoints apply to rag-pipeline only")
        if kind == "rag-pipeline" and api in POOLED_APIS:
            raise ConfigError(
                f"--api {api}: a rag-pipeline generates its answers with --api chat, completions or responses "
                "(its embed and rerank stages go to /embeddings and /rerank by themselves)"
            )
        if kind != "rag-pipeline" and (kind in POOLED_APIS or api in POOLED_APIS) and kind != api:
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
    stage_endpoints, stage_models = stages_of(args)
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
        "transport": args.transport,
        "stage_endpoints": stage_endpoints,
        "stage_models": stage_models,
    }
