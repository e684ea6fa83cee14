"""What a stream says when it goes wrong: in-stream error objects, non-JSON data, misshapen chunks.

Apart from the tally (tally.py) because each case is a message a user reads in a
record: what the server sent is untrusted, so messages are cut short and escaped.
"""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.client.protocol.sse import BadStream

__all__ = ["StreamError", "check_error", "is_done", "shape_error"]


class StreamError(BadStream):
    """The endpoint reported an error inside the stream (``{"error": {...}}``).

    ``message`` is the server's message, cut to 200 characters (it is untrusted text
    that ends up in records and reports); ``code`` is its code or type, if any.
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


def is_done(payload: bytes) -> bool:
    """True for the ``[DONE]`` sentinel; raise ``BadStream`` for any other non-JSON.

    An empty ``data:`` event carries nothing and is not worth failing a run over.
    """
    stripped = payload.strip()
    if stripped == b"[DONE]":
        return True
    if stripped:
        raise BadStream(f"non-JSON event data: {payload[:60]!r}")
    return False


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
        msg = err.get("message") or orjson.dumps(err).decode("utf-8", "replace")
        c = err.get("code") or err.get("type")
        if type(c) in (str, int):
            code = c
    else:
        msg = err
    raise StreamError(str(msg)[:200], code)
