"""``loadgen check``: is this endpoint OpenAI-compatible, and honest about what it streams?

A battery of small requests, each item pass / warn / fail / skip (or inconclusive,
when the client itself was too busy to tell) with evidence: FAIL for what breaks
measurement or honesty, WARN for an API deviation (``check_items.LEVELS``;
``--strict`` fails on a WARN too). It runs
before a bake-off because every figure loadgen reports rests on these: TTFT
needs real streaming, token throughput needs truthful ``usage``, fixed-length
traffic needs ``max_tokens`` and ``ignore_eos`` honoured. Each item says what it
proves in ``ITEMS``; docs/conformance.md says more.

This module runs the battery (``Checker``, ``run_check``) over ``check_client``'s
exchanges (its options, session, capped reads and stale resend); what it reads off
the socket is ``exchange`` (``Wire``, ``Stream``, ``LoopWatch``), the items and
the pure verdicts on them are ``check_items`` (the timing ones on ``arrivals``),
and the two items that go through the official client are ``openai_client``. With
``api="responses"`` the battery is the Responses API's (``check_responses``) instead.
Everything the endpoint sends is untrusted: bodies are read up to a cap, every
request has a timeout, and every text made of them has the run's secrets (its API
key, the credentials in its URL, ``loadgen.redaction``) removed and is cleaned
(``loadgen.untrusted``) before it becomes evidence. A request that a server dropped
unanswered on a reused keep-alive connection is resent, as the engine does, on every
request path (the official client's connections are not reused at all).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from loadgen.client.endpoint import endpoint_label, endpoint_path
from loadgen.conformance.check_client import MAX_STREAM, CheckClient, CheckOptions, check_session
from loadgen.conformance.check_items import (
    ITEMS,
    UNKNOWN_MODEL,
    error_shape,
    framing,
    item_case,
    non_stream,
    overlap,
    real_streaming,
    role_first,
    usage_present,
    verdict,
)
from loadgen.conformance.check_responses import responses_battery, skipped
from loadgen.conformance.check_tokens import ignore_eos, max_tokens, usage_matches
from loadgen.conformance.ci_outputs import Case, Outcome
from loadgen.conformance.exchange import LoopWatch, Stream, Wire
from loadgen.conformance.openai_client import openai_client_item, preload_openai

__all__ = ["Checker", "run_check"]

LONG_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. Use many short sentences."
# Prompts a model answers in a word or two, so only ignore_eos can make them long.
SHORT_PROMPTS = ("Reply with the single word done.", "Say hello and nothing else.", "Answer with just the word OK.")
_EVIDENCE = 1000  # characters of an item's evidence
S = TypeVar("S", bound=Stream)  # a chat or completions Stream, or a ResponsesStream
_RANK = ("fail", "inconclusive", "skip", "pass")  # of a timing item's two measurements, the better stands


class Checker(CheckClient):
    """Runs the battery against one endpoint; ``run`` returns one Case per item."""

    def __init__(self, opts: CheckOptions, http: aiohttp.ClientSession) -> None:
        super().__init__(opts, http)
        self.model: str | None = opts.model  # the model asked for, else the one /v1/models lists
        self.models_json: Any = None  # /v1/models' answer, once read (its context length)

    def body(self, api: str, prompt: str, *, stream: bool = True, **extra: Any) -> bytes:
        b: dict[str, Any] = {"model": self.model, "max_tokens": self.o.max_tokens, "temperature": 0}
        if api == "chat":
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if stream:
            b["stream"] = True
            b["stream_options"] = {"include_usage": True}
        b.update(extra)
        return orjson.dumps(b)

    async def stream(self, api: str, prompt: str, **extra: Any) -> Stream:
        path = "/chat/completions" if api == "chat" else "/completions"
        wire = await self.request(
            "POST", endpoint_path(self.o.url, path), self.body(api, prompt, **extra), cap=MAX_STREAM
        )
        return Stream.read(wire, api)

    # -- the battery ----------------------------------------------------------------------
    async def run(self) -> list[Case]:
        cases = [await self.timed("models-list", self.models_list)]
        if self.o.api == "responses":
            if self.model is None:
                return cases + skipped("no model to ask for: pass --model")
            return cases + await responses_battery(self, LONG_PROMPT)
        if self.model is None:
            return cases + [
                item_case(k, "skip", "no model to ask for: pass --model") for k in ITEMS if k != "models-list"
            ]
        (a,) = await self.watched(self.stream("chat", LONG_PROMPT))  # alone, so its timing is undisturbed
        (b, c_wire), rest = await asyncio.gather(self._second_pair(), self._independent_items(a))
        tok, limit = self.o.tokenizer, self.o.max_tokens
        cases += [
            self.case("chat-stream-framing", *framing(a)),
            self.case("completions-stream-framing", *framing(b)),
            self.case("chat-role-first", *role_first(a)),
            self.case("usage-present", *usage_present([a, b])),
            self.case("usage-matches-stream", *usage_matches([a, b], tok)),
            self.case("max-tokens", *max_tokens(a, limit, tok)),
            self.case("non-stream-consistent", *non_stream(c_wire, a)),
            *rest,
            await self.timed("concurrent-streams", self.concurrent),
        ]
        cases.append(await self.timed("real-streaming", lambda: self.real_streaming(a)))  # last: nothing else runs
        order = list(ITEMS)
        return sorted(cases, key=lambda c: order.index(c.name))

    def case(self, name: str, status: str, message: str) -> Case:
        """An item's case, its evidence (endpoint text) without the check's secrets."""
        return item_case(name, status, self.text(message, _EVIDENCE))

    async def _second_pair(self) -> tuple[Stream, Wire]:
        """The completions stream and the non-streamed chat answer, for the items comparing them."""
        body = self.body("chat", LONG_PROMPT, stream=False)
        return await asyncio.gather(
            self.stream("completions", LONG_PROMPT),
            self.request("POST", endpoint_path(self.o.url, "/chat/completions"), body),
        )

    async def _independent_items(self, a: Stream) -> list[Case]:
        """The items that send their own requests, all at once."""
        items: list[tuple[str, Callable[[], Awaitable[Case]]]] = [
            ("ignore-eos", self.ignore_eos),
            ("stop-sequence", lambda: self.stop_sequence(a)),
            ("openai-client-stream", lambda: self._openai("openai-client-stream", stream=True)),
            ("openai-client-nonstream", lambda: self._openai("openai-client-nonstream", stream=False)),
            ("error-unknown-model", self.error_unknown_model),
            ("error-prompt-too-long", self.error_too_long),
            ("error-malformed-body", self.error_malformed),
        ]
        return list(await asyncio.gather(*(self.timed(k, f) for k, f in items)))

    async def watched(self, *streams: Awaitable[S]) -> list[S]:
        """Streams whose timing is judged, read while a ``LoopWatch`` notes when the client was free."""
        async with LoopWatch() as watch:
            got = await asyncio.gather(*streams)
        for s in got:
            s.wire.looks = watch.looks
        return list(got)

    async def timed(self, name: str, fn: Callable[[], Awaitable[Case]]) -> Case:
        t0 = time.perf_counter()
        try:
            case = await fn()
        except Exception as e:  # an item's own bug or an endpoint oddity must not end the battery
            case = item_case(name, "fail", f"check raised {type(e).__name__}: {e}")
        message = self.text(case.message, _EVIDENCE)  # every item's evidence, whoever made it
        return Case(case.name, case.status, message, case.suite, case.cells, case.data, time.perf_counter() - t0)

    async def _timing(self, name: str, first: tuple[str, str], again: Callable[[], Awaitable[tuple[str, str]]]) -> Case:
        """A timing item's case: a verdict other than pass is measured once more, and the
        better of the two stands (a busy moment of the client, or of the machine, must not
        decide it; a server that buffers does so both times)."""
        if first[0] not in ("fail", "inconclusive"):
            return self.case(name, *first)
        second = await again()
        best = max(first, second, key=lambda v: _RANK.index(v[0]) if v[0] in _RANK else 0)
        other = first if best is second else second
        return self.case(name, best[0], f"{best[1]} (measured twice; the other time: {other[0]})")

    async def real_streaming(self, a: Stream) -> Case:
        async def again() -> tuple[str, str]:
            (s,) = await self.watched(self.stream("chat", LONG_PROMPT))
            return real_streaming(s)

        return await self._timing("real-streaming", real_streaming(a), again)

    async def models_list(self) -> Case:
        w = await self.request("GET", endpoint_path(self.o.url, "/models"))
        data = w.json() if w.status == 200 else None
        ids = []
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            ids = [m.get("id") for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
            self.models_json = data
        if not ids:
            return item_case("models-list", "fail", f"no model list: {w.brief()}")
        if self.model is None:
            self.model = ids[0]  # sent as the endpoint gave it; shown cleaned
            return item_case("models-list", "pass", f"lists {len(ids)} model(s); using {self.text(ids[0], 80)!r}")
        if self.model in ids:
            return item_case("models-list", "pass", f"lists {self.text(self.model, 80)!r} among {len(ids)} model(s)")
        shown = ", ".join(self.text(i, 60) for i in ids[:5])
        return item_case("models-list", "fail", f"{self.text(self.model, 80)!r} is not listed (lists: {shown})")

    async def ignore_eos(self) -> Case:
        got = await asyncio.gather(*(self.stream("chat", p, ignore_eos=True) for p in SHORT_PROMPTS))
        return item_case("ignore-eos", *ignore_eos(list(got), self.o.max_tokens, self.o.tokenizer))

    async def stop_sequence(self, a: Stream) -> Case:
        text = a.text
        words = [(m.start(), m.group()) for m in re.finditer(r"[A-Za-z]{3,}", text)]
        if not a.ok() or len(words) < 6:
            return item_case(
                "stop-sequence", "skip", f"the first answer is too short to pick a stop word ({a.brief()})"
            )
        third = len(words) // 3
        pick = next(((p, w) for p, w in words[third : 2 * third + 1] if text.find(w) == p), None)
        if pick is None:
            return item_case("stop-sequence", "skip", "no word in the middle of the answer occurs only once")
        pos, word = pick
        s = await self.stream("chat", LONG_PROMPT, stop=[word])
        if not s.ok():
            return item_case("stop-sequence", "fail", f"stop {word!r}: {s.wire.brief()}")
        got, want = s.text, text[:pos]
        if word in got:
            tail = self.text(got[-60:], 60)
            return item_case("stop-sequence", "fail", f"stop {word!r} appears in the answer: …{tail!r}")
        if got.rstrip() == want.rstrip():
            if s.finish_reason == "stop":
                return item_case("stop-sequence", "pass", f"ended just before {word!r}, finish_reason 'stop'")
            return item_case("stop-sequence", "fail", f"ended before {word!r} but finish_reason {s.finish_reason!r}")
        return item_case(
            "stop-sequence",
            "skip",
            "the same request gave a different answer (sampling not deterministic at temperature 0?); cannot verify",
        )

    async def _openai(self, name: str, stream: bool) -> Case:
        assert self.model is not None  # run() asks nothing of a model it does not know
        o = self.o
        return await openai_client_item(
            name,
            o.url,
            o.api_key,
            self.model,
            o.timeout_s,
            LONG_PROMPT,
            stream=stream,
            secrets=self.secrets,
            options=o.http,
        )

    async def error_unknown_model(self) -> Case:
        b = orjson.loads(self.body("chat", "Hello.", stream=False, max_tokens=1))
        b["model"] = UNKNOWN_MODEL
        return item_case(
            "error-unknown-model",
            *error_shape(await self.request("POST", endpoint_path(self.o.url, "/chat/completions"), orjson.dumps(b))),
        )

    async def error_too_long(self) -> Case:
        limit = self.o.context_len or await self._context_len()
        words = (limit or 200_000) * 11 // 10 + 64
        body = self.body("chat", " the" * words, stream=False, max_tokens=1)
        w = await self.request("POST", endpoint_path(self.o.url, "/chat/completions"), body)
        if w.status == 200 and limit is None:
            return item_case(
                "error-prompt-too-long", "skip", f"accepted a ~{words}-token prompt; context length unknown"
            )
        return item_case("error-prompt-too-long", *error_shape(w, f"~{words} tokens"))

    async def _context_len(self) -> int | None:
        """The context length, as vLLM-style servers say it: in /v1/models, or /tokenize."""
        for m in (self.models_json or {}).get("data", []):
            if isinstance(m, dict) and m.get("id") == self.model and isinstance(m.get("max_model_len"), int):
                return int(m["max_model_len"])
        parts = urlsplit(self.o.url)
        root = urlunsplit((parts.scheme, parts.netloc, parts.path.rsplit("/v1", 1)[0], "", ""))
        w = await self.request("POST", root + "/tokenize", orjson.dumps({"model": self.model, "prompt": "hi"}))
        data = w.json() if w.status == 200 else None
        value = data.get("max_model_len") if isinstance(data, dict) else None
        return value if isinstance(value, int) and value > 0 else None

    async def error_malformed(self) -> Case:
        body = b'{"model": ' + orjson.dumps(self.model) + b', "messages": [{"role": "user", "content": "hi"}'
        return item_case(
            "error-malformed-body",
            *error_shape(await self.request("POST", endpoint_path(self.o.url, "/chat/completions"), body)),
        )

    async def concurrent(self) -> Case:
        async def measure() -> tuple[str, str]:
            n = self.o.streams
            prompts = [f"{LONG_PROMPT} Name the keeper Keeper {i + 1}." for i in range(n)]
            return overlap(await self.watched(*(self.stream("chat", p, max_tokens=32) for p in prompts)))

        return await self._timing("concurrent-streams", await measure(), measure)


async def run_check(opts: CheckOptions) -> Outcome:
    """Run the battery; exit code 0 when nothing failed (skips and warnings included), else 1."""
    preload_openai()
    async with check_session(opts) as http:
        checker = Checker(opts, http)
        cases = await checker.run()
    status, code = verdict(cases, opts.strict)
    tok = getattr(opts.tokenizer, "name", None) or "none (counts output chunks)"
    header = [
        ("endpoint", endpoint_label(opts.url)),
        ("model", checker.model or "?"),
        ("tokenizer", tok),
        ("WARN", "fails the check (--strict)" if opts.strict else "passes (an API deviation; --strict fails on it)"),
    ]
    warned = sum(c.status == "warn" for c in cases)
    notes = (
        []
        if opts.strict or not warned
        else [f"{warned} item(s) WARN: the endpoint deviates from the OpenAI API in ways loadgen measures through"]
    )
    return Outcome(
        kind="check",
        title=f"endpoint check: {endpoint_label(opts.url)}",
        status=status,
        exit_code=code,
        header=header,
        cases=cases,
        notes=notes,
        secrets=opts.secrets,
    )
