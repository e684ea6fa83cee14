"""``loadgen workloads list | show NAME | preview NAME``: look before you send.

``preview`` builds the first N sessions exactly as a run would (same seed, same
bytes) and prints what they hold: sessions and turns, prompt and answer lengths,
how much of each prompt an earlier request already carried (prefix reuse), and
for a trace its arrival rate and burstiness. Nothing is sent anywhere.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np
import orjson
import yaml
from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from ..session import Session, Turn
from ..workload import Workload, builtin_specs, find_spec, load_workload

__all__ = ["add_parser", "preview_stats"]

_PCTS = (50, 90, 99)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workloads", help="list, show and preview workload specs (sends nothing)",
                       description="Built-in workload specs, and what a spec's traffic looks like.")
    cmds = p.add_subparsers(dest="workloads_cmd", metavar="ACTION")
    ls = cmds.add_parser("list", help="built-in workload specs")
    ls.set_defaults(func=cmd_list)
    show = cmds.add_parser("show", help="print a spec (copy it, edit it, pass its path)")
    show.add_argument("name", metavar="NAME|PATH")
    show.set_defaults(func=cmd_show)
    pv = cmds.add_parser("preview", help="statistics of a workload's first sessions")
    pv.add_argument("name", metavar="NAME|PATH")
    pv.add_argument("--seed", type=int, default=0, help="workload seed (same seed, same traffic)")
    pv.add_argument("--n", type=int, default=200, metavar="N", help="sessions to build (default 200)")
    pv.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a spec field, e.g. --set input.mean=300 (repeatable)")
    pv.add_argument("--tokenizer", default=None, metavar="PATH", help="HF tokenizer.json to build text with")
    pv.add_argument("--json", action="store_true", help="print the statistics as JSON")
    pv.set_defaults(func=cmd_preview)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def parse_sets(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def cmd_list(args: argparse.Namespace) -> int:
    table = Table(title="built-in workloads", title_justify="left")
    for col in ("name", "kind", "description"):
        table.add_column(col)
    for name, path in builtin_specs().items():
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            doc = {}
        kind = str(doc.get("kind", "?")) + (f" ({doc['format']})" if "format" in doc else "")
        table.add_row(name, kind, str(doc.get("description", "")))
    Console().print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    path = find_spec(args.name)
    print(f"# {path}")
    print(path.read_text(encoding="utf-8"), end="")
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise ConfigError(f"--n {args.n}: must be >= 1")
    w = load_workload(args.name, seed=args.seed, tokenizer=args.tokenizer, overrides=parse_sets(args.set))
    stats = preview_stats(w, args.n)
    if args.json:
        print(orjson.dumps(stats, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
    else:
        render(stats, Console())
    return 0


# -- statistics ---------------------------------------------------------------------------


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
        from ..traces import gap_stats

        stats["arrivals"] = gap_stats(np.asarray(offsets))
    return stats


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


def render(stats: dict[str, Any], console: Console) -> None:
    d = stats["workload"]
    console.print(f"[bold]{d.get('name')}[/bold] ({d.get('kind')}"
                  f"{', ' + d['format'] if 'format' in d else ''}) seed {d.get('seed')}, "
                  f"tokenizer {d.get('tokenizer')}, {stats['sessions']} sessions, "
                  f"{stats['requests']} requests")
    t = Table(title="lengths", title_justify="left")
    t.add_column("")
    for c in ("mean", *(f"p{p}" for p in _PCTS), "max"):
        t.add_column(c, justify="right")
    for label, key in (("turns / session", "turns_per_session"), ("prompt tokens", "prompt_tokens"),
                       ("max_tokens", "max_tokens"), ("think s", "think_s")):
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
        console.print(f"arrivals: {a['requests']} over {a['duration_s']:.1f} s, "
                      f"{_fmt(a['rate_per_s'])} req/s, CV of gaps {_fmt(a['gap_cv'])} "
                      "(1 = Poisson, > 1 bursty)")
