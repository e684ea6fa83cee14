"""The argparse types every numeric flag uses, and the parser whose errors are one line.

``finite_float`` and ``bounded_int`` reject NaN, infinity and out-of-range values as
the command line is parsed, so a typo never reaches a run; the library checks the
same values again when its config objects are built (``client.settings``). Every
error, argparse's included, is one line on stderr and exit code 2::

    loadgen: error: argument --duration: 'nan' is not a finite number

A value may start with a dash: ``--rates -1,2`` is read as ``--rates=-1,2`` (and then
refused for its -1), where plain argparse takes ``-1,2`` for an unknown option and
says "expected one argument". No loadgen option is a dash and a digit, so a token
that is one (``-1``, ``-.5``, ``-1,2``, ``-2:8:x2``) after ``--flag`` is that flag's value.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

__all__ = ["Parser", "attach_dash_values", "finite_float", "bounded_int", "error_line", "PORT"]


def error_line(message: str) -> str:
    """The one line every user error is printed as (newlines in ``message`` become '; ')."""
    text = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    return f"loadgen: error: {text or 'unknown error'}"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser (its sub-parsers are made of the same class) whose errors are one line:
    ``loadgen: error: <what argparse says> (see 'loadgen run --help')`` and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, error_line(f"{message} (see '{self.prog} --help')") + "\n")

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(attach_dash_values(argv), namespace)


_DASH_VALUE = re.compile(r"-\.?\d")  # -1, -.5, -1,2, -2:8:x2: a value, never a loadgen option


def attach_dash_values(argv: list[str]) -> list[str]:
    """``["--rates", "-1,2"]`` -> ``["--rates=-1,2"]``: a token that starts with a dash and
    a digit, after a ``--flag`` with no ``=``, is that flag's value. Nothing after ``--``."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + argv[i:]
        prev = out[-1] if out else ""
        if prev.startswith("--") and len(prev) > 2 and "=" not in prev and _DASH_VALUE.match(token):
            out[-1] = f"{prev}={token}"
        else:
            out.append(token)
    return out


def _interval(lo: float | None, hi: float | None, above: bool) -> str:
    left = "(" if above else "["
    a = "-inf" if lo is None else f"{lo:,}" if isinstance(lo, int) or lo.is_integer() else f"{lo:g}"
    b = "inf" if hi is None else f"{hi:,}" if isinstance(hi, int) or hi.is_integer() else f"{hi:g}"
    return f"{left}{a.removesuffix('.0')}, {b.removesuffix('.0')}]"


def finite_float(
    lo: float | None = None, hi: float | None = None, *, above: bool = False, unit: str = ""
) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in [lo, hi] (or (lo, hi] when ``above``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (lo is not None and (value <= lo if above else value < lo)) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: give a number in {_interval(lo, hi, above)}{unit}"
            )
        return value

    parse.__name__ = "number"
    return parse


def bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is out of range: give an integer in {_interval(lo, hi, False)}")
        return value

    parse.__name__ = "integer"
    return parse


PORT = bounded_int(0, 65535)
