"""The choices a bare ``loadgen sweep`` makes for the user, and what it says about them.

Without ``--slo`` it judges by the ``interactive-chat`` profile; without
``--price-per-gpu-hour`` it prices tokens at an example price, labelled as one wherever
it shows (the price's label, and ``price_is_example`` in run.json); without
``--point-duration`` it sizes each point (``sweep.sizing``) and starts its search at the
lowest rate a sized point fills within its cap. ``defaults_note`` says so before the
sweep, ``sizing_note`` after it which points a cap cut short.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadgen.sweep.run import SweepSettings
    from loadgen.sweep.search import Step
    from loadgen.sweep.sizing import Sizing

__all__ = [
    "DEFAULT_SLO",
    "EXAMPLE_PRICE",
    "EXAMPLE_PRICE_LABEL",
    "UNSIZED_START_RATE",
    "slo_choice",
    "sizing_from_args",
    "start_rate",
    "prices_from_args",
    "defaults_note",
    "sizing_note",
]

DEFAULT_SLO = "interactive-chat"  # the SLO profile a sweep judges by when no --slo is given
EXAMPLE_PRICE = 2.5  # $ per GPU-hour, only to show $/M tokens when no --price-per-gpu-hour is given
# labelled so it is never taken for a real price; the terminal and the report say how to give one
EXAMPLE_PRICE_LABEL = f"example price ${EXAMPLE_PRICE:g}/GPU-h"
UNSIZED_START_RATE = 2.0  # --auto's first rate with a fixed --point-duration


def slo_choice(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(the --slo text to judge by, whether it is the default): none -> (None, False)."""
    if args.slo is None:
        return DEFAULT_SLO, True
    if args.slo.strip().lower() == "none":
        return None, False
    return args.slo, False


def sizing_from_args(args: argparse.Namespace, target_pct: float | None) -> Sizing | None:
    """The point sizing, or None when --point-duration fixes every window."""
    from loadgen.sweep.sizing import Sizing, samples_needed

    if args.point_duration is not None:
        return None
    return Sizing(
        samples=samples_needed(0.95, target_pct),
        min_s=args.min_point_duration,
        max_point_s=args.max_point_duration,
        max_total_s=args.max_sweep_duration,
    )


def start_rate(args: argparse.Namespace, sizing: Sizing | None, cv: float) -> float:
    """--start-rate, else the lowest rate a sized point fills within its cap (rounded up to
    a round number), never above --max-rate."""
    from loadgen.sweep.sizing import nice_rate_at_least

    if args.start_rate is not None:
        return float(args.start_rate)
    start = UNSIZED_START_RATE if sizing is None else nice_rate_at_least(sizing.lowest_rate(cv))
    return min(start, float(args.max_rate))


def prices_from_args(args: argparse.Namespace) -> tuple[dict[str, float], bool]:
    """(the prices, whether they are the labelled example)."""
    from loadgen.analysis.pareto import parse_prices

    if args.price_per_gpu_hour is None:
        return {EXAMPLE_PRICE_LABEL: EXAMPLE_PRICE}, True
    return parse_prices(args.price_per_gpu_hour), False


def defaults_note(settings: SweepSettings) -> list[str]:
    """Lines printed before the sweep: the SLO, GPUs and price it chose for the user."""
    out: list[str] = []
    if settings.slo_is_default and settings.slo is not None:
        s = settings.slo
        bounds = ", ".join(
            f"{name} <= {v:g} ms" for name, v in (("TTFT", s.ttft_ms), ("TPOT", s.tpot_ms), ("E2E", s.e2e_ms)) if v
        )
        out.append(
            f"SLO: the default profile {settings.slo_name} (p99 {bounds}; "
            f"{settings.plan.auto.target_pct:g}% attainment); --slo PROFILE for another, --slo none for none"
        )
    elif settings.slo is None and settings.plan.mode == "auto":
        out.append("(--slo none: the search stops after saturation; give --slo PROFILE for capacity at SLO)")
    if settings.price_is_example:
        gpus = f"x {settings.gpus:g} GPU" if settings.gpus else "for the whole endpoint (no --gpus)"
        price = next(iter(settings.prices.values()))
        out.append(
            f"$/M tokens at an example price: ${price:g} per GPU-hour {gpus} "
            "(example price: pass --price-per-gpu-hour with yours)"
        )
    return out


def sizing_note(sizing: Sizing | None, steps: list[Step]) -> str | None:
    """After a sized sweep: whether every point held its samples, and which ones a cap cut short."""
    if sizing is None or not steps:
        return None
    capped = [s for s in steps if s.capped]
    if not capped:
        return (
            f"sizing: every point ran until its window held the {sizing.samples} requests a bounded p99 needs "
            f"({sizing.min_s:g}-{sizing.max_point_s:g} s each)"
        )
    cut = []
    for s in capped:
        why = f"--max-point-duration {sizing.max_point_s:g} s" if s.capped == "point" else "--max-sweep-duration"
        needed = s.needed_s
        need = f"needed {needed:.0f} s" if needed is not None and math.isfinite(needed) else "its rate was not known"
        a = s.arrival
        load = f"{a.rate:g} req/s" if a.rate is not None else f"{a.concurrency} users"
        cut.append(f"{load} ran {s.duration_s:g} s ({need}; cut by {why})")
    return (
        f"sizing: {len(capped)} of {len(steps)} points hit a cap before holding {sizing.samples} requests, "
        f"so their p99s may be open intervals: {'; '.join(cut)}"
    )
