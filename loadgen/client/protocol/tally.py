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
start TTFT. Reasoning text is output (it is generated, and timed for ITL), but only
``content`` or ``text`` is visible content: ``t_first_content`` is the first chunk
with that. loadgen asks for one choice (n = 1): a choice with another index is not
counted, and said once in ``problems``.

What the endpoint sent is untrusted: every token count is range-checked
(``loadgen.untrusted.token_count``) before it is kept, the finish reason is
``clean_text``'d, and an event that is not strict JSON (``NaN``, invalid UTF-8) is
read leniently (chunk_errors.py). Each bounded or odd value is one line of ``problems``,
once per kind per stream; the request goes on.

How many tokens: when a server sends running usage on every chunk (vLLM
``continuous_usage_stats``), the rise in ``completion_tokens`` is the exact count of
each chunk, which matters because one chunk can carry several tokens (speculative
decoding, stream intervals, detokenizer hold-back). Otherwise each output chunk is
one token until ``reconcile`` spreads the final ``usage`` over them (token_counts.py).
Running usage that goes down is a problem: the highest count is kept.

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
text; anything else is decoded.
"""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.client.protocol.choices import NONE, VISIBLE, carried, finish_reason
from loadgen.client.protocol.chunk_errors import check_error, loads_leniently, not_json, shape_error
from loadgen.client.protocol.sse import BadStream, SSEParser
from loadgen.client.protocol.template import (
    BULK,
    Fit,
    Template,
    content_holder,
    learn,
    plain,
    plain_all,
    read_bodies,
    run_bodies,
)
from loadgen.client.protocol.token_counts import Reconciled, reconcile
from loadgen.client.protocol.usage import Problems, Usage
from loadgen.untrusted import MAX_TEXT_CHARS, clean_text

__all__ = ["StreamTally"]

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_APIS = ("chat", "completions")
_LEARNS = 64  # templates a stream may learn: bounds the cost where they never hit
_SKIP = object()  # an empty event: it carries nothing
_DONE = object()  # [DONE], with spaces around it


class StreamTally:
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

    __slots__ = (
        "api",
        "keep_text",
        "done",
        "chunk_ns",
        "chunk_tokens",
        "finish_reason",
        "t_first_content",
        "problems",
        "events",
        "t_read",
        "_parser",
        "_sse",
        "_chat",
        "_parts",
        "_usage",
        "_problems",
        "_tpl",
        "_framed",
        "_one",
        "_many",
        "_learns",
        "_fr_raw",
        "_lenient",
    )

    def __init__(self, api: str, keep_text: bool = False, max_event_bytes: int = 1 << 20) -> None:
        if api not in _APIS:
            raise ValueError(f"api must be one of {_APIS}, not {api!r}")
        self.api = api
        self.keep_text = keep_text
        self.done = False
        self.chunk_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.finish_reason: str | None = None
        self.t_first_content: int | None = None  # the first chunk with visible content (not reasoning)
        self._problems = Problems()
        self.problems: list[str] = self._problems.lines
        self._usage = Usage(self._problems)
        self.events = 0
        self.t_read = 0  # when the last read arrived (0: none yet), for the engine's idle timeout
        self._parser = SSEParser(max_event_bytes)
        self._sse = self._parser.feed
        self._chat = api == "chat"
        self._parts: list[str] = []
        # The learned content-chunk template (template.py), None until learned and
        # again after [DONE]; its read view apart, as feed looks at it for every read.
        self._tpl: Template | None = None
        self._framed: Fit | None = None
        self._one = 0  # with a template, a read shorter than this holds one event at most, within the cap
        self._many = max_event_bytes + 2  # a read no longer than this holds no event over the size cap
        self._learns = _LEARNS
        self._fr_raw: object = None  # the finish_reason last sent, as sent
        self._lenient = False  # an event was decoded leniently: kept text may hold lone surrogates

    @property
    def prompt_tokens(self) -> int | None:
        """``usage.prompt_tokens``, the last in range (usage.py)."""
        return self._usage.prompt_tokens

    @property
    def completion_tokens(self) -> int | None:
        """``usage.completion_tokens``, the highest in range (usage.py)."""
        return self._usage.completion_tokens

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens``, the last in range."""
        return self._usage.cached_tokens

    @property
    def reasoning_tokens(self) -> int | None:
        """``usage.completion_tokens_details.reasoning_tokens``, the last in range."""
        return self._usage.reasoning_tokens

    @property
    def text(self) -> str:
        """The output text so far (reasoning, content, tool arguments); '' unless keep_text."""
        text = "".join(self._parts)
        if self._lenient:  # a lone surrogate ("\\ud800", read leniently) cannot be stored or written
            text = text.encode("utf-8", "replace").decode()
        return text

    def feed(self, data: bytes, t_ns: int) -> None:
        """Interpret one read; every event it completes is stamped ``t_ns``."""
        self.t_read = t_ns
        framed = self._framed
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
                            self.chunk_ns.append(t_ns)
                            self.chunk_tokens.append(1)
                            if self.keep_text:
                                self._parts.append(text)
                        return
            elif n <= self._many and self._read_of_events(data, t_ns):
                return  # (a longer read may hold an event over the cap: the parser decides)
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
                t_ns = self.chunk_ns[-1] if self.chunk_ns else 0
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
            self.chunk_ns.extend([t_ns] * k)
            self.chunk_tokens.extend([1] * k)
            if self.keep_text:
                self._parts.append(text)
        return True

    def _take(self, payloads: list[bytes], t_ns: int) -> None:
        """Interpret the events the parser completed in one read: those that fit the
        template by ``_by_template``, the others by decoding them here, inline: a call
        per event would cost ~3% of a stream that no template fits (measured)."""
        self.events += len(payloads)
        if self.done:
            return  # anything after [DONE] is not part of the answer
        chat, keep = self._chat, self.keep_text
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
                            if not keep and delta.get("content"):
                                out = VISIBLE
                            else:
                                out = max(out, carried(delta, self._parts if keep else None))
                    else:
                        text = ch.get("text")
                        if text:
                            out = VISIBLE
                            if keep and type(text) is str:
                                self._parts.append(text)
                    fr = ch.get("finish_reason")
                    if fr is not None and fr != self._fr_raw:
                        self._finish_reason(fr)
                usage = obj.get("usage")
            except (AttributeError, TypeError):
                raise BadStream(shape_error(obj, payload)) from None
            if extra is not None and "choices" not in self._problems:
                self._problems.flag("choices", f"extra choices (index {clean_text(extra.get('index'), 40)}) ignored")
            if out:
                self.chunk_ns.append(t_ns)
                if out == VISIBLE and first is None:
                    self.t_first_content = first = t_ns
                k = 1
                if usage:
                    k = self._usage.take(usage, self.chunk_ns)
                elif self._learns and len(choices) == 1:
                    self._learn(payload, obj)
                self.chunk_tokens.append(k)
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
                self.chunk_ns.append(t_ns)
                self.chunk_tokens.append(1)
                if self.keep_text:
                    self._parts.append(text)
            i += 1
        return n

    def _end(self) -> None:
        """[DONE]: the stream is over, and no later read is counted from its bytes."""
        self.done = True
        self._tpl = self._framed = None

    def _learn(self, payload: bytes, obj: dict[str, Any]) -> None:
        """Take ``payload`` as the template of this stream's content chunks, if it makes one."""
        holder = content_holder(obj, self._chat)
        if holder is None:
            return  # not a content chunk (reasoning, say): no try spent, so content still gets one
        self._learns -= 1  # a failed try counts too: a server whose chunks never fit stops costing
        template = learn(payload, obj, holder, self._chat)
        if template is not None:
            self._tpl, self._framed = template, template.framed
            if template.framed is not None:
                # Two events take twice the shortest one; an event over the size cap
                # (its lines, without the blank line) goes to the parser, which raises.
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

    def _finish_reason(self, fr: object) -> None:
        """Keep a finish reason, cleaned (choices.py); a long one is not held on to."""
        self._fr_raw = fr if type(fr) is not str or len(fr) <= MAX_TEXT_CHARS else None
        self.finish_reason = finish_reason(fr, self._problems)

    def reconcile(self) -> Reconciled:
        """Final per-chunk token counts, their total, and where the count came from
        (``token_counts.reconcile``), each within ``[0, MAX_TOKEN_COUNT]``; call it
        before reading ``problems``, as it may add one."""
        u = self._usage
        counted = reconcile(self.chunk_tokens, u.per_chunk, u.carry, u.completion_tokens)
        if u.per_chunk and counted.source == "chunks":
            self._problems.flag("usage.sum", "running usage adds up to an impossible count: one token per chunk kept")
        return counted
