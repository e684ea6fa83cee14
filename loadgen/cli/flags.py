"""The argparse types every numeric flag uses, and the parser whose errors are one line.

``finite_float`` and ``bounded_int`` reject NaN, infinity and out-of-range values as
the command line is parsed, so a typo never reaches a run; the library checks the
same values again when its config objects are built (``client.settings``). Every
error, argparse's included, is one line on stderr and exit code 2::

    loadgen: error: argument --duration: 'nan' is not a finite number
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

__all__ = ["Parser", "finite_float", "bounded_int", "error_line", "PORT"]


def error_line(message: str) -> str:
    """The one line every user error is printed as (newlines in ``message`` become '; ')."""
    text = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    return f"loadgen: error: {text or 'unknown error'}"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser (its sub-parsers are made of the same class) whose errors are one line:
    ``loadgen: error: <what argparse says> (see 'loadgen run --help')`` and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, error_line(f"{message} (see '{self.prog} --help')") + "\n")


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
