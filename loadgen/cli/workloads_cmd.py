"""``loadgen workloads list | show NAME | preview NAME``: look before you send.

``preview`` builds the first N sessions exactly as a run would (same seed, same
bytes) and prints what they hold (``workload_preview``). Nothing is sent anywhere.
"""

from __future__ import annotations

import argparse

from loadgen.cli.flags import bounded_int
from loadgen.cli.overrides import add_set_flag, parse_sets
from loadgen.client.settings import MAX_SEED

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "workloads",
        help="list, show and preview workload specs (sends nothing)",
        description="Built-in workload specs, and what a spec's traffic looks like.",
    )
    cmds = p.add_subparsers(dest="workloads_cmd", metavar="ACTION")
    ls = cmds.add_parser("list", help="built-in workload specs")
    ls.set_defaults(func=cmd_list)
    show = cmds.add_parser("show", help="print a spec (copy it, edit it, pass its path)")
    show.add_argument("name", metavar="NAME|PATH")
    show.set_defaults(func=cmd_show)
    pv = cmds.add_parser("preview", help="statistics of a workload's first sessions")
    pv.add_argument("name", metavar="NAME|PATH")
    pv.add_argument(
        "--seed",
        type=bounded_int(0, MAX_SEED),
        default=0,
        help="workload seed: same seed, same traffic (default: %(default)s)",
    )
    pv.add_argument(
        "--n",
        type=bounded_int(1, 1_000_000),
        default=200,
        metavar="N",
        help="sessions to build (default: %(default)s sessions)",
    )
    add_set_flag(pv)
    pv.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="HF tokenizer.json to build text with (default: the spec's tokens.tokenizer, else the built-in one)",
    )
    pv.add_argument("--json", action="store_true", help="print the statistics as JSON")
    pv.set_defaults(func=cmd_preview)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def cmd_list(args: argparse.Namespace) -> int:
    import yaml
    from rich.console import Console
    from rich.table import Table

    from loadgen.workload.load import builtin_specs

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
    from loadgen.specfile import read_text
    from loadgen.workload.load import find_spec

    path = find_spec(args.name)
    text = read_text(path)  # a file that is not UTF-8 is a SpecError naming it
    print(f"# {path}")
    print(text, end="")
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console

    from loadgen.cli.workload_preview import preview_stats, render
    from loadgen.workload.load import load_workload

    w = load_workload(args.name, seed=args.seed, tokenizer=args.tokenizer, overrides=parse_sets(args))
    stats = preview_stats(w, args.n)
    if args.json:
        print(orjson.dumps(stats, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
    else:
        render(stats, Console())
    return 0
