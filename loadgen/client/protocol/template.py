"""The byte template of a server's content chunks: counting them without decoding.

Why: a server's content chunks differ only in the content string (and sometimes
``created``), and decoding each one's JSON is most of what a client spends per
token. So after decoding one, the tally learns its bytes before and after that
string and proves, with one probe decode, that the gap is exactly the content's
string body. A later chunk with the same prefix and suffix and a gap that is plain
text (no quote, backslash or control character, valid UTF-8) then is, provably,
that same chunk with other content. Many such events in one read (a server writing
back to back, a client catching up) are proven together rather than one by one.

Pure functions of bytes; ``StreamTally`` (stream.py) keeps the learned template
and the counts.
"""

from __future__ import annotations

from itertools import repeat
from operator import getitem
from typing import Any

import orjson

__all__ = ["Learned", "learn", "plain", "plain_all", "read_bodies", "run_bodies"]

# (prefix, suffix, len(prefix), len(suffix)) of an event's data, the same for a whole
# event as read (with "data: " and the blank line, plus the read length from which it
# may hold more than one), and (the bytes between two events, where a body lies in one)
Payload = tuple[bytes, bytes, int, int]
Framed = tuple[bytes, bytes, int, int, int]
Between = tuple[bytes, slice]
Learned = tuple[Payload, Framed | None, Between | None]

BULK = 8  # template events in one read from which they are counted together


def learn(payload: bytes, obj: dict[str, Any], chat: bool) -> tuple[Learned | None, bool]:
    """The template ``payload`` makes, if it is a content chunk that can be one, and
    whether it was tried (a content chunk was found; the caller bounds the tries).

    It must be a single-choice chunk whose only output is a non-empty content (or
    completion text) string, with no usage, finish reason or error. The string's
    body is found by its key; a probe decode of the payload with another body put
    there must give the same object with only that string changed, which proves
    the bytes around it are everything else in the chunk. ``obj`` is consumed.
    """
    ch = obj["choices"][0]
    if ch.get("finish_reason") is not None or obj.get("error") is not None:
        return None, False
    if chat:
        target, field, key = ch["delta"], "content", b'"content":'
        if target.get("reasoning_content") or target.get("reasoning") or target.get("tool_calls"):
            return None, False
    else:
        target, field, key = ch, "text", b'"text":'
    value = target.get(field)
    i = payload.find(key)
    if type(value) is not str or i < 0:
        return None, False
    i += len(key)
    if payload[i : i + 1] == b" ":
        i += 1
    if payload[i : i + 1] != b'"':
        return None, True
    i += 1
    j = payload.find(b'"', i)
    if 92 in payload[i:j]:  # a backslash: the body may not end at that quote
        return None, True
    pre, suf = payload[:i], payload[j:]
    probe = "~" if value != "~" else "~~"
    target[field] = probe
    try:
        if orjson.loads(pre + probe.encode() + suf) != obj:
            return None, True
    except orjson.JSONDecodeError:
        return None, True
    tpl = (pre, suf, len(pre), len(suf))
    if 10 in pre or 13 in pre or 10 in suf or 13 in suf:
        return (tpl, None, None), True  # a multi-line event: only the parser can frame it
    fpre, fsuf = b"data: " + pre, suf + b"\n\n"
    framed = (fpre, fsuf, len(fpre), len(fsuf), 2 * (len(fpre) + len(fsuf)))
    return (tpl, framed, (fsuf + fpre, slice(len(pre), -len(suf)))), True


def plain(body: bytes) -> str | None:
    """The text of a JSON string body that needs no unescaping, else None.

    No quote, no backslash, valid UTF-8 and printable (so no control character,
    which JSON forbids raw): then the body means exactly its UTF-8 text. Rejecting
    more than needed (e.g. a no-break space) only sends a chunk down the full path.
    """
    if 34 in body or 92 in body:
        return None
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def plain_all(bodies: list[bytes]) -> str | None:
    """The joined text of string bodies that are each ``plain``, else None."""
    joined = b"".join(bodies)
    if joined.isascii():
        return plain(joined)  # per byte, so the same as body by body
    texts = list(map(plain, bodies))  # a character cut between two bodies must not pass as whole
    return None if None in texts else "".join(texts)  # type: ignore[arg-type]


def read_bodies(data: bytes, between: Between) -> list[bytes] | None:
    """The string bodies of a read (framed as the template's first and last event), if
    it is nothing but whole template events; else None.

    Split at the event framing, the read proves to be such when every framing lies
    inside a whole separator (suffix, framing, prefix): each event is then prefix,
    body, suffix. Whether the bodies are plain is the caller's check.
    """
    sep, cut = between
    events = data[6:-2].split(b"\n\ndata: ")
    if data.count(sep) != len(events) - 1:
        return None
    return list(map(getitem, events, repeat(cut)))


def run_bodies(payloads: list[bytes], i: int, tpl: Payload) -> tuple[int, list[bytes]] | None:
    """The run of template events from ``payloads[i]``: the index after it and their bodies.

    The run is every payload up to the last that has the template's prefix and
    suffix (a stream's finish, usage and ``[DONE]`` follow it); None unless all of
    it has them and it is at least ``BULK`` long.
    """
    pre, suf, lo, hi = tpl
    j = len(payloads)
    while j > i and not (payloads[j - 1].startswith(pre) and payloads[j - 1].endswith(suf)):
        j -= 1
    run = payloads[i:j]
    if (
        len(run) < BULK
        or not all(map(bytes.startswith, run, repeat(pre)))
        or not all(map(bytes.endswith, run, repeat(suf)))
        or min(map(len, run)) < lo + hi
    ):
        return None
    return j, list(map(getitem, run, repeat(slice(lo, -hi))))
