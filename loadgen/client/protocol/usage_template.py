"""The byte template of a server's content chunks that carry running usage.

Why: with vLLM's ``continuous_usage_stats`` (which loadgen asks for where a server
offers it) every content chunk carries ``"usage":{"prompt_tokens":P,
"completion_tokens":C,"total_tokens":T}``, so its bytes differ from the last chunk's
in the numbers as well as the text, and the content template (template.py) never
fits: each chunk would cost a JSON decode, about three times the template's cost.

So such a chunk, once decoded, teaches a template with holes: the content string's
body and the digits of ``completion_tokens`` and ``total_tokens``, the bytes between
them fixed. One probe decode, with every hole given another value, proves that the
bytes around the holes are everything else in the chunk and that each hole is the
value of its field. A later chunk then fits when its fixed bytes are the template's
and each hole holds what needs no decoding: the text plain (template.plain), each
count a JSON integer (digits, no leading zero) of at most nine digits,
``completion_tokens`` within ``[0, MAX_TOKEN_COUNT]``. Such a chunk is, provably, the
taught one with other text and counts, and the tally applies its usage as
``Usage.take`` applies a decoded one's: ``prompt_tokens`` kept, then ``Usage.rise``.
Anything else (an escape, a count out of range or of ten digits, another field) does
not fit and is decoded, with its problems noted there.

``prompt_tokens``, the same on every chunk of a request, is part of the fixed bytes
(a chunk with another is decoded, and teaches a template of its own), so the tally
keeps the template's. A template is only taught by a chunk whose usage has no other
effect: its fields besides the three counts (``prompt_tokens_details: null``, say)
must leave every count ``Usage.take`` keeps untouched, so that skipping them changes
nothing.

The text comes first (a chunk with its usage before its choices teaches nothing):
the fixed bytes up to the first count are compared, the rest matched by one compiled
pattern; ``total_tokens`` is matched and ignored, as ``Usage.take`` ignores it. Two
views of one template, as for content chunks: the event's data, and a read of just
that event.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from loadgen.client.protocol.template import body_span, probe_text
from loadgen.client.protocol.usage import Problems, Usage
from loadgen.untrusted import MAX_TOKEN_COUNT

__all__ = ["UsageTemplate", "learn_usage"]

_PT, _CT, _TT = "prompt_tokens", "completion_tokens", "total_tokens"
_COUNT = rb"0|[1-9][0-9]{0,8}"  # a JSON integer of at most nine digits: MAX_TOKEN_COUNT has nine
_COUNTS = {  # each count hole's pattern: completion_tokens kept, total_tokens matched and ignored
    _CT: b"(%s)" % _COUNT,
    _TT: b"(?:%s)" % _COUNT,
}
_NINE_DIGITS = 999_999_999  # the most a count hole holds
_PROBE = MAX_TOKEN_COUNT + 1  # probe counts: over the bound, so none is a value that was sent


class UsageTemplate:
    """A learned content chunk with running usage, as the parser hands it on and as a read.

    An event fits when it starts with ``pre``, its text body (from ``lo``) ends at the
    first quote, ``mid`` (``mid_len`` long, from that quote) follows, and
    ``rest(event, end of mid)`` matches what is left:
    the counts with their fixed bytes, to the end; the match's group 1 is the
    ``completion_tokens`` digits. Its ``prompt_tokens`` is then ``prompt`` (part of the
    fixed bytes). ``framed_pre``, ``framed_lo`` and ``framed_rest`` are the same for a
    read of just that event (``data: `` + data + blank line); ``framed_rest`` is None
    when a fixed part holds a line end, as only the parser can frame such an event. The
    fixed bytes up to the first count are compared, not matched: a pattern costs some
    ns a byte, a compare next to nothing. Slotted, like template.Fit, for the hot path.
    """

    __slots__ = ("pre", "lo", "mid", "mid_len", "rest", "prompt", "framed_pre", "framed_lo", "framed_rest")

    def __init__(self, pieces: list[bytes], holes: list[str], prompt: int) -> None:
        """``pieces``: the fixed bytes around the holes, one more than ``holes``, in byte
        order; ``holes``: each hole's field, the text body (``"content"``) first."""
        assert holes[0] == "content" and pieces[1][:1] == b'"' and len(pieces[1]) > 1  # see _by_usage_template
        rest = []
        for hole, piece in zip(holes[1:], pieces[2:], strict=True):
            rest.append(_COUNTS[hole])
            rest.append(re.escape(piece))
        pattern = b"".join(rest)
        self.pre, self.mid = pieces[0], pieces[1]
        self.lo = len(self.pre)
        self.mid_len = len(self.mid)
        self.rest = re.compile(pattern).fullmatch
        self.prompt = prompt
        one_line = not any(10 in piece or 13 in piece for piece in pieces)
        self.framed_pre = b"data: " + self.pre
        self.framed_lo = self.lo + 6
        self.framed_rest = re.compile(pattern + b"\n\n").fullmatch if one_line else None

    def __repr__(self) -> str:
        return f"UsageTemplate(pre={self.pre!r}, mid={self.mid!r})"


def learn_usage(payload: bytes, obj: dict[str, Any], holder: dict[str, Any], chat: bool) -> UsageTemplate | None:
    """The template ``payload`` makes, if it makes one; ``holder`` is its
    ``template.content_holder`` and ``obj["usage"]`` its running usage.

    The holes are found by their keys (the last of each, as a JSON decoder keeps the
    last of a repeated key); the probe decode proves them. ``obj`` (and so ``holder``
    and the usage) is consumed.
    """
    usage = obj.get("usage")
    if type(usage) is not dict or not _only_counts(usage):
        return None
    prompt = usage.get(_PT)
    if type(prompt) is not int or not 0 <= prompt <= MAX_TOKEN_COUNT:
        return None
    span = body_span(payload, chat)
    if span is None:
        return None
    holes: list[tuple[int, int, str]] = [(span[0], span[1], "content")]
    for name in (_CT, _TT):
        value = usage.get(name)
        if type(value) is not int or not 0 <= value <= (MAX_TOKEN_COUNT if name == _CT else _NINE_DIGITS):
            if name == _TT:
                continue  # not a hole: fixed bytes, and ignored as Usage.take ignores it
            return None
        at = _count_span(payload, name, value)
        if at is None:
            return None
        holes.append((*at, name))
    holes.sort()
    if holes[0][2] != "content" or any(a[1] > b[0] for a, b in zip(holes, holes[1:], strict=False)):
        return None  # (usage before the text: no server seen does that; such chunks are decoded)
    pieces, names, probe, start = [], [], [], 0
    for k, (i, j, name) in enumerate(holes):
        pieces.append(payload[start:i])
        names.append(name)
        if name == "content":
            field = "content" if chat else "text"
            holder[field] = text = probe_text(holder[field])
            filler = text.encode()
        else:
            usage[name] = _PROBE + k
            filler = b"%d" % (_PROBE + k)
        probe += [pieces[-1], filler]
        start = j
    pieces.append(payload[start:])
    probe.append(pieces[-1])
    try:
        if orjson.loads(b"".join(probe)) != obj:
            return None
    except orjson.JSONDecodeError:
        return None
    return UsageTemplate(pieces, names, prompt)


def _count_span(payload: bytes, name: str, value: int) -> tuple[int, int] | None:
    """Where the digits of ``"name": value`` lie in ``payload`` (the last such key), or None."""
    key = b'"%s":' % name.encode()
    i = payload.rfind(key)
    if i < 0:
        return None
    i += len(key)
    if payload[i : i + 1] == b" ":
        i += 1
    digits = b"%d" % value
    j = i + len(digits)
    if payload[i:j] != digits or payload[j : j + 1].isdigit():
        return None
    return i, j


def _only_counts(usage: dict[str, Any]) -> bool:
    """Whether ``usage``'s fields besides the three counts leave everything ``Usage.take``
    keeps untouched (``prompt_tokens_details: null``, say), so a template may skip them."""
    rest = {k: v for k, v in usage.items() if k not in (_PT, _CT, _TT)}
    if not rest:
        return True
    problems = Problems()
    seen = Usage(problems)
    seen.take(rest, None)
    kept = (seen.prompt_tokens, seen.completion_tokens, seen.cached_tokens, seen.reasoning_tokens)
    return kept == (None, None, None, None) and not problems.lines
