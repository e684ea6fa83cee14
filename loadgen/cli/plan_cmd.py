"""``loadgen plan``: rank deployments by cost per million tokens at an SLO, simulated in virtual time.

Given a workload, an SLO, a pricing model and configurations (``--configs FILE`` and/or
``--config gpu=h100,tp=4,...``), every configuration's capacity at the SLO is searched in
virtual time, priced, and ranked (``loadgen.plan``); the report is ``plan.html`` and
``plan.json`` in ``--out``, and a table in the terminal. ``--input-tokens 1k,8k,32k``,
``--output-tokens`` and ``--prefix-reuse`` add capacity against each value (k = 1024).
Nothing is sent anywhere: no endpoint, no socket.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen.cli.flags import bounded_int, finite_float
from loadgen.errors import ConfigError

if TYPE_CHECKING:
    from loadgen.analysis.metrics import SLO
    from loadgen.plan.config import Deployment
    from loadgen.workload.base import Workload

__all__ = ["add_parser", "cmd_plan", "parse_axis"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="rank GPU/model/TP configurations by $/M tokens at an SLO (virtual time; sends nothing)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workload", default="chat", help="workload spec name or YAML path (default: %(default)s)")
    p.add_argument(
        "--model", default="llama-3.1-70b", help="model profile of configs that name none (default: %(default)s)"
    )
    p.add_argument(
        "--configs",
        default=None,
        metavar="FILE",
        help="YAML file with a configs: list (default: none; then --config)",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="K=V,...",
        help="a configuration: gpu=h100,tp=4,dtype=fp8,replicas=2,max_batch=256; disaggregated: "
        "prefills=1,prefill_tp=2,decodes=1,kv_gb_s=50; speculative: spec_tokens=3,spec_accept=0.7 (repeatable)",
    )
    p.add_argument(
        "--slo", default="interactive-chat", help="SLO profile or inline ttft=200,tpot=30 (default: %(default)s)"
    )
    p.add_argument(
        "--slo-bounds",
        default="",
        metavar="ttft,tpot,e2e",
        help="judge by these of the SLO's per-request bounds only (default: all it has)",
    )
    p.add_argument(
        "--slo-target",
        type=finite_float(0, 100, above=True, unit=" %"),
        default=None,
        help="attainment %% that counts as meeting the SLO (default: the profile's, else 99)",
    )
    p.add_argument(
        "--pricing",
        default="rental:on-demand",
        metavar="FILE[:MODEL]",
        help="price file and model (default: %(default)s)",
    )
    p.add_argument(
        "--price-ratio",
        type=finite_float(0, 1e3, above=True),
        default=4.0,
        help="output price / input price, to split $/M between them (default: %(default)g x)",
    )
    p.add_argument(
        "--load",
        choices=("concurrency", "rate"),
        default=None,
        help="the load searched (default: concurrency for multi-turn workloads such as agentic, else rate)",
    )
    p.add_argument(
        "--start",
        type=finite_float(0, 1e6, above=True),
        default=None,
        help="first load tried (default: 4 sessions, or 1 arrival/s)",
    )
    p.add_argument(
        "--point-duration",
        type=finite_float(1, 86400),
        default=60.0,
        help="virtual time measured (default: %(default)g s)",
    )
    p.add_argument(
        "--warmup", type=finite_float(0, 86400), default=20.0, help="virtual warm-up (default: %(default)g s)"
    )
    p.add_argument("--drain", type=finite_float(0, 86400), default=30.0, help="virtual drain (default: %(default)g s)")
    p.add_argument(
        "--seed", type=bounded_int(0, 2**64 - 1), default=1, help="workload and arrivals (default: %(default)s)"
    )
    p.add_argument(
        "--min-requests",
        type=bounded_int(0, 10_000_000),
        default=250,
        help="a point with fewer requests in its window runs again, longer (default: %(default)s requests)",
    )
    p.add_argument(
        "--max-points",
        type=bounded_int(1, 1000),
        default=12,
        help="per configuration, at most (default: %(default)s points)",
    )
    p.add_argument(
        "--input-tokens",
        default="",
        metavar="1k,8k,32k",
        help="axis: prompt lengths, chat-like workloads (default: none)",
    )
    p.add_argument("--output-tokens", default="", metavar="128,1k", help="axis: answer lengths (default: none)")
    p.add_argument(
        "--prefix-reuse",
        default="",
        metavar="0,0.5,0.9",
        help="axis: share of each prompt shared by all (default: none)",
    )
    p.add_argument("--out", default="plan", metavar="DIR", help="report folder (default: %(default)s)")
    p.set_defaults(func=cmd_plan)


def parse_axis(text: str, flag: str, *, fraction: bool = False) -> list[float]:
    """``1k,8k,32k`` -> [1024, 8192, 32768]; fractions in [0, 1) for --prefix-reuse."""
    out: list[float] = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        scale = 1024.0 if part.endswith("k") and not fraction else 1.0
        try:
            v = float(part.removesuffix("k")) * scale if scale != 1.0 else float(part)
        except ValueError:
            raise ConfigError(f"{flag} {text!r}: {part!r} is not a number") from None
        if fraction and not 0 <= v < 1:
            raise ConfigError(f"{flag} {text!r}: {part} must be a share in [0, 1)")
        if not fraction and (v < 1 or v != int(v)):
            raise ConfigError(f"{flag} {text!r}: {part} must be a whole number of tokens >= 1")
        out.append(v)
    return out


def _slo(args: argparse.Namespace) -> tuple[SLO, str, float]:
    from dataclasses import replace

    from loadgen.cli.sweep_cmd import resolve_slo

    slo, name, target = resolve_slo(args.slo)
    if slo is None:
        raise ConfigError("--slo: a plan needs per-request bounds to judge capacity at")
    if args.slo_bounds:
        keep = {b.strip().lower() for b in args.slo_bounds.split(",") if b.strip()}
        bad = keep - {"ttft", "tpot", "e2e"}
        if bad:
            raise ConfigError(f"--slo-bounds {args.slo_bounds!r}: {sorted(bad)[0]!r} is not ttft, tpot or e2e")
        slo = replace(slo, **{f"{k}_ms": None for k in ("ttft", "tpot", "e2e") if k not in keep})
        if all(getattr(slo, f"{k}_ms") is None for k in ("ttft", "tpot", "e2e")):
            raise ConfigError(f"--slo-bounds {args.slo_bounds!r}: the SLO {name} has none of these bounds")
    text = f"{name} ({slo})"
    pct = args.slo_target if args.slo_target is not None else (target if target is not None else 99.0)
    return slo, text, float(pct)


def _deployments(args: argparse.Namespace) -> list[Deployment]:
    from loadgen.plan.config import load_configs, parse_config_flag

    out = load_configs(Path(args.configs), args.model) if args.configs else []
    out += [parse_config_flag(c, args.model) for c in args.config]
    if not out:
        raise ConfigError("loadgen plan: give configurations with --configs FILE and/or --config gpu=...,tp=...")
    labels = [d.label for d in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"two configurations have the same label: {labels} (give one a name=)")
    for d in out:
        d.check()
    return out


def _workload_maker(args: argparse.Namespace, inputs: list[float]) -> Any:
    from loadgen.workload.load import load_workload

    def make(axis: dict[str, Any]) -> Workload:
        overrides: dict[str, Any] = {}
        if "input_tokens" in axis:
            overrides["input_tokens"] = int(axis["input_tokens"])
        if "output_tokens" in axis:
            overrides["output_tokens"] = int(axis["output_tokens"])
        if "prefix_reuse" in axis:  # the shared part is the system prompt, the rest the message
            length = int(inputs[0]) if inputs else 1024
            shared = int(round(axis["prefix_reuse"] * length))
            overrides.update(system=shared, input_tokens=max(1, length - shared))
        return load_workload(args.workload, seed=args.seed, overrides=overrides or None)

    return make


def cmd_plan(args: argparse.Namespace) -> int:
    from loadgen.plan.figures import SearchSettings
    from loadgen.plan.prices import resolve_pricing
    from loadgen.plan.run import run_plan
    from loadgen.report.plan_view import PlanHeader, print_plan, write_plan

    slo, slo_text, target = _slo(args)
    pricing = resolve_pricing(args.pricing)
    deployments = _deployments(args)
    inputs = parse_axis(args.input_tokens, "--input-tokens")
    axes = {
        "input_tokens": inputs,
        "output_tokens": parse_axis(args.output_tokens, "--output-tokens"),
        "prefix_reuse": parse_axis(args.prefix_reuse, "--prefix-reuse", fraction=True),
    }
    make = _workload_maker(args, inputs)
    probe = make({})  # the workload (and each axis' override) fails here, before any simulation
    for axis, values in axes.items():
        for v in values[:1]:
            make({axis: v})
    sessions = len(probe.session(0).turns) > 1  # multi-turn: sized by sessions in flight
    load = args.load or ("concurrency" if sessions else "rate")
    start = args.start if args.start is not None else (4.0 if load == "concurrency" else 1.0)
    cfg = SearchSettings(
        slo=slo,
        target_pct=target,
        load=load,
        start=start,
        duration_s=args.point_duration,
        warmup_s=args.warmup,
        drain_s=args.drain,
        seed=args.seed,
        min_requests=args.min_requests,
        max_points=args.max_points,
    )
    header = PlanHeader(probe.name, slo_text, pricing, cfg, args.price_ratio)
    print(f"planning {len(deployments)} configurations of {args.workload} in virtual time ...", flush=True)
    result = run_plan(
        deployments, make, cfg, pricing, price_ratio=args.price_ratio, axes={k: v for k, v in axes.items() if v}
    )
    html = write_plan(Path(args.out), result, header)
    print_plan(result, header, html)
    return 0
