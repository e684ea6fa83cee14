"""The byte template of a server's content chunks: counting them without decoding.

Why: a server's content chunks differ only in the content string (and sometimes
``created``), and decoding each one's JSON is most of what a client spends per
token. So after decoding one, the tally learns its bytes before and after that
string and proves, with one probe decode, that the gap is exactly the content's
string body. A later chunk with the same prefix and suffix and a gap that is plain
text (no quote, backslash or control character, valid UTF-8) then is, provably,
that same chunk with other content. Many such events in one read (a server writing
back to back, a client catching up) are proven together rather than one by one.

One template, seen two ways, each a ``Fit``: as the parser hands an event on (its
``data``), and as a read of whole events (``data: `` + data + blank line), so the
usual read, one event, is counted without running the SSE parser at all. Both views
are needed for speed: without the read view a one-event read costs ~80% more, and
without the payload view reads cut inside events (TCP segments, a client catching
up) lose the template altogether.

Pure functions of bytes and two small classes; ``StreamTally`` (tally.py) keeps the
learned template and the counts.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from operator import getitem
from typing import Any, NamedTuple, cast

import orjson

__all__ = [
    "BULK",
    "Fit",
    "Learned",
    "Run",
    "Template",
    "body_span",
    "content_holder",
    "learn",
    "plain",
    "plain_all",
    "probe_text",
    "read_bodies",
    "run_bodies",
]

BULK = 8  # template events in one list of payloads from which they are counted together
_FRAMING = b"\n\ndata: "  # between two one-line events
# map(getitem, events, repeat(a_slice)) is the fastest way to slice many; the cast picks
# getitem's bytes-and-slice overload for mypy, once, at import.
_cut = cast(Callable[[bytes, slice], bytes], getitem)


class Fit:
    """Where an event's string body lies: after ``pre`` and before ``suf``.

    The fit test: an event fits when it is at least ``least`` long (so the two
    cannot overlap), starts with ``pre`` and ends with ``suf``; its body is then
    ``event[cut]``. ``StreamTally`` runs the test inline, once on reads and once on
    payloads, because a call would cost ~5% of the commonest read (measured).

    A slotted class, not a NamedTuple: the hot path reads these fields for every
    event, and CPython 3.11 specialises a slot read but not a NamedTuple field read
    or unpack (measured: ~400 more instructions per event). ``least`` is stored
    because ints above 256 are not cached: computing it per event would allocate.
    """

    __slots__ = ("pre", "suf", "lo", "hi", "least", "cut")

    def __init__(self, pre: bytes, suf: bytes) -> None:
        self.pre = pre
        self.suf = suf
        self.lo = len(pre)
        self.hi = len(suf)
        self.least = self.lo + self.hi
        self.cut = slice(self.lo, -self.hi)  # the body (a suffix is never empty: it starts at a quote)

    def __repr__(self) -> str:
        return f"Fit(pre={self.pre!r}, suf={self.suf!r})"


class Template:
    """A learned content chunk, seen as the parser hands it on and as a read.

    ``payload`` fits an event's data. ``framed`` fits a read holding just that event
    (``data: `` + data + blank line), and ``between`` is what lies between two such
    events in one read (suffix, framing, prefix); both are None when the payload's
    prefix or suffix holds a line end, as only the parser can frame such an event.
    Slotted for the reason ``Fit`` is.
    """

    __slots__ = ("payload", "framed", "between")

    def __init__(self, payload: Fit, one_line: bool) -> None:
        self.payload = payload
        self.framed = Fit(b"data: " + payload.pre, payload.suf + b"\n\n") if one_line else None
        self.between = payload.suf + _FRAMING + payload.pre if one_line else None


class Learned:
    """The content template a route's streams learned last, for each new stream to take up.

    A server's content chunks are alike from one answer to the next (when its chunk ids and
    ``created`` do not vary), so learning each answer's template again (a probe decode and
    its checks, ~a quarter of a one-token answer's tally) is mostly waste. A stream offers
    its first decoded content chunk here (``fitting``): if the chunk fits the template, that
    template is proven for it as for any chunk it fits (same prefix and suffix, a plain body:
    the same chunk with other text), and the stream takes it up without a probe. Else the
    stream learns its own, which becomes the route's (``template``). One per run and route.
    """

    __slots__ = ("template",)

    def __init__(self) -> None:
        self.template: Template | None = None

    def fitting(self, payload: bytes) -> Template | None:
        """The route's template, if ``payload`` (a decoded content chunk) fits it."""
        tpl = self.template
        if tpl is None:
            return None
        fit = tpl.payload
        m = len(payload)
        if m < fit.least or not payload.startswith(fit.pre) or not payload.endswith(fit.suf):
            return None
        return tpl if plain(payload[fit.lo : m - fit.hi]) else None


class Run(NamedTuple):
    """A run of template events in a list of payloads: the index after it and their bodies."""

    end: int
    bodies: list[bytes]


def content_holder(obj: dict[str, Any], chat: bool) -> dict[str, Any] | None:
    """The dict whose content (or completion text) string is a chunk's only output,
    or None if the chunk is not such a one: only such a chunk may teach a template.

    ``obj`` is a single-choice chunk with output (the caller's checks; one with usage
    may teach only a usage template, usage_template.py); here also without a finish
    reason, an error, or output besides the string.
    """
    ch = obj["choices"][0]
    if ch.get("finish_reason") is not None or obj.get("error") is not None:
        return None
    if chat:
        holder = ch["delta"]
        if holder.get("reasoning_content") or holder.get("reasoning") or holder.get("tool_calls"):
            return None
    else:
        holder = ch
    return holder if type(holder.get("content" if chat else "text")) is str else None


def learn(payload: bytes, obj: dict[str, Any], holder: dict[str, Any], chat: bool) -> Template | None:
    """The template ``payload`` makes, if it makes one; ``holder`` is its ``content_holder``.

    The string's body is found by its key; a probe decode of the payload with
    another body put there must give the same object with only that string changed,
    which proves the bytes around it are everything else in the chunk. ``obj`` (and
    so ``holder``) is consumed.
    """
    field = "content" if chat else "text"
    span = body_span(payload, chat)
    if span is None:
        return None
    i, j = span
    pre, suf = payload[:i], payload[j:]
    probe = probe_text(holder[field])
    holder[field] = probe
    try:
        if orjson.loads(pre + probe.encode() + suf) != obj:
            return None
    except orjson.JSONDecodeError:
        return None
    return Template(Fit(pre, suf), one_line=not (10 in pre or 13 in pre or 10 in suf or 13 in suf))


def body_span(payload: bytes, chat: bool) -> tuple[int, int] | None:
    """Where the body of the chunk's content (or completion text) string may lie, found
    by its key: ``payload[i:j]``, ending at the first quote and holding no backslash
    (else the body may not end at that quote); None if there is no such string. Only a
    probe decode proves it is the chunk's content (``learn``)."""
    key = b'"content":' if chat else b'"text":'
    i = payload.find(key)
    if i < 0:
        return None
    i = _body_start(payload, i + len(key))
    if i < 0:
        return None
    j = payload.find(b'"', i)
    if j < 0 or 92 in payload[i:j]:
        return None
    return i, j


def probe_text(value: object) -> str:
    """A content string other than ``value``, to put in its place for a probe decode."""
    return "~" if value != "~" else "~~"


def _body_start(payload: bytes, i: int) -> int:
    """Where the body of the string value at ``payload[i]`` (after a key's colon) starts, or -1 if none is."""
    if payload[i : i + 1] == b" ":
        i += 1
    return i + 1 if payload[i : i + 1] == b'"' else -1


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
    texts = []
    for body in bodies:  # a character cut between two bodies must not pass as whole
        text = plain(body)
        if text is None:
            return None
        texts.append(text)
    return "".join(texts)


def read_bodies(data: bytes, tpl: Template) -> list[bytes] | None:
    """The string bodies of a read, if it is nothing but whole template events; else None.

    Such a read starts and ends as ``tpl.framed`` does, and split at the framing
    between events, each piece is prefix, body, suffix. One ``count`` proves the
    pieces are, which is cheaper than testing them one by one as ``run_bodies``
    must: counted between the end of the first prefix and the start of the last
    suffix, there must be one ``between`` per split. (The framing cannot overlap
    itself, so the framing inside each ``between`` is a split, and each split then
    has a suffix before it and a prefix after it. ``count`` does not overlap what it
    counts, and the bounds keep it off the first prefix and the last suffix, so no
    piece's prefix and suffix overlap: every piece is long enough to hold both.)
    Whether the bodies are plain is the caller's check.
    """
    framed, between, fit = tpl.framed, tpl.between, tpl.payload
    assert framed is not None and between is not None  # only a one-line template frames reads
    if not (data.startswith(framed.pre) and data.endswith(framed.suf)):
        return None  # also the cheap test that turns away most reads that are not such
    events = data[6:-2].split(_FRAMING)
    if data.count(between, framed.lo, len(data) - framed.hi) != len(events) - 1:
        return None
    return list(map(_cut, events, repeat(fit.cut)))


def run_bodies(payloads: list[bytes], i: int, fit: Fit) -> Run | None:
    """The run of template events from ``payloads[i]``, if it is at least ``BULK`` long.

    The run is every payload up to the last that fits (a stream's finish, usage and
    ``[DONE]`` follow it); None unless all of it fits.
    """
    pre, suf = fit.pre, fit.suf
    j = len(payloads)
    while j > i and not (payloads[j - 1].startswith(pre) and payloads[j - 1].endswith(suf)):
        j -= 1
    run = payloads[i:j]
    if (
        len(run) < BULK
        or not all(map(bytes.startswith, run, repeat(pre)))
        or not all(map(bytes.endswith, run, repeat(suf)))
        or min(map(len, run)) < fit.least
    ):
        return None
    return Run(j, list(map(_cut, run, repeat(fit.cut))))
