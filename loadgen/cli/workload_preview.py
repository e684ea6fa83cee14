"""What a workload's first sessions hold, for ``loadgen workloads preview``: a pure function of the workload.

Sessions and turns, prompt and answer lengths, how much of each prompt an
earlier request already carried (prefix reuse), and for a trace its arrival
rate and burstiness; ``render`` prints them as tables. Apart from the command's
parser so that ``loadgen workloads --help`` loads no numpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from loadgen.workload.base import Workload
from loadgen.workload.session import Session, Turn

__all__ = ["preview_stats", "render"]

_PCTS = (50, 90, 99)


def _requests(s: Session) -> list[tuple[Turn, int]]:
    """Every request of a session (children first, as they are sent), with the tokens
    of its prompt an earlier request of the same context already carried."""
    out: list[tuple[Turn, int]] = []
    prev = 0
    for k, t in enumerate(s.turns):
        for c in t.children:
            out += _requests(c)
        out.append((t, prev if k else 0))
        prev = t.prompt_tokens + t.max_tokens
    return out


def _summary(x: np.ndarray) -> dict[str, float]:
    if not len(x):
        return {}
    d = {"mean": float(x.mean())}
    d.update({f"p{p}": float(np.percentile(x, p)) for p in _PCTS})
    d["max"] = float(x.max())
    return d


def _histogram(x: np.ndarray, bins: int = 12) -> list[tuple[float, float, int]]:
    """Log-spaced bins (lengths span decades)."""
    if not len(x):
        return []
    lo, hi = max(float(x.min()), 1.0), max(float(x.max()), 1.0)
    if hi <= lo:
        return [(lo, hi, len(x))]
    edges = np.geomspace(lo, hi * (1 + 1e-9), bins + 1)
    counts, _ = np.histogram(np.clip(x, lo, None), bins=edges)
    return [(float(a), float(b), int(c)) for a, b, c in zip(edges[:-1], edges[1:], counts, strict=True)]


def preview_stats(w: Workload, n: int) -> dict[str, Any]:
    """What the first ``n`` sessions hold; a pure function of the workload."""
    size = w.size
    n = min(n, size) if size else n
    sessions = [w.session(i) for i in range(n)]
    reqs = [r for s in sessions for r in _requests(s)]
    prompts = np.asarray([t.prompt_tokens for t, _ in reqs], dtype=np.float64)
    outs = np.asarray([t.max_tokens for t, _ in reqs], dtype=np.float64)
    within = float(sum(r for _, r in reqs))
    thinks = np.asarray([t.think_ns / 1e9 for s in sessions for t in s.turns[1:]], dtype=np.float64)
    systems = [s.system for s in sessions if s.system]
    total = float(prompts.sum()) or 1.0
    stats: dict[str, Any] = {
        "workload": w.describe(),
        "sessions": n,
        "distinct_sessions": size,
        "requests": len(reqs),
        "turns_per_session": _summary(np.asarray([len(s.turns) for s in sessions], dtype=np.float64)),
        "children_per_session": float(np.mean([sum(len(t.children) for t in s.turns) for s in sessions])),
        "prompt_tokens": _summary(prompts),
        "prompt_histogram": _histogram(prompts),
        "max_tokens": _summary(outs),
        "think_s": _summary(thinks),
        "reuse": {
            "within_session": within / total,
            "shared_system_prompt": len(set(systems)) == 1 and len(systems) == n,
        },
    }
    offsets = w.offsets_ns()
    if offsets is not None and len(offsets):
        from loadgen.workload.traces.timed import gap_stats

        stats["arrivals"] = gap_stats(np.asarray(offsets))
    return stats


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


def render(stats: dict[str, Any], console: Console) -> None:
    d = stats["workload"]
    console.print(
        f"[bold]{d.get('name')}[/bold] ({d.get('kind')}"
        f"{', ' + d['format'] if 'format' in d else ''}) seed {d.get('seed')}, "
        f"tokenizer {d.get('tokenizer')}, {stats['sessions']} sessions, "
        f"{stats['requests']} requests"
    )
    t = Table(title="lengths", title_justify="left")
    t.add_column("")
    for c in ("mean", *(f"p{p}" for p in _PCTS), "max"):
        t.add_column(c, justify="right")
    for label, key in (
        ("turns / session", "turns_per_session"),
        ("prompt tokens", "prompt_tokens"),
        ("max_tokens", "max_tokens"),
        ("think s", "think_s"),
    ):
        s = stats[key]
        if s:
            t.add_row(label, *(_fmt(s.get(c)) for c in ("mean", *(f"p{p}" for p in _PCTS), "max")))
    console.print(t)
    hist = stats["prompt_histogram"]
    if hist:
        h = Table(title="prompt tokens", title_justify="left")
        h.add_column("from", justify="right")
        h.add_column("to", justify="right")
        h.add_column("requests", justify="right")
        h.add_column("")
        top = max(c for _, _, c in hist) or 1
        for a, b, c in hist:
            h.add_row(_fmt(a), _fmt(b), str(c), "█" * round(30 * c / top))
        console.print(h)
    r = Table(title="prefix reuse", title_justify="left")
    r.add_column("")
    r.add_column("value", justify="right")
    r.add_row("prompt tokens carried by an earlier turn", f"{stats['reuse']['within_session']:.1%}")
    r.add_row("children per session", _fmt(stats["children_per_session"]))
    r.add_row("one system prompt shared by all", "yes" if stats["reuse"]["shared_system_prompt"] else "no")
    for k, v in (d.get("reuse") or {}).items():
        label = "over the first N requests" if k == "requests" else k.replace("_", " ")
        r.add_row(label, f"{v:.1%}" if isinstance(v, float) else str(v))
    for k in ("context_shrinks", "subagents", "cut_by_max_context", "dropped_trailing_subagents"):
        if isinstance(d.get(k), int):
            r.add_row(k.replace("_", " "), str(d[k]))
    console.print(r)
    a = stats.get("arrivals")
    if a:
        console.print(
            f"arrivals: {a['requests']} over {a['duration_s']:.1f} s, "
            f"{_fmt(a['rate_per_s'])} req/s, CV of gaps {_fmt(a['gap_cv'])} "
            "(1 = Poisson, > 1 bursty)"
        )
