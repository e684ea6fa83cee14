"""Values an endpoint sent, made safe to keep: bounded numbers and clean, short strings.

Everything a server sends is untrusted. A token count of 3,000,000,000 does not fit the
records' int32 columns and no request ever produced it; a finish_reason of 300 KB, or one
carrying ANSI escapes or bidi overrides, would rewrite a terminal or hide text in a report.
These functions sit between the wire and every record, file and terminal line: a value
either passes unchanged or comes back bounded, with a reason the caller puts in the
request's ``error`` (the run goes on; nothing measured is dropped).
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_TOKEN_COUNT", "MAX_TEXT_CHARS", "clean_text", "token_count"]

# No request has more tokens than this (the largest context windows are ~10M); it also
# keeps every count inside the records' int32 columns.
MAX_TOKEN_COUNT = 100_000_000
MAX_TEXT_CHARS = 300  # a finish_reason, model id or error text, as kept

# C0 and C1 controls (tab, newline and CR become spaces first), DEL, bidi embeddings,
# overrides and isolates, the bidi marks, zero-width characters and the BOM, and lone
# surrogates (from a JSON "\ud800" escape; they cannot even be encoded as UTF-8).
_UNSAFE = re.compile(
    "\x1b\\[[0-?]*[ -/]*[@-~]"  # an ANSI control sequence, whole (colours, cursor moves)
    "|\x1b\\][^\x07\x1b]*(?:\x07|\x1b\\\\)?"  # an OSC sequence (window titles, links), whole
    "|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff\ud800-\udfff]"
)
_SPACES = re.compile(r"[\t\n\r ]+")


def clean_text(value: object, limit: int = MAX_TEXT_CHARS) -> str:
    """``value`` as one line of at most ``limit`` characters, with no control, bidi or
    zero-width character; a longer text ends in ``…`` so the cut is visible."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > 4 * limit:  # never scan megabytes to keep 300 characters
        text = text[: 4 * limit]
    text = _SPACES.sub(" ", _UNSAFE.sub("", text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def token_count(value: object, what: str) -> tuple[int | None, str | None]:
    """A token count the endpoint reported, range-checked: ``(count, None)`` when it is a
    whole number in ``[0, MAX_TOKEN_COUNT]``, ``(None, None)`` when absent (``None``), and
    ``(None, reason)`` when it is impossible (negative, fractional, huge, not a number)."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"{what} is not a number ({clean_text(repr(value), 40)})"
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None, f"{what} {value!r} is not a whole number"
    n = int(value)
    if n < 0 or n > MAX_TOKEN_COUNT:
        return None, f"{what} {n} is impossible (outside 0..{MAX_TOKEN_COUNT:,})"
    return n, None
