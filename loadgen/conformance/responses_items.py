"""The pure verdicts of ``loadgen check --api responses`` on a streamed Responses answer.

Each takes a ``ResponsesStream`` already read (responses_stream.py) and returns (status,
evidence), with no I/O, as the chat verdicts do (check_items.py; the levels are there:
``LEVELS``). A verdict may say ``warn`` for a lesser fault of a fail-level item: an event
without its ``event:`` line (the official client reads the ``data``), a gap in the
sequence numbers, a ``data: [DONE]`` after the terminal event (not this API's; the
official client stops at it), a ``.done`` event left out.

The usage and length verdicts are the chat ones (check_tokens.py): a ``ResponsesStream``
says ``usage.output_tokens`` where a chat stream says ``completion_tokens``.
"""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.conformance.check_items import combine, transport_problem
from loadgen.conformance.responses_stream import ResponsesStream
from loadgen.untrusted import token_count

__all__ = ["responses_framing", "event_shape", "responses_usage", "text_done", "function_call"]


def responses_framing(s: ResponsesStream) -> tuple[str, str]:
    """JSON event objects, exactly one terminal event and nothing after it, some output."""
    problem = transport_problem(s)
    if problem:
        return "fail", problem
    if s.bad_events:
        example = s.wire.text(s.bad_events[0].decode("utf-8", "replace"), 60)
        return "fail", f"{len(s.bad_events)} non-JSON event(s), e.g. {example!r}"
    shapeless = [e.obj for e in s.events if not isinstance(e.obj, dict)]
    if shapeless:
        return "fail", f"{len(shapeless)} event(s) not a JSON object, e.g. {s.wire.text(orjson.dumps(shapeless[0]))}"
    n = len(s.events)
    if not s.terminal:
        return "fail", (
            f"ended without a terminal event (response.completed / incomplete / failed) after {n} events "
            "(cut: loadgen run records it disconnected)"
        )
    final = s.final or {}
    if final.get("type") == "response.failed":
        response = final.get("response")
        err = response.get("error") if isinstance(response, dict) else None
        said = err.get("message") if isinstance(err, dict) else None
        return "fail", f"response.failed: {s.wire.text(said or 'no error message', 200)}"
    after = s.after_terminal
    if after:
        kinds = sorted({str(e.obj.get("type")) for e in after if isinstance(e.obj, dict)})
        shown = ", ".join(s.wire.text(k, 60) for k in kinds[:3])
        return "fail", f"{len(after)} event(s) after {final.get('type')} ({shown}); exactly one terminal event ends it"
    if s.strict_error:
        return "fail", f"the stream does not parse: {s.strict_error}"
    if not s.token_ns:
        return "fail", "no event carried output (no non-empty output_text, reasoning or argument delta)"
    seen = f"{n} events ({len(s.chunk_ns)} output deltas), then {final.get('type')}"
    if s.done_markers:
        return "warn", f"{seen}, then data: [DONE] (not part of the Responses API; the openai client stops at it)"
    return "pass", seen


def event_shape(s: ResponsesStream) -> tuple[str, str]:
    """Each event's ``type`` a string, its ``event:`` line the same, ``sequence_number`` 0, 1, 2, …"""
    problem = transport_problem(s)
    if problem:
        return "fail", problem
    objs = [e.obj for e in s.events if isinstance(e.obj, dict)]
    if not objs:
        return "fail", "no JSON event object"
    verdicts: list[tuple[str, str]] = []
    typeless = sum(not isinstance(o.get("type"), str) for o in objs)
    if typeless:
        verdicts.append(("fail", f"{typeless} event(s) without a string type"))
    verdicts += _sequence(objs, s)
    named = [(e.name, e.obj.get("type")) for e in s.events if isinstance(e.obj, dict)]
    wrong = [(n, t) for n, t in named if n is not None and n != t]
    if wrong:
        n, t = wrong[0]
        shown = f"{s.wire.text(n, 60)!r} for {s.wire.text(t, 60)!r}"
        verdicts.append(("fail", f"{len(wrong)} event: line(s) naming another type, e.g. {shown}"))
    missing = sum(n is None for n, _ in named)
    if missing:
        verdicts.append(("warn", f"{missing} of {len(named)} events without an event: line"))
    if not verdicts:
        return (
            "pass",
            f"{len(objs)} events, each typed and named by its event: line, sequence_number 0..{len(objs) - 1}",
        )
    return combine(verdicts)


def _sequence(objs: list[dict[str, Any]], s: ResponsesStream) -> list[tuple[str, str]]:
    """The sequence numbers' faults: not integers, not from 0, not increasing (fail); gaps (warn)."""
    seqs = [o.get("sequence_number") for o in objs]
    bad = sum(not isinstance(q, int) or isinstance(q, bool) for q in seqs)
    if bad:
        return [("fail", f"{bad} of {len(seqs)} events without an integer sequence_number")]
    nums: list[int] = [q for q in seqs if isinstance(q, int)]
    if nums[0] != 0:
        return [("fail", f"sequence_number starts at {nums[0]}, not 0")]
    back = next((i for i in range(1, len(nums)) if nums[i] <= nums[i - 1]), None)
    if back is not None:
        kind = s.wire.text(objs[back].get("type"), 60)
        return [("fail", f"sequence_number out of order: {nums[back]} after {nums[back - 1]} (event {back}, {kind})")]
    if nums[-1] != len(nums) - 1:
        return [("warn", f"sequence_number skips: {len(nums)} events numbered up to {nums[-1]}")]
    return []


def responses_usage(s: ResponsesStream) -> tuple[str, str]:
    """The terminal event's ``response.usage``: possible input and output token counts, and a
    ``total_tokens``, when given, that is their sum."""
    if not s.ok():
        return "fail", s.wire.brief()
    if not s.terminal:
        return "fail", "no terminal event, so no usage"
    usage = s.usage or {}
    pt, ct = s.prompt_tokens, s.completion_tokens
    if pt is None or ct is None:
        why = [r for k in ("input_tokens", "output_tokens") if (r := token_count(usage.get(k), k)[1])]
        said = f" ({'; '.join(why)})" if why else ""
        return "fail", f"no response.usage with possible input/output token counts on the terminal event{said}"
    total = token_count(usage.get("total_tokens"), "total_tokens")[0]
    if "total_tokens" in usage and total != pt + ct:
        return "fail", f"total_tokens {s.wire.text(usage.get('total_tokens'), 20)} != input {pt} + output {ct}"
    return "pass", f"input_tokens {pt}, output_tokens {ct}"


def text_done(s: ResponsesStream) -> tuple[str, str]:
    """Each text part's ``output_text.done`` text, its ``output_item.done`` text and the terminal
    response's text equal the part's deltas joined (a part left out of a ``.done`` warns)."""
    problem = transport_problem(s)
    if problem:
        return "fail", problem
    if not s.texts:
        return "skip", "no output_text deltas to compare"
    verdicts = []
    for key, joined in s.texts.items():
        said = {"output_text.done": s.text_done.get(key), "output_item.done": _item_text(s.items_done, key)}
        said["the terminal response"] = _item_text(_output_items(s), key)
        verdicts += [_same(s, f"{where} of item {key[0]!r}", got, joined, "text") for where, got in said.items()]
    return combine(verdicts)


def function_call(s: ResponsesStream) -> tuple[str, str]:
    """Each function call's argument deltas joined equal its ``function_call_arguments.done`` and
    ``output_item.done`` arguments; a call is named and has a call_id; skip without a call."""
    problem = transport_problem(s)
    if problem:
        return "fail", problem
    calls = {k: v for k, v in s.items_done.items() if isinstance(v, dict) and v.get("type") == "function_call"}
    keys = list(dict.fromkeys([*s.args, *s.args_done, *((k, None) for k in calls)]))
    if not keys:
        return "skip", "the model answered without a function call (tool_choice 'required' was asked)"
    verdicts = []
    for key in keys:
        joined = s.args.get(key, "")
        item = calls.get(key[0])
        verdicts.append(_same(s, f"function_call_arguments.done of {key[0]!r}", s.args_done.get(key), joined, "args"))
        got = item.get("arguments") if item else None
        verdicts.append(_same(s, f"output_item.done of {key[0]!r}", got, joined, "args"))
        if item and not (isinstance(item.get("name"), str) and isinstance(item.get("call_id"), str)):
            verdicts.append(("warn", f"function call {key[0]!r} without a string name and call_id"))
        if not joined and isinstance(got, str) and got:
            verdicts.append(("fail", f"function call {key[0]!r}: its {len(got)} chars of arguments were not streamed"))
    return combine(verdicts)


def _same(s: ResponsesStream, where: str, got: object, joined: str, what: str) -> tuple[str, str]:
    """One witness of a part against its joined deltas: None (left out) warns, a difference fails."""
    where = s.wire.text(where, 120)
    if got is None:
        return "warn", f"no {where}"
    if got == joined:
        return "pass", f"{where}: {len(joined)} chars, as the deltas"
    if not isinstance(got, str):
        return "fail", f"{where}: {what} is not a string"
    at = next((i for i, (a, b) in enumerate(zip(got, joined, strict=False)) if a != b), min(len(got), len(joined)))
    return "fail", f"{where}: {len(got)} chars, the deltas {len(joined)}; they differ from char {at}"


def _output_items(s: ResponsesStream) -> dict[object, Any]:
    """The terminal response's output items by id."""
    response = (s.final or {}).get("response")
    output = response.get("output") if isinstance(response, dict) else None
    items = [i for i in output if isinstance(i, dict)] if isinstance(output, list) else []
    return {i.get("id"): i for i in items}


def _item_text(items: dict[object, Any], key: tuple[object, object]) -> str | None:
    """The text of the message item ``key[0]``'s content part ``key[1]`` (None when absent)."""
    item = items.get(key[0])
    content = item.get("content") if isinstance(item, dict) else None
    index = key[1] if isinstance(key[1], int) else 0
    if not isinstance(content, list) or not 0 <= index < len(content) or not isinstance(content[index], dict):
        return None
    text = content[index].get("text")
    return text if isinstance(text, str) else None
