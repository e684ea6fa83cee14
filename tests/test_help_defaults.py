"""Every ``--help`` states each option's default, with its unit: ``(default: 30 s)``.

The test walks every subcommand's parser as ``loadgen`` builds it (``cli.main.build_parser``)
and reads each option's help as argparse prints it (``%(default)s`` expanded):

- an option with a default value says ``(default: VALUE ...)``, the value as the parser holds
  it (``60``, ``60.0`` and ``10,000`` all read as theirs), and a number is followed by its
  unit (``(default: 60 s)``, ``(default: 10000 requests)``) unless it has none (a seed, a port);
- an option without one (``None``, or an empty string) says what happens when it is not
  given (``(default: the first model /v1/models lists)``, or "without it, ..."), unless it
  is required;
- flags (store_true / store_false) and repeatable options are left alone: off, and none.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from loadgen.cli.main import build_parser

UNITLESS = {"seed", "port"}  # numbers that are their own unit (also as the last word: master_port)
FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction, argparse._CountAction)
SKIPPED = (argparse._HelpAction, argparse._VersionAction, argparse._AppendAction, argparse._ExtendAction, *FLAGS)


def options(parser: argparse.ArgumentParser | None = None) -> Iterator[tuple[str, argparse.Action]]:
    """(``"sweep --drain"``, its action) for every option of every (sub)command."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from options(sub)
        elif action.option_strings and action.help != argparse.SUPPRESS and not isinstance(action, SKIPPED):
            yield f"{parser.prog.removeprefix('loadgen ')} {action.option_strings[-1]}", action


def help_text(action: argparse.Action) -> str:
    """The help as argparse prints it (``%(default)s``, ``%(choices)s`` ... expanded)."""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return (action.help or "") % {**params, "prog": "loadgen"}


def renderings(value: object) -> list[str]:
    """How a default may be written: 60.0 as 60.0 or 60; 10000 as 10000 or 10,000."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [str(value)]
    out = [str(value), f"{value:g}", f"{value:,}"]
    if isinstance(value, float) and value.is_integer():
        out += [str(int(value)), f"{int(value):,}"]
    return out


def problem(action: argparse.Action) -> str | None:
    """What the option's help fails to say, or None."""
    text, default = help_text(action), action.default
    if default is None or default == "":
        said = re.search(r"\b(default|without)\b", text, re.I)
        return None if said or action.required else "says nothing of what happens when not given"
    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    for shown in renderings(default):
        for m in re.finditer(re.escape(f"(default: {shown}"), text):
            after = text[m.end() :]
            if not numeric and after[:1] in (")", ";", ",", " "):
                return None
            if numeric and (action.dest.rsplit("_", 1)[-1] in UNITLESS or re.match(r" [^\W\d]|%| ?\$", after)):
                return None
            if numeric and after[:1] == ")":
                return f"states the default {shown} without its unit"
    return f"does not state its default {renderings(default)[-1]} as '(default: VALUE UNIT)'"


# Options of others' files (run_cmd, sweep_cmd, gate_cmd, compare_cmd, check_cmd, report_cmd), as of
# this wave: the help text each needs is in the progress helper's report. Empty once applied.

ALL = list(options())


def test_there_are_options_to_check() -> None:
    names = {name for name, _ in ALL}
    assert {"run --drain", "sweep --drain", "sim --port", "workloads preview --n"} <= names


@pytest.mark.parametrize(
    "name",
    [name for name, _ in ALL],
)
def test_the_help_states_the_default_and_its_unit(name: str) -> None:
    action = dict(ALL)[name]
    assert problem(action) is None, f"{name}: {problem(action)}: {help_text(action)!r}"


@pytest.mark.parametrize(
    ("help", "default", "ok"),
    [
        ("longest wait (default: %(default)g s)", 600.0, True),
        ("longest wait (default: 600 s)", 600.0, True),
        ("longest wait (default 600 s)", 600.0, False),  # a colon, as everywhere
        ("longest wait (default: 600)", 600.0, False),  # no unit
        ("longest wait", 600.0, False),
        ("cap (default: 10,000 requests)", 10_000, True),
        ("bf16 | fp8 (default: bf16)", "bf16", True),
        ("allowed (default: 5%%)", "5%", True),
        ("run folder (default: runs/<run id>)", None, True),
        ("run folder", None, False),
        ("the tokenizer; without it chunks are counted", None, True),
    ],
)
def test_the_rule_itself(help: str, default: object, ok: bool) -> None:
    action = argparse.Action(["--x"], dest="x", default=default, help=help)
    assert (problem(action) is None) == ok
