"""The check's items, what each proves, and the pure verdicts on what an endpoint sent.

Kept apart from the battery that sends the requests (``check``) so that
``loadgen check --help`` can list the items without loading an HTTP client, and
so each verdict is tested on hand-made exchanges: a verdict takes what was
already read (``exchange``) and returns (status, evidence), with no I/O.

Each item has a level (``LEVELS``): what a nonconformance costs. ``fail``: it breaks
measurement or honesty (the framing every figure is read from, usage that disagrees
with what streamed, max_tokens / ignore_eos not honoured, buffered streaming, the
official client failing). ``warn``: an API deviation loadgen measures through (an
unknown model accepted, as llama.cpp and single-model servers do; error shapes; the
role chunk; stop strings; a non-streamed answer's shape; serving streams one at a
time). A verdict says ``fail`` when the endpoint does not conform; ``item_case`` turns
that into ``warn`` for a warn-level item; ``--strict`` makes a warn fail the check.
A fail-level item may itself say ``warn`` for a lesser fault: a stream that ended with a
finish_reason but no ``[DONE]`` warns in the framing items (``loadgen run`` counts it ok,
``stream_end`` "finish"); one with neither fails (``run``: disconnected).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from loadgen.conformance.arrivals import arrivals, spread
from loadgen.conformance.ci_outputs import Case
from loadgen.untrusted import token_count

if TYPE_CHECKING:
    from loadgen.conformance.exchange import Stream, Wire

__all__ = [
    "ITEMS",
    "RESPONSES_ITEMS",
    "LEVELS",
    "UNKNOWN_MODEL",
    "item_case",
    "combine",
    "framing",
    "transport_problem",
    "role_first",
    "usage_present",
    "non_stream",
    "error_shape",
    "real_streaming",
    "overlap",
    "verdict",
]

ITEMS: dict[str, str] = {
    "models-list": "GET /v1/models answers a list that names the model",
    "chat-stream-framing": "chat stream is well-formed SSE: JSON chunks, ends with [DONE], nothing after",
    "completions-stream-framing": "completions stream is well-formed SSE: JSON chunks, ends with [DONE]",
    "chat-role-first": "the first chat chunk carries the assistant role",
    "usage-present": "stream_options.include_usage yields a usage object with token counts",
    "usage-matches-stream": "usage.completion_tokens equals the tokens actually streamed",
    "max-tokens": "an answer never exceeds max_tokens",
    "ignore-eos": "ignore_eos makes a short-answer prompt produce exactly max_tokens tokens",
    "stop-sequence": "a stop string ends the answer just before it, with finish_reason stop",
    "non-stream-consistent": "a non-streamed answer has content, a finish reason and usage agreeing with the stream",
    "openai-client-stream": "the official openai client consumes chat and completions streams",
    "openai-client-nonstream": "the official openai client consumes non-streamed answers",
    "error-unknown-model": "an unknown model is a 4xx with an OpenAI-style error object",
    "error-prompt-too-long": "an over-long prompt is a 4xx with an OpenAI-style error object",
    "error-malformed-body": "a malformed JSON body is a 4xx with an OpenAI-style error object",
    "real-streaming": "tokens arrive spread over the answer, not in one late burst",
    "concurrent-streams": "several streams progress at once rather than one after another",
}

# The battery of ``loadgen check --api responses`` (check_responses.py), models-list first as above.
RESPONSES_ITEMS: dict[str, str] = {
    "models-list": ITEMS["models-list"],
    "responses-stream-framing": "a Responses stream is well-formed SSE of JSON events, one terminal event "
    "(response.completed / incomplete / failed) last",
    "responses-event-shape": "every event has a type its event: line repeats, and sequence_number counts up from 0",
    "responses-usage-present": "the terminal event carries usage with input_tokens and output_tokens",
    "responses-usage-matches-stream": "usage.output_tokens equals the output deltas actually streamed",
    "responses-max-output-tokens": "an answer never exceeds max_output_tokens",
    "responses-text-done": "each output_text.done (and output_item.done) text is the concatenated deltas",
    "responses-function-call": "a function call's argument deltas concatenated are its .done arguments",
    "responses-openai-client": "the official openai client consumes the Responses stream",
    "responses-real-streaming": "output deltas arrive spread over the answer, not in one late burst",
    "responses-error-unknown-model": "a Responses request for an unknown model is a 4xx with an OpenAI-style "
    "error object",
    "responses-error-malformed-body": "a malformed JSON body to /responses is a 4xx with an OpenAI-style error object",
}

# What a nonconformance of each item costs (see the module): "fail" breaks measurement or honesty.
_FAIL_LEVEL = (
    "chat-stream-framing",
    "completions-stream-framing",
    "usage-matches-stream",
    "max-tokens",
    "ignore-eos",
    "openai-client-stream",
    "openai-client-nonstream",
    "real-streaming",
    "responses-stream-framing",
    "responses-event-shape",
    "responses-usage-matches-stream",
    "responses-max-output-tokens",
    "responses-text-done",
    "responses-function-call",
    "responses-openai-client",
    "responses-real-streaming",
)
UNKNOWN_MODEL = "loadgen-check-no-such-model"  # the model the error items ask for

LEVELS: dict[str, str] = {k: "fail" if k in _FAIL_LEVEL else "warn" for k in {**ITEMS, **RESPONSES_ITEMS}}


def item_case(name: str, status: str, message: str) -> Case:
    """One item's result as a CI case, a ``fail`` of a warn-level item as ``warn``; its
    data says what the item proves and its level."""
    level = LEVELS.get(name, "fail")
    if status == "fail" and level == "warn":
        status = "warn"
    data = {"proves": ITEMS.get(name) or RESPONSES_ITEMS.get(name, ""), "level": level}
    return Case(name=name, status=status, message=message, suite="check", data=data)


def combine(verdicts: list[tuple[str, str]]) -> tuple[str, str]:
    """The worst part (fail, then warn, then inconclusive), skip if every part skipped,
    else pass; evidence of all parts."""
    statuses = [v for v, _ in verdicts]
    worst = next((v for v in ("fail", "warn", "inconclusive") if v in statuses), None)
    status = worst or ("skip" if all(v == "skip" for v in statuses) else "pass")
    return status, "; ".join(m for _, m in verdicts)


def framing(s: Stream) -> tuple[str, str]:
    problem = transport_problem(s)
    if problem:
        return "fail", problem
    if s.strict_error:
        return "fail", f"the stream does not parse: {s.strict_error}"
    if s.bad_events:
        example = s.wire.text(s.bad_events[0].decode("utf-8", "replace"), 60)
        return "fail", f"{len(s.bad_events)} non-JSON event(s), e.g. {example!r}"
    shapeless = [o for o in s.objects if not (isinstance(o, dict) and isinstance(o.get("choices"), list))]
    if shapeless:
        example = s.wire.text(orjson.dumps(shapeless[0]).decode(), 80)
        return "fail", f"{len(shapeless)} chunk(s) without a choices list, e.g. {example}"
    if not s.done and s.finish_reason is None:
        return "fail", (
            f"ended without data: [DONE] or a finish_reason after {len(s.objects)} chunks "
            "(cut: loadgen run records it disconnected)"
        )
    if s.after_done:
        return "fail", f"{s.after_done} event(s) after [DONE]"
    if not s.token_ns:
        return "fail", "no chunk carried output"
    if not s.chunk_ns:
        seen = (
            f"{len(s.objects)} JSON chunks ({len(s.gen_ns)} generated, none with visible text; "
            f"usage says {s.completion_tokens} tokens)"
        )
    else:
        seen = f"{len(s.objects)} JSON chunks ({len(s.chunk_ns)} with output)"
    if not s.done:  # the answer is whole, its framing not: the same rule as ``loadgen run``'s
        return "warn", (
            f"{seen}, finish_reason {s.finish_reason!r}, but the body ended without data: [DONE] "
            "(loadgen run counts it ok, stream_end 'finish')"
        )
    return "pass", f"{seen}, then [DONE]"


def transport_problem(s: Stream) -> str | None:
    """What is wrong with a stream's exchange before its events are read: no 200 answer,
    not an event stream, compressed although identity was asked; None when nothing is."""
    if not s.ok():
        return s.wire.brief()
    if not s.wire.content_type.lower().startswith("text/event-stream"):
        return f"Content-Type {s.wire.text(s.wire.content_type, 60)!r}, not text/event-stream"
    encoding = s.wire.content_encoding.lower()
    if encoding not in ("", "identity"):
        return f"compressed (Content-Encoding: {s.wire.text(encoding, 40)}) although identity was asked"
    return None


def role_first(s: Stream) -> tuple[str, str]:
    if not s.ok():
        return "fail", s.wire.brief()
    for o in s.objects:
        ch = o.get("choices") if isinstance(o, dict) else None
        if ch and isinstance(ch, list) and isinstance(ch[0], dict):
            delta = ch[0].get("delta")
            role = delta.get("role") if isinstance(delta, dict) else None
            if role == "assistant":
                return "pass", "first chunk: delta.role 'assistant'"
            return "fail", f"first chunk's delta has role {s.wire.text(role, 40)!r}, not 'assistant'"
    return "fail", "no chunk with choices"


def usage_present(streams: list[Stream]) -> tuple[str, str]:
    verdicts = []
    for s in streams:
        pt, ct = s.prompt_tokens, s.completion_tokens
        if not s.ok():
            verdicts.append(("fail", f"{s.api}: {s.wire.brief()}"))
        elif pt is not None and ct is not None:
            verdicts.append(("pass", f"{s.api}: prompt_tokens {pt}, completion_tokens {ct}"))
        else:
            u = s.usage or {}
            why = [r for k in ("prompt_tokens", "completion_tokens") if (r := token_count(u.get(k), k)[1])]
            said = f" ({'; '.join(why)})" if why else ""
            verdicts.append(("fail", f"{s.api}: no usage with possible prompt/completion token counts{said}"))
    return combine(verdicts)


def non_stream(w: Wire, a: Stream) -> tuple[str, str]:
    """The non-streamed answer to the first stream's request: content, a finish reason, and
    usage whose numbers agree with the stream's (the prompt is the same, so prompt_tokens
    is). Key sets are not compared: a detail field that is ``null`` (vLLM sends
    ``prompt_tokens_details: null``) is the same as an absent one."""
    data = w.json()
    if w.error or w.status != 200 or not isinstance(data, dict):
        return "fail", w.brief()
    try:
        choice = data["choices"][0]
        content = choice["message"]["content"]
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError):
        return "fail", f"no choices[0].message.content: {w.excerpt(120)}"
    given = data.get("usage")
    usage = _counts(given if isinstance(given, dict) else {})
    problems = []
    if not isinstance(content, str) or not (content or (usage["completion_tokens"] or 0) > 0):
        problems.append("empty content")  # (empty text with tokens in usage is honest: random weights)
    if not isinstance(finish, str):
        problems.append("no finish_reason")
    if any(usage[k] is None for k in _USAGE_KEYS):
        problems.append("usage lacks integer prompt/completion/total tokens")
    else:
        problems += _usage_problems(usage, given if isinstance(given, dict) else {}, a)
    if problems:
        return "fail", "; ".join(w.text(p) for p in problems)
    same = "same text as streamed" if content == a.text else "text differs from the streamed one"
    same += "" if content else " (no visible text)"
    return "pass", (
        f"{len(content)} chars, finish_reason {w.text(finish, 40)!r}, usage {usage['completion_tokens']} tokens; {same}"
    )


_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _counts(usage: dict[str, Any]) -> dict[str, int | None]:
    """The token counts that matter, each a possible count or None."""
    return {k: token_count(usage.get(k), f"usage.{k}")[0] for k in _USAGE_KEYS}


def _usage_problems(usage: dict[str, int | None], raw: dict[str, Any], a: Stream) -> list[str]:
    """Where a non-streamed usage disagrees with itself or with the stream's."""
    problems = []
    pt, ct, total = usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]
    if pt is not None and ct is not None and total is not None and total != pt + ct:
        problems.append(f"total_tokens {total} != prompt_tokens {pt} + completion_tokens {ct}")
    for key in ("prompt_tokens_details", "completion_tokens_details"):
        if raw.get(key) is not None and not isinstance(raw.get(key), dict):
            problems.append(f"usage.{key} is neither an object nor null")
    if a.ok() and a.prompt_tokens is not None and pt != a.prompt_tokens:
        problems.append(f"prompt_tokens {pt} vs {a.prompt_tokens} streamed for the same prompt")
    return problems


def error_shape(w: Wire, what: str = "") -> tuple[str, str]:
    """4xx with ``{"error": {"message": ...}}``, as the openai client expects."""
    if w.error:
        return "fail", w.error
    head = f"{what + ': ' if what else ''}HTTP {w.status}"
    if w.status is None or not 400 <= w.status < 500:
        return "fail", f"{head}, expected 4xx: {w.excerpt(100)}"
    data = w.json()
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        kind = err.get("type") or err.get("code") or "-"
        return "pass", f"{head}, error.type {w.text(kind, 40)!r}: {w.text(err['message'], 100)}"
    return "fail", f"{head} but not an OpenAI error object: {w.excerpt(100)}"


def real_streaming(s: Stream) -> tuple[str, str]:
    """Output chunks must arrive in many separate reads spread over the answer: a
    buffering server or proxy delivers them in one burst at the end.

    PASS on what was read (a stall of the client can hide spread, never make it);
    FAIL only when even the spread the client's stalls could have hidden falls short,
    so a burst of the client's own making (a busy machine) is INCONCLUSIVE, not FAIL.
    """
    if not s.ok():
        return "fail", s.wire.brief()
    a = arrivals(s)
    if a.chunks < 8:
        return "skip", f"only {a.chunks} output chunks; too short to judge"
    if spread(a.reads, a.span_ns, a):
        return "pass", a.evidence()
    if not spread(a.reads_max, a.span_max_ns, a):
        return "fail", a.evidence() + " (buffered: arrives in a burst)"
    return "inconclusive", (
        f"{a.evidence()}: too few separate reads to show streaming, but {a.stalls()}, so chunks may have "
        "waited unread in its socket; rerun on an idle machine"
    )


def overlap(streams: list[Stream]) -> tuple[str, str]:
    """All first tokens before any stream finished: they were served together.

    Answers that arrived in bursts (buffered) cannot tell, and neither can a client
    whose event loop stalled: what would fail is INCONCLUSIVE then. A stream whose
    chunks carry no visible text streamed all the same when usage counts its tokens
    (``Stream.token_ns``).
    """
    bad = [s for s in streams if not s.ok() or not s.token_ns]
    if bad:
        return "fail", f"{len(bad)} of {len(streams)} streams failed or streamed nothing: {bad[0].brief()}"
    seen = [arrivals(s) for s in streams]
    burst = [a for a in seen if not spread(a.reads_max, a.span_max_ns, a, min_reads=2)]
    if len(burst) > len(streams) // 2:
        return "skip", f"{len(burst)} of {len(streams)} answers arrived in bursts (buffered); token times cannot tell"
    status, evidence = _together(streams)
    busiest = max(seen, key=lambda a: a.stalled_ns)
    if status == "fail" and busiest.longest_stall_ns:
        return "inconclusive", f"{evidence}, but {busiest.stalls()}: token times cannot tell"
    return status, evidence


def _together(streams: list[Stream]) -> tuple[str, str]:
    """Pass when every stream had a token before any finished, else by the peak of streams in progress."""
    first = [s.token_ns[0] for s in streams]
    done = [s.wire.t_done for s in streams]
    n = len(streams)
    if max(first) < min(done):
        return "pass", f"all {n} streams had a token before any finished"
    events = sorted([(t, 1) for t in first] + [(t, -1) for t in done])
    active = peak = 0
    for _, d in events:
        active += d
        peak = max(peak, active)
    if peak <= 1:
        return "fail", f"the {n} streams were served one at a time"
    return "pass", f"at most {peak} of {n} streams progressed at once (a concurrency limit on the server?)"


def verdict(cases: list[Case], strict: bool) -> tuple[str, int]:
    """The check's status and exit code: 1 when an item failed (or warned, when strict), else 0;
    the status is ``warn`` when something warned and nothing failed. An inconclusive item
    (the client too busy to judge) fails nothing."""
    statuses = {c.status for c in cases}
    if "fail" in statuses or (strict and "warn" in statuses):
        return "fail", 1
    return ("warn" if "warn" in statuses else "pass"), 0
