"""What a stream says when it goes wrong: in-stream error objects, non-JSON data, misshapen chunks.

Apart from the tally (tally.py) because each case is a message a user reads in a
record: what the server sent is untrusted, so messages are cut short and escaped
(``repr`` of at most 60 bytes, or ``clean_text``).

Event data that is not strict JSON is read anyway where it can be: servers written in
Python emit ``NaN`` and ``Infinity`` (``json.dumps`` does by default), in logprobs or
wherever a float went wrong, and a detokenizer that cuts a character can put bytes
that are not UTF-8 into one content chunk. Neither makes the request's timing or its
other tokens wrong, so neither may fail the request: ``loads_leniently`` decodes the
event and says what was odd about it (``StreamTally.problems``). Only an event orjson
refused comes to it, so a clean stream never pays for it. A number out of such an
event (``NaN`` as a token count, say) is still range-checked where it is used.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import orjson

from loadgen.client.protocol.sse import BadStream
from loadgen.untrusted import clean_text

__all__ = ["BAD_UTF8", "Lenient", "StreamError", "check_error", "loads_leniently", "not_json", "shape_error"]

BAD_UTF8 = "invalid UTF-8 in content replaced"

_CODES = 10**9  # an int code beyond this is kept as (cut) text


class StreamError(BadStream):
    """The endpoint reported an error inside the stream (``{"error": {...}}``).

    ``message`` is the server's message as ``clean_text`` keeps it (one line, no
    control or bidi characters, at most 300 characters: it is untrusted text that
    ends up in records and reports); ``code`` is its code or type, if any, a string
    cleaned the same way (at most 60 characters).
    """

    def __init__(self, message: str, code: str | int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def shape_error(obj: Any, payload: bytes) -> str:
    """Message for a chunk whose JSON is not shaped like a chunk."""
    if type(obj) is not dict:
        return f"event data is JSON but not an object: {payload[:60]!r}"
    return f"malformed chunk (a field has the wrong type): {payload[:60]!r}"


def not_json(payload: bytes) -> BadStream:
    """The failure for event data that is not JSON, even leniently (nor ``[DONE]``)."""
    return BadStream(f"non-JSON event data: {payload[:60]!r}")


def check_error(obj: dict[str, Any]) -> None:
    """Raise ``StreamError`` if the chunk is an in-stream error object.

    Handles ``{"error": {"message": ..., "code": ...}}`` (OpenAI, newer vLLM),
    ``{"error": "text"}`` and the flat ``{"object": "error", "message": ...}`` of
    older vLLM builds. ``"error": null`` is not an error.
    """
    err = obj.get("error")
    if err is None:
        if obj.get("object") != "error":
            return
        err = obj
    code: str | int | None = None
    if type(err) is dict:
        msg = err.get("message") or _dumps(err)
        c = err.get("code") or err.get("type")
        if type(c) is str:
            code = clean_text(c, 60)
        elif type(c) is int:
            code = c if -_CODES < c < _CODES else clean_text(c, 60)
    else:
        msg = err
    raise StreamError(clean_text(msg), code)


def _dumps(err: dict[str, Any]) -> str:
    """An error object without a message, as JSON (a NaN read leniently comes out as null)."""
    try:
        return orjson.dumps(err).decode("utf-8", "replace")
    except TypeError:  # a value orjson cannot write: a lone surrogate, a huge int
        return repr(err)[:1200]


class Lenient(NamedTuple):
    """An event decoded leniently, and what was odd about it, as ``(key, message)`` pairs
    (the key names the kind of problem, so a stream reports each kind once)."""

    obj: Any
    problems: list[tuple[str, str]]


def loads_leniently(payload: bytes, refused: str) -> Lenient | None:
    """Decode event data orjson refused (``refused``: its message); None if it is not
    JSON even leniently.

    Invalid UTF-8 is replaced (U+FFFD): a replaced sequence never swallows an ASCII
    byte, so the JSON's structure is what was sent. Then, if orjson still refuses it,
    Python's decoder reads the non-standard constants (``NaN``, ``Infinity``,
    ``-Infinity``, as floats), raw control characters inside strings and numbers out
    of a double's range; an integer of more than 20 digits becomes a float, as orjson
    makes it (Python would refuse one of over 4300). Nesting too deep stays an error.
    """
    problems: list[tuple[str, str]] = []
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        text = payload.decode("utf-8", "replace")
        problems.append(("utf8", BAD_UTF8))
        try:
            return Lenient(orjson.loads(text), problems)
        except orjson.JSONDecodeError as e:
            refused = str(e)
    constants: list[str] = []

    def constant(name: str) -> float:
        constants.append(name)
        return float(name)

    try:
        obj = json.loads(text, parse_constant=constant, parse_int=_int, strict=False)
    except (ValueError, RecursionError):
        return None
    what = ", ".join(sorted(set(constants))) if constants else clean_text(refused, 80)
    problems.append(("json", f"non-standard JSON read leniently ({what})"))
    return Lenient(obj, problems)


def _int(digits: str) -> int | float:
    """A JSON integer: beyond 64 bits, a float (``inf`` if it is beyond a double)."""
    return int(digits) if len(digits) <= 20 else float(digits)
