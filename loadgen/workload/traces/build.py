"""A ``kind: trace`` spec into its workload: the one place that maps ``format:`` to a reader.

Formats (``format:``), one module each:

- ``mooncake``  JSONL with arrival times and hash-id blocks (prefix sharing);
- ``azure``     Azure LLM inference CSV: arrival times and lengths;
- ``burstgpt``  BurstGPT CSV, optionally filtered by model and log type;
- ``sharegpt``  real multi-turn conversation text, no timestamps;
- ``agentic``   coding-agent sessions with subagents, think times and blocks.

The timed formats (mooncake, azure, burstgpt) become a ``RequestTrace`` that
carries its own arrival times; sharegpt and agentic sessions arrive per the
arrival spec. An option that only some formats understand is an error on the
others rather than a silent no-op, so a spec never looks as if it did something
it did not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.specfile import Fields
from loadgen.workload.base import Base
from loadgen.workload.distributions import Fixed, parse_distribution
from loadgen.workload.traces.agentic import AgenticTrace, read_agentic
from loadgen.workload.traces.azure import read_azure
from loadgen.workload.traces.burstgpt import read_burstgpt
from loadgen.workload.traces.mooncake import read_mooncake
from loadgen.workload.traces.sharegpt import ShareGPTTrace, read_sharegpt
from loadgen.workload.traces.timed import Requests, RequestTrace, select

__all__ = ["FORMATS", "TIMED", "build_trace"]

FORMATS = ("mooncake", "azure", "burstgpt", "sharegpt", "agentic")
TIMED = ("mooncake", "azure", "burstgpt")

# Options that only make sense for some formats; elsewhere they are errors, not no-ops.
_APPLIES: dict[str, tuple[str, ...]] = {
    "speed": (*TIMED, "agentic"),
    "start": TIMED,
    "window": TIMED,
    "block_tokens": ("mooncake", "agentic"),
    "models": ("burstgpt",),
    "log_types": ("burstgpt",),
    "max_turns": ("sharegpt",),
    "think": ("sharegpt",),
    "max_think": ("agentic",),
    "max_context": ("agentic",),
}


def build_trace(f: Fields, common: dict[str, Any]) -> Base:
    """A trace-replay workload from the fields of a ``kind: trace`` spec."""
    fmt: str = f.string("format", choices=FORMATS)
    for key, fmts in _APPLIES.items():
        if f.has(key) and fmt not in fmts:
            raise f.error(key, f"does not apply to format {fmt} (only to {', '.join(fmts)})")
    path: Path = f.path("path")
    if not path.exists():
        raise f.error("path", f"no such file or folder: {path}")
    max_requests: int | None = f.number("max_requests", None, integer=True, ge=1)
    opts: dict[str, Any] = {
        "path": str(path),
        "output_tokens": f.number("output_tokens", None, integer=True, ge=1),
        "max_output": f.number("max_output", None, integer=True, ge=1),
    }
    if fmt in TIMED:
        return _timed(f, fmt, path, max_requests, common, opts)
    if fmt == "sharegpt":
        if path.is_dir():
            raise f.error("path", f"{path} is a folder; give a ShareGPT JSON file")
        convs, skipped = read_sharegpt(path)
        return ShareGPTTrace(
            **common,
            convs=tuple(convs[:max_requests]),
            skipped=skipped,
            max_turns=f.number("max_turns", None, integer=True, ge=1),
            think=parse_distribution(f, "think", integer=False, default=Fixed(value=0.0, integer=False)),
            **opts,
        )
    traces = read_agentic(path, f.number("block_tokens", None, integer=True, ge=1))
    return AgenticTrace(
        **common,
        traces=tuple(traces[:max_requests]),
        speed=float(f.number("speed", 1.0, gt=0)),
        max_think_s=f.number("max_think", None, ge=0),
        max_context=f.number("max_context", None, integer=True, ge=1),
        **opts,
    )


def _timed(
    f: Fields, fmt: str, path: Path, max_requests: int | None, common: dict[str, Any], opts: dict[str, Any]
) -> RequestTrace:
    speed = float(f.number("speed", 1.0, gt=0))
    start = float(f.number("start", 0.0, ge=0))
    window = f.number("window", None, gt=0)
    table: Requests
    if fmt == "mooncake":
        table = read_mooncake(path)
        opts["block_tokens"] = f.number("block_tokens", 512, integer=True, ge=1)
    elif fmt == "azure":
        table = read_azure(path)
    else:
        table = read_burstgpt(path, f.strings("models", None), f.strings("log_types", None))
    idx = select(table.t_s, start, window, max_requests)
    if not len(idx):
        raise f.error("start", f"no request of {path} lies in the chosen start/window")
    return RequestTrace(
        **common,
        format=fmt,
        table=table,
        idx=idx,
        speed=speed,
        start_s=start,
        window_s=None if window is None else float(window),
        max_requests=max_requests,
        **opts,
    )
