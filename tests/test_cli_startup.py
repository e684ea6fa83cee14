"""``loadgen --help`` answers at once: building the parsers imports no heavy library.

Each case runs the help in a fresh interpreter (the test process itself has
imported everything) and then lists which of the heavy libraries got imported.
The commands import them in the functions that run them.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys

import pytest

from loadgen.cli.main import build_parser

HEAVY = ("scipy", "matplotlib", "aiohttp", "pyarrow", "numpy", "prometheus_client")

SNIPPET = """
import runpy, sys
{before}
sys.argv = ["loadgen", *{argv!r}, "--help"]
try:
    runpy.run_module("loadgen", run_name="__main__")
except SystemExit as e:
    assert e.code in (0, None), e.code
print("heavy:", sorted(m for m in {heavy!r} if m in sys.modules))
"""


def _commands() -> list[list[str]]:
    """Every command and sub-action the parser knows (so a new command is covered too)."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    out: list[list[str]] = [[]]
    for name, parser in sub.choices.items():
        out.append([name])
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        out += [[name, action] for a in actions for action in a.choices]
    return out


def _imported_after_help(argv: list[str], before: str = "") -> tuple[list[str], str]:
    code = SNIPPET.format(argv=argv, heavy=HEAVY, before=before)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and lines[-1].startswith("heavy: "), done.stdout
    return ast.literal_eval(lines[-1].removeprefix("heavy: ")), done.stdout


def test_every_command_is_covered() -> None:
    names = {tuple(a) for a in _commands()}
    assert {("run",), ("sweep",), ("gate",), ("check",), ("workloads", "preview")} <= names


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a) or "loadgen")
def test_help_imports_no_heavy_library(argv: list[str]) -> None:
    heavy, out = _imported_after_help(argv)
    assert "usage: loadgen" in out
    assert heavy == [], f"`loadgen {' '.join(argv)} --help` imported {heavy}"


def test_the_check_can_fail() -> None:
    """The same check sees a heavy import when there is one (here: the gate's statistics)."""
    heavy, _ = _imported_after_help(["gate"], before="import loadgen.conformance.gate")
    assert {"scipy", "pyarrow", "numpy"} <= set(heavy)


def test_gate_help_names_the_builtin_profiles() -> None:
    """The help text lists the profiles without loadgen.conformance.slo; both must find the same ones."""
    from loadgen.cli.gate_cmd import profile_names
    from loadgen.conformance.slo import builtin_profiles

    assert profile_names() == list(builtin_profiles())
    assert profile_names()
