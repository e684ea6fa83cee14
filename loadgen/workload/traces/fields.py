"""Reading a trace file and checking its fields, shared by every format's reader.

A trace is user input like a spec: a bad row must stop the run before any traffic,
with one line that names the file, the line (or record) and the field, never a
traceback from deep inside a parser. Every reader goes through these few checks so
that the messages read alike whatever the format.
"""

from __future__ import annotations

import math
from pathlib import Path

from loadgen.errors import SpecError

__all__ = ["read_bytes", "field_error", "whole_number", "plain_number"]


def read_bytes(path: Path) -> bytes:
    """The whole file; a file that cannot be read is a ``SpecError``, not an ``OSError``."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise SpecError(f"{path}: cannot read trace: {e.strerror or e}") from None


def field_error(where: str, field: str, msg: str) -> SpecError:
    """``where: field: msg`` (``where`` is ``file:line`` or ``file: record n``)."""
    return SpecError(f"{where}: {field}: {msg}" if field else f"{where}: {msg}")


def whole_number(v: object, where: str, field: str, minimum: int = 0) -> int:
    """``v`` as an int, if it is a whole number >= ``minimum`` (``3.0`` is, ``True`` is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < minimum:
        raise field_error(where, field, f"must be a whole number >= {minimum}, not {v!r}")
    return int(v)


def plain_number(v: object, where: str, field: str) -> float:
    """``v`` as a float, if it is a finite number >= 0 (a time or a length)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise field_error(where, field, f"must be a number >= 0, not {v!r}")
    return float(v)
