"""Interpretation of one streaming chat/completions response, as its bytes arrive.

I/O-free and clock-free: the engine hands over each read with the time the read
returned, and this module decides which chunks carry output (the TTFT/ITL contract
in DESIGN.md) and how many tokens each carried. Keeping it apart from the socket
means every vendor quirk is pinned by a test on a byte literal.

Which chunks carry output: a chat chunk whose ``choices[0].delta`` has non-empty
``content``, ``reasoning_content`` or ``reasoning``, or a tool-call delta with an
arguments fragment; a completions chunk whose ``choices[0].text`` is non-empty.
Role-only deltas (``content: ""`` or ``null``), a tool call's header (id, type and
name, empty arguments), empty deltas and finish chunks carry none, so they never
start TTFT. When the request offered tools (``capture_tool_calls``), the calls' ids,
names and argument text are kept too (tool_calls.py). Reasoning text is output (it is
generated, and timed for ITL), but only ``content`` or ``text`` is visible content:
``t_first_content`` is the first chunk with that. loadgen asks for one choice (n = 1):
a choice with another index is not counted, and said once in ``problems``.

What the endpoint sent is untrusted: every token count is range-checked
(``loadgen.untrusted.token_count``) before it is kept, the finish reason is
``clean_text``'d, and an event that is not strict JSON (``NaN``, invalid UTF-8) is
read leniently (chunk_errors.py). Each bounded or odd value is one line of ``problems``,
once per kind per stream; the request goes on.

How many tokens: when a server sends running usage on every chunk (vLLM
``continuous_usage_stats``), the rise in ``completion_tokens`` is the exact count of
each chunk, which matters because one chunk can carry several tokens (speculative
decoding, stream intervals, detokenizer hold-back). Running usage that goes down is
a problem: the highest count is kept. Else, with a ``tokenizer``, the tally keeps each
output chunk's text (chunk_texts.py: bounded, past that it counts as without
one) and ``reconcile`` tokenizes the whole text once, each token counted in
the chunk its text ends in (``workload.tokenizer.count_pieces``: a token that
straddles two chunks is counted once), then reconciles that with the final usage:
each chunk at least 1, the usage total kept when one is reported, the difference
spread evenly (a surplus) or taken in proportion (a deficit) over the chunks
(``token_counts.by_tokenizer`` states the rule). Else each output chunk is one token
until ``reconcile`` spreads the final ``usage`` over them (token_counts.py).

Speed: content chunks are counted off a learned byte template where one proves to
fit (template.py); anything else takes the full path, a JSON decode per chunk. A
read goes one of two ways: one of nothing but whole template events is counted from
its bytes (``feed``); any other is framed by the SSE parser, and of its payloads
those that fit the template are counted from their bytes (``_by_template``) and the
rest decoded (``_take``). The hot functions are flat on purpose, with a comment
wherever a call was measured to cost more than it reads better. The template path
applies the same bounds as decoding by construction: a template is only learned from
a single-choice content chunk without usage or finish reason that was decoded (and so
set ``t_first_content``), and it only fits chunks that differ from that one in plain
text; anything else is decoded. Content chunks with running usage on each have a
template of their own (usage_template.py), with holes for the counts, learned and
bounded the same way; its counts go through ``Usage.rise``, the same rule as
``Usage.take`` applies to a decoded chunk (``StreamState._running_chunk``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from loadgen.client.protocol.choices import NONE, VISIBLE, carried
from loadgen.client.protocol.chunk_errors import check_error, loads_leniently, not_json, shape_error
from loadgen.client.protocol.sse import BadStream, SSEParser
from loadgen.client.protocol.stream_state import StreamState
from loadgen.client.protocol.template import (
    BULK,
    Fit,
    Learned,
    Template,
    content_holder,
    learn,
    plain,
    plain_all,
    read_bodies,
    run_bodies,
)
from loadgen.client.protocol.usage_template import UsageTemplate, learn_usage
from loadgen.untrusted import clean_text

if TYPE_CHECKING:
    from loadgen.workload.tokenizer import Tokenizer

__all__ = ["StreamTally"]

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_LEARNS = 64  # templates a stream may learn: bounds the cost where they never hit
_SKIP = object()  # an empty event: it carries nothing
_DONE = object()  # [DONE], with spaces around it


class StreamTally(StreamState):
    """Running tally of one streamed response: output chunk times, token counts, usage.

    ``feed(data, t_ns)`` per read, ``close()`` at end of body, then ``reconcile()``
    for the token counts to record. Raises ``BadStream`` (or ``StreamError`` for an
    in-stream error object) as soon as the stream stops making sense; what was
    tallied until then stays readable for the failure record.

    ``problems`` lists, one line each (``clean_text``'d), every value the endpoint
    sent that was impossible and so bounded or dropped, and every oddity read past
    (extra choices, non-standard JSON, invalid UTF-8): each kind once per stream, so
    the list stays short however long the stream. The counts here are already bounded.
    """

    __slots__ = ("_parser", "_sse", "_tpl", "_framed", "_one", "_many", "_learns", "_utpl", "_route")

    def __init__(
        self,
        api: str,
        keep_text: bool = False,
        max_event_bytes: int = 1 << 20,
        tokenizer: Tokenizer | None = None,
        learned: Learned | None = None,
    ) -> None:
        super().__init__(api, keep_text, tokenizer)
        self._parser = SSEParser(max_event_bytes)
        self._sse = self._parser.feed
        # The learned content-chunk template (template.py), None until learned and again
        # after [DONE]; its read view apart, as feed looks at it for every read.
        self._tpl: Template | None = None
        self._framed: Fit | None = None
        self._one = 0  # with a template, a read shorter than this holds one event at most, within the cap
        self._many = max_event_bytes + 2  # a read no longer than this holds no event over the size cap
        self._learns = _LEARNS
        self._utpl: UsageTemplate | None = None  # of chunks with running usage (usage_template.py), as _tpl
        self._route = learned  # the content template its route's streams learned (template.Learned)

    def feed(self, data: bytes, t_ns: int) -> None:
        """Interpret one read; every event it completes is stamped ``t_ns``."""
        self.t_read = t_ns
        framed = self._framed  # (set only once a chunk was decoded: bytes were fed before)
        if framed is not None and self._parser.idle:  # the read starts at an event: it may be whole ones
            n = len(data)
            if n < self._one:  # room for one event only: the usual read
                # The fit test (template.Fit) inlined, as in _by_template: this is the
                # read of nearly every token, and a call would cost ~5% of it (measured).
                if n >= framed.least and data.startswith(framed.pre) and data.endswith(framed.suf):
                    text = plain(data[framed.lo : n - framed.hi])
                    if text is not None:
                        self.events += 1
                        if text:  # an empty body: an event without output
                            self._ns.append(t_ns)
                            if self._tokens is not None:  # (None: each count 1 so far, StreamState)
                                self._tokens.append(1)
                            if self._collect:
                                self._kept(text)
                        return
            elif n <= self._many and self._read_of_events(data, t_ns):
                return  # (a longer read may hold an event over the cap: the parser decides)
        utpl = self._utpl  # (set only once a chunk was decoded, as _framed)
        if utpl is not None and self._parser.idle and data.startswith(utpl.framed_pre):
            # A read of one event with running usage, the usual read with it (the fit
            # test of _by_usage_template, inlined likewise): no more than one event fits,
            # as the whole read must be one line and its end; within the size cap.
            rest = utpl.framed_rest
            lo = utpl.framed_lo
            end = data.find(b'"', lo)  # (see _by_usage_template)
            if rest is not None and data.startswith(utpl.mid, end) and len(data) <= self._many:
                m = rest(data, end + utpl.mid_len)
                if m is not None and self._running_chunk(data[lo:end], m[1], utpl.prompt, t_ns):
                    self.events += 1
                    return
        if data:
            self._fed = True
        payloads = self._sse(data)
        if payloads:
            self._take(payloads, t_ns)

    def close(self, t_ns: int | None = None) -> None:
        """End of body: interpret a final event that had no closing blank line.

        ``t_ns`` stamps such an event (the end-of-body time); without it the time of
        the last output chunk is reused, or 0 when there was none.
        """
        payloads = self._parser.close()
        if payloads:
            if t_ns is None:
                t_ns = self._ns[-1] if self._ns else 0
            self._take(payloads, t_ns)

    def _read_of_events(self, data: bytes, t_ns: int) -> bool:
        """Count a read of nothing but whole template events in one go; False if it is not one."""
        assert self._tpl is not None  # set with _framed
        bodies = read_bodies(data, self._tpl)
        if bodies is None or not self._bodies(bodies, t_ns):
            return False
        self.events += len(bodies)
        return True

    def _run(self, payloads: list[bytes], i: int, fit: Fit, t_ns: int) -> int:
        """Count the run of template events from ``payloads[i]`` in one go; the index after
        it, or ``i`` if there is none (then those events go one by one)."""
        run = run_bodies(payloads, i, fit)
        return run.end if run is not None and self._bodies(run.bodies, t_ns) else i

    def _bodies(self, bodies: list[bytes], t_ns: int) -> bool:
        """Record the string bodies of whole template events, each read at ``t_ns``;
        False, recording nothing, unless every one is plain text."""
        text = plain_all(bodies)
        if text is None:
            return False
        k = len(bodies) - bodies.count(b"")  # an empty body: an event without output
        if k:
            self._ns.extend([t_ns] * k)
            if self._tokens is not None:
                self._tokens.extend([1] * k)
            if self.keep_text:
                self._parts.append(text)
            if self._texts is not None:  # each plain (plain_all), so each decodes
                self._tokenized([body.decode() for body in bodies if body], len(text))
        return True

    def _take(self, payloads: list[bytes], t_ns: int) -> None:
        """Interpret the events the parser completed in one read: those that fit the
        template by ``_by_template``, the others by decoding them here, inline: a call
        per event would cost ~3% of a stream that no template fits (measured)."""
        self.events += len(payloads)
        if self.done:
            return  # anything after [DONE] is not part of the answer
        chat, keep, texts, calls = self._chat, self.keep_text, self._texts, self._calls
        first = self.t_first_content  # a local: read per output chunk
        i, n = 0, len(payloads)
        bulk = n >= BULK  # one try per read at counting a run in one go
        while i < n:
            tpl = self._tpl  # looked up each time: a decoded chunk may have taught one
            if tpl is not None:
                i = self._by_template(payloads, i, tpl.payload, bulk, t_ns)
                bulk = False
                if i == n:
                    return
            utpl = self._utpl
            if utpl is not None:
                i = self._by_usage_template(payloads, i, utpl, t_ns)
                if i == n:
                    return
            payload = payloads[i]
            i += 1
            if payload == b"[DONE]":  # before the decode: a failed decode costs an exception
                self._end()
                return
            try:
                obj = _loads(payload)
            except _JSONDecodeError as e:
                obj = self._leniently(payload, str(e))
                if obj is _SKIP:
                    continue
                if obj is _DONE:
                    return
            # Shape checks cost nothing here: a non-dict where a dict belongs fails on
            # .get or iteration, and the handler turns that into BadStream.
            # Where the chunk's text goes: the kept text, or this chunk's own list to
            # count with the tokenizer (then added to the kept text), or nowhere.
            sink = [] if texts is not None else self._parts if keep else None
            try:
                choices = obj.get("choices")
                if not choices or "error" in obj:
                    check_error(obj)
                out = NONE  # what the chunk carries: the most of its choices (choices.py)
                extra = None  # a choice of another index than 0
                for ch in choices or ():
                    if ch.get("index"):  # (absent or null: the one choice asked for)
                        extra = ch
                        continue
                    if chat:
                        delta = ch.get("delta")
                        if delta:
                            if calls is not None and "tool_calls" in delta:  # the request offered tools
                                calls.chat(delta["tool_calls"])
                            if sink is None and delta.get("content"):
                                out = VISIBLE
                            else:
                                out = max(out, carried(delta, sink))
                    else:
                        text = ch.get("text")
                        if text:
                            out = VISIBLE
                            if sink is not None and type(text) is str:
                                sink.append(text)
                    fr = ch.get("finish_reason")
                    if fr is not None and fr != self._fr_raw:
                        self._finish_reason(fr)
                usage = obj.get("usage")
            except (AttributeError, TypeError):
                raise BadStream(shape_error(obj, payload)) from None
            if extra is not None and "choices" not in self._problems:
                self._problems.flag("choices", f"extra choices (index {clean_text(extra.get('index'), 40)}) ignored")
            if out:
                if texts is not None:
                    assert sink is not None  # a list of its own when texts are kept
                    self._kept_chunk(sink)
                    texts = self._texts  # None again once past the cap
                self._ns.append(t_ns)
                if out == VISIBLE and first is None:
                    self.t_first_content = first = t_ns
                k = 1
                if usage:
                    k = self._usage.take(usage, self._ns)
                    if self._learns and len(choices) == 1:
                        self._learn(payload, obj, True)
                elif self._learns and len(choices) == 1:
                    self._learn(payload, obj, False)
                self._counted(k)
            elif usage:
                self._usage.take(usage, None)

    def _by_template(self, payloads: list[bytes], i: int, fit: Fit, bulk: bool, t_ns: int) -> int:
        """Count the events from ``payloads[i]`` that fit the template: a run of them in
        one go if ``bulk`` and there is one, else one by one; the index of the first
        that does not fit (it must be decoded)."""
        if bulk:
            i = self._run(payloads, i, fit, t_ns)
        n = len(payloads)
        while i < n:
            payload = payloads[i]
            m = len(payload)  # the fit test, inlined as in feed
            if m < fit.least or not payload.startswith(fit.pre) or not payload.endswith(fit.suf):
                return i
            text = plain(payload[fit.lo : m - fit.hi])
            if text is None:
                return i
            if text:
                self._ns.append(t_ns)
                if self._tokens is not None:
                    self._tokens.append(1)
                if self._collect:
                    self._kept(text)
            i += 1
        return n

    def _by_usage_template(self, payloads: list[bytes], i: int, utpl: UsageTemplate, t_ns: int) -> int:
        """Count the events from ``payloads[i]`` that fit the usage template, one by one;
        the index of the first that does not fit (it must be decoded)."""
        pre, lo, mid, after, rest, prompt = utpl.pre, utpl.lo, utpl.mid, utpl.mid_len, utpl.rest, utpl.prompt
        n = len(payloads)
        while i < n:
            payload = payloads[i]
            if not payload.startswith(pre):
                return i
            # The body ends at the first quote if it is plain (_running_chunk checks it is);
            # mid starts there. (None: -1, and mid, of two bytes or more, cannot start there.)
            # One find of the quote and a compare cost a third of one find of mid (measured).
            end = payload.find(b'"', lo)
            if not payload.startswith(mid, end):
                return i
            m = rest(payload, end + after)
            if m is None or not self._running_chunk(payload[lo:end], m[1], prompt, t_ns):
                return i
            i += 1
        return n

    def _end(self) -> None:
        """[DONE]: the stream is over, and no later read is counted from its bytes."""
        self.done = True
        self._tpl = self._framed = self._utpl = None

    def _learn(self, payload: bytes, obj: dict[str, Any], running: bool) -> None:
        """Take ``payload`` as the template of this stream's content chunks, if it makes
        one: with ``running`` usage on it, a usage template (usage_template.py)."""
        route = self._route
        if route is not None and not running and (known := route.fitting(payload)) is not None:
            return self._taught(known)  # the route's, proven for this chunk: no probe
        holder = content_holder(obj, self._chat)
        if holder is None:
            return  # not a content chunk (reasoning, say): no try spent, so content still gets one
        self._learns -= 1  # a failed try counts too: a server whose chunks never fit stops costing
        if running:
            utpl = learn_usage(payload, obj, holder, self._chat)
            if utpl is not None:
                self._utpl = utpl
            return
        template = learn(payload, obj, holder, self._chat)
        if template is not None:
            self._taught(template)
            if route is not None:
                route.template = template

    def _taught(self, template: Template) -> None:
        self._tpl, self._framed = template, template.framed
        if template.framed is not None:
            # two events take twice the shortest; one over the size cap goes to the parser (it raises)
            self._one = min(2 * template.framed.least, self._many + 1)

    def _leniently(self, payload: bytes, refused: str) -> Any:
        """An event orjson refused: ``[DONE]`` (``_DONE``) or nothing (``_SKIP``), else its object,
        decoded leniently (chunk_errors.py) with its oddities noted; ``BadStream`` if it is
        not JSON even so."""
        stripped = payload.strip()
        if stripped == b"[DONE]":
            self._end()
            return _DONE
        if not stripped:
            return _SKIP  # an empty data: event carries nothing and is not worth failing over
        got = loads_leniently(payload, refused)
        if got is None:
            raise not_json(payload)
        self._lenient = True
        for kind, message in got.problems:
            self._problems.flag(kind, message)
        return got.obj
