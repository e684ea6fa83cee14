"""``--set KEY=VALUE``: override a workload spec's field from the command line.

One parser for every command that loads a workload (``run``, ``sweep``,
``workloads preview``), so a spec's help text (``--set path=my.jsonl``) is true
wherever a workload is given. A value is read as YAML, as the spec itself is:
``--set turns=4`` is the number 4, ``--set path=a.jsonl`` a string,
``--set input.mean=300`` a nested field, ``--set 'tags=[a, b]'`` a list.
"""

from __future__ import annotations

import argparse
from typing import Any

from loadgen.errors import ConfigError

__all__ = ["add_set_flag", "parse_sets", "parse_set_items"]


def add_set_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--set KEY=VALUE`` (repeatable; default none) to ``parser``; read it with ``parse_sets``."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a workload spec field, e.g. --set path=my.jsonl or --set input.mean=300 "
        "(repeatable; value read as YAML; default: none)",
    )


def parse_sets(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--set`` items of parsed ``args`` as ``load_workload``'s ``overrides``."""
    return parse_set_items(getattr(args, "set", None) or [])


def parse_set_items(items: list[str]) -> dict[str, Any]:
    """``["input.mean=300", "path=a.jsonl"]`` -> ``{"input.mean": 300, "path": "a.jsonl"}``.

    A later item wins over an earlier one with the same key. An item without ``=``, with
    an empty key or a value that is not YAML is a one-line ``ConfigError`` naming it.
    """
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: the value is not YAML ({' '.join(str(e).split())})") from None
    return out
