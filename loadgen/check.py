"""``loadgen check``: is this endpoint OpenAI-compatible, and honest about what it streams?

A battery of small requests, each item pass / fail / skip with evidence. It runs
before a bake-off because every figure loadgen reports rests on these: TTFT
needs real streaming, token throughput needs truthful ``usage``, fixed-length
traffic needs ``max_tokens`` and ``ignore_eos`` honoured. Each item says what it
proves in ``ITEMS``; docs/conformance.md says more.

Requests are read off the socket with their read times and parsed by the same
SSE parser and stream interpreter the engine uses, strictly for the framing
items and leniently (malformed events dropped) for the rest, so one fault fails
the item it concerns rather than every item. Everything the endpoint sends is
clipped before it becomes evidence; every request has a timeout.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from .ci_outputs import Case, Outcome, clip
from .runner import endpoint_label
from .sse import BadStream, SSEParser
from .stream import StreamTally
from .tokenizer import Tokenizer

__all__ = ["ITEMS", "CheckOptions", "Wire", "Stream", "run_check"]

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
    "non-stream-consistent": "a non-streamed answer has content, a finish reason and the same usage shape",
    "openai-client-stream": "the official openai client consumes chat and completions streams",
    "openai-client-nonstream": "the official openai client consumes non-streamed answers",
    "error-unknown-model": "an unknown model is a 4xx with an OpenAI-style error object",
    "error-prompt-too-long": "an over-long prompt is a 4xx with an OpenAI-style error object",
    "error-malformed-body": "a malformed JSON body is a 4xx with an OpenAI-style error object",
    "real-streaming": "tokens arrive spread over the answer, not in one late burst",
    "concurrent-streams": "several streams progress at once rather than one after another",
}

LONG_PROMPT = ("Write a long story about a lighthouse keeper who finds a message in a bottle. "
               "Use many short sentences.")
# Prompts a model answers in a word or two, so only ignore_eos can make them long.
SHORT_PROMPTS = ("Reply with the single word done.", "Say hello and nothing else.",
                 "Answer with just the word OK.")
_MAX_BODY = 16 << 20
_BAD_MODEL = "loadgen-check-no-such-model"


@dataclass(frozen=True)
class CheckOptions:
    """What to check and how long to wait; ``url`` is the OpenAI base URL (…/v1)."""

    url: str
    model: str | None = None
    api_key: str | None = None
    tokenizer: Tokenizer | None = None
    timeout_s: float = 60.0
    streams: int = 8
    max_tokens: int = 64
    context_len: int | None = None  # for the over-long prompt; else asked of the endpoint


@dataclass
class Wire:
    """One HTTP exchange as read off the socket: every read with its perf_counter_ns time."""

    status: int | None = None
    content_type: str = ""
    t_sent: int = 0
    t_done: int = 0
    reads: list[tuple[int, bytes]] = field(default_factory=list)
    error: str | None = None

    @property
    def body(self) -> bytes:
        return b"".join(d for _, d in self.reads)

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None

    def brief(self) -> str:
        if self.error:
            return self.error
        return f"HTTP {self.status}: {clip(self.body.decode('utf-8', 'replace'), 160)}"


@dataclass
class Stream:
    """A streamed answer: strict framing verdict plus a lenient reading of its JSON events."""

    wire: Wire
    api: str
    strict_error: str | None = None
    done: bool = False
    after_done: int = 0
    bad_events: list[bytes] = field(default_factory=list)
    objects: list[Any] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    tally: StreamTally | None = None
    interp_error: str | None = None

    @classmethod
    def read(cls, wire: Wire, api: str) -> Stream:
        s = cls(wire, api)
        strict = StreamTally(api)
        lenient = StreamTally(api, keep_text=True)
        s.tally = lenient
        parser = SSEParser()
        try:
            for t, data in wire.reads:
                strict.feed(data, t)
        except BadStream as e:
            s.strict_error = clip(str(e), 160)
        events: list[tuple[int, bytes]] = []
        try:
            for t, data in wire.reads:
                events += [(t, p) for p in parser.feed(data)]
            events += [(wire.t_done, p) for p in parser.close()]
        except BadStream as e:
            s.strict_error = s.strict_error or clip(str(e), 160)
        for t, payload in events:
            s._event(t, payload, lenient)
        return s

    def _event(self, t: int, payload: bytes, lenient: StreamTally) -> None:
        if self.done:
            self.after_done += 1
            return
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.bad_events.append(payload[:80])
            return
        self.objects.append(obj)
        if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if self.interp_error is None:
            try:
                lenient.feed(b"data: " + payload + b"\n\n", t)
            except BadStream as e:
                self.interp_error = clip(str(e), 160)

    @property
    def text(self) -> str:
        return self.tally.text if self.tally else ""

    @property
    def chunk_ns(self) -> list[int]:
        return self.tally.chunk_ns if self.tally else []

    @property
    def finish_reason(self) -> str | None:
        return self.tally.finish_reason if self.tally else None

    @property
    def completion_tokens(self) -> int | None:
        ct = (self.usage or {}).get("completion_tokens")
        return ct if isinstance(ct, int) and not isinstance(ct, bool) else None

    def ok(self) -> bool:
        return self.wire.error is None and self.wire.status == 200

    def brief(self) -> str:
        if not self.ok():
            return self.wire.brief()
        return (f"{len(self.chunk_ns)} output chunks, usage completion_tokens={self.completion_tokens}, "
                f"finish_reason={self.finish_reason!r}")


class Checker:
    """Runs the battery against one endpoint; ``run`` returns one Case per item."""

    def __init__(self, opts: CheckOptions, http: aiohttp.ClientSession) -> None:
        self.o = opts
        self.http = http
        self.model: str | None = opts.model
        self.models_json: Any = None

    # -- wire ---------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.o.api_key:
            h["Authorization"] = f"Bearer {self.o.api_key}"
        return h

    async def request(self, method: str, url: str, body: bytes | None = None) -> Wire:
        w = Wire(t_sent=time.perf_counter_ns())
        try:
            async with self.http.request(method, url, data=body, headers=self._headers()) as resp:
                w.status, w.content_type = resp.status, resp.headers.get("Content-Type", "")
                size = 0
                async for data in resp.content.iter_any():
                    w.reads.append((time.perf_counter_ns(), data))
                    size += len(data)
                    if size > _MAX_BODY:
                        w.error = f"answer longer than {_MAX_BODY >> 20} MiB; stopped reading"
                        break
        except asyncio.TimeoutError:
            w.error = f"no complete answer within {self.o.timeout_s:g} s"
        except (aiohttp.ClientError, OSError) as e:
            w.error = f"{type(e).__name__}: {clip(e, 160)}"
        w.t_done = time.perf_counter_ns()
        return w

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
        return Stream.read(await self.request("POST", self.o.url + path, self.body(api, prompt, **extra)), api)

    # -- the battery ----------------------------------------------------------------------
    async def run(self) -> list[Case]:
        cases = [await self._timed("models-list", self.models_list)]
        if self.model is None:
            return cases + [_case(k, "skip", "no model to ask for: pass --model") for k in ITEMS if k != "models-list"]
        a = await self.stream("chat", LONG_PROMPT)  # alone, so its timing is undisturbed
        b_task = asyncio.gather(
            self.stream("completions", LONG_PROMPT),
            self.request("POST", self.o.url + "/chat/completions", self.body("chat", LONG_PROMPT, stream=False)),
        )
        items: list[tuple[str, Callable[[], Awaitable[Case]]]] = [
            ("ignore-eos", self.ignore_eos), ("stop-sequence", lambda: self.stop_sequence(a)),
            ("openai-client-stream", self.openai_stream), ("openai-client-nonstream", self.openai_nonstream),
            ("error-unknown-model", self.error_unknown_model), ("error-prompt-too-long", self.error_too_long),
            ("error-malformed-body", self.error_malformed),
        ]
        results = await asyncio.gather(b_task, *(self._timed(k, f) for k, f in items))
        (b, c_wire), rest = results[0], list(results[1:])
        cases += [
            _case("chat-stream-framing", *framing(a)),
            _case("completions-stream-framing", *framing(b)),
            _case("chat-role-first", *role_first(a)),
            _case("usage-present", *usage_present([a, b])),
            _case("usage-matches-stream", *self.usage_matches([a, b])),
            _case("max-tokens", *self.max_tokens(a)),
            _case("non-stream-consistent", *non_stream(c_wire, a)),
            *rest,
            _case("real-streaming", *real_streaming(a)),
            await self._timed("concurrent-streams", self.concurrent),
        ]
        order = list(ITEMS)
        return sorted(cases, key=lambda c: order.index(c.name))

    async def _timed(self, name: str, fn: Callable[[], Awaitable[Case]]) -> Case:
        t0 = time.perf_counter()
        try:
            case = await fn()
        except Exception as e:  # an item's own bug or an endpoint oddity must not end the battery
            case = _case(name, "fail", f"check raised {type(e).__name__}: {clip(e, 160)}")
        return Case(case.name, case.status, case.message, case.suite, case.cells, case.data,
                    time.perf_counter() - t0)

    async def models_list(self) -> Case:
        w = await self.request("GET", self.o.url + "/models")
        data = w.json() if w.status == 200 else None
        ids = []
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            ids = [str(m.get("id")) for m in data["data"] if isinstance(m, dict) and m.get("id") is not None]
            self.models_json = data
        if not ids:
            return _case("models-list", "fail", f"no model list: {w.brief()}")
        if self.model is None:
            self.model = ids[0]
            return _case("models-list", "pass", f"lists {len(ids)} model(s); using {clip(ids[0], 80)!r}")
        if self.model in ids:
            return _case("models-list", "pass", f"lists {clip(self.model, 80)!r} among {len(ids)} model(s)")
        shown = ", ".join(clip(i, 60) for i in ids[:5])
        return _case("models-list", "fail", f"{clip(self.model, 80)!r} is not listed (lists: {shown})")

    def count(self, s: Stream) -> tuple[int, str]:
        """Tokens streamed: by the tokenizer if given, else output chunks (a lower bound:
        a chunk carries at least one token)."""
        if self.o.tokenizer is not None:
            return self.o.tokenizer.count(s.text), "tokenizer"
        return len(s.chunk_ns), "output chunks"

    def usage_matches(self, streams: list[Stream]) -> tuple[str, str]:
        verdicts = []
        for s in streams:
            ct, (n, how) = s.completion_tokens, self.count(s)
            if not s.ok() or ct is None:
                verdicts.append(("skip", f"{s.api}: no usage to compare"))
            elif how == "tokenizer":
                ok = abs(ct - n) <= max(2, round(0.03 * n))
                verdicts.append(("pass" if ok else "fail", f"{s.api}: usage {ct}, tokenizer counts {n}"))
            elif ct == n:
                verdicts.append(("pass", f"{s.api}: usage {ct} = {n} output chunks"))
            elif ct < n:
                verdicts.append(("fail", f"{s.api}: usage {ct} < {n} output chunks (under-reports)"))
            else:
                verdicts.append(("skip", f"{s.api}: usage {ct} > {n} chunks; chunks may carry several tokens "
                                         "(pass --tokenizer to verify)"))
        return _combine(verdicts)

    def max_tokens(self, a: Stream) -> tuple[str, str]:
        if not a.ok():
            return "fail", a.wire.brief()
        limit, (n, how), ct = self.o.max_tokens, self.count(a), a.completion_tokens
        over = [f"{how} {n}"] if n > limit + (1 if how == "tokenizer" else 0) else []
        over += [f"usage {ct}"] if ct is not None and ct > limit else []
        if over:
            return "fail", f"max_tokens {limit}, but {' and '.join(over)}"
        return "pass", f"max_tokens {limit}: {how} {n}, usage {ct}, finish_reason {a.finish_reason!r}"

    async def ignore_eos(self) -> Case:
        n = self.o.max_tokens
        got = await asyncio.gather(*(self.stream("chat", p, ignore_eos=True) for p in SHORT_PROMPTS))
        verdicts = []
        for i, s in enumerate(got):
            if not s.ok():
                verdicts.append(("fail", f"prompt {i + 1}: {s.wire.brief()}"))
                continue
            k, how = self.count(s)
            if k == n or (k < n and how == "output chunks" and s.completion_tokens == n):
                verdicts.append(("pass", f"prompt {i + 1}: {n} tokens"))
            else:
                verdicts.append(("fail", f"prompt {i + 1}: asked {n} with ignore_eos, got {how} {k}, usage "
                                         f"{s.completion_tokens}, finish_reason {s.finish_reason!r}"))
        return _case("ignore-eos", *_combine(verdicts))

    async def stop_sequence(self, a: Stream) -> Case:
        text = a.text
        words = [(m.start(), m.group()) for m in re.finditer(r"[A-Za-z]{3,}", text)]
        if not a.ok() or len(words) < 6:
            return _case("stop-sequence", "skip", f"the first answer is too short to pick a stop word ({a.brief()})")
        third = len(words) // 3
        pick = next(((p, w) for p, w in words[third: 2 * third + 1] if text.find(w) == p), None)
        if pick is None:
            return _case("stop-sequence", "skip", "no word in the middle of the answer occurs only once")
        pos, word = pick
        s = await self.stream("chat", LONG_PROMPT, stop=[word])
        if not s.ok():
            return _case("stop-sequence", "fail", f"stop {word!r}: {s.wire.brief()}")
        got, want = s.text, text[:pos]
        if word in got:
            return _case("stop-sequence", "fail", f"stop {word!r} appears in the answer: …{clip(got[-60:], 60)!r}")
        if got.rstrip() == want.rstrip():
            if s.finish_reason == "stop":
                return _case("stop-sequence", "pass", f"ended just before {word!r}, finish_reason 'stop'")
            return _case("stop-sequence", "fail", f"ended before {word!r} but finish_reason {s.finish_reason!r}")
        return _case("stop-sequence", "skip", "the same request gave a different answer (sampling not "
                                               "deterministic at temperature 0?); cannot verify")

    async def _openai(self, name: str, stream: bool) -> Case:
        try:
            import openai
        except ImportError:
            return _case(name, "skip", "the openai package is not installed")
        client = openai.AsyncOpenAI(base_url=self.o.url, api_key=self.o.api_key or "none", max_retries=0,
                                    timeout=self.o.timeout_s)
        msgs = [{"role": "user", "content": LONG_PROMPT}]
        kw: dict[str, Any] = {"model": self.model, "max_tokens": 16}
        try:
            if stream:
                opts = {"stream": True, "stream_options": {"include_usage": True}}
                parts, usage = [], None
                async for ch in await client.chat.completions.create(messages=msgs, **kw, **opts):
                    parts += [c.delta.content or "" for c in ch.choices if c.delta]
                    usage = ch.usage or usage
                ctext = []
                async for ch in await client.completions.create(prompt=LONG_PROMPT, **kw, **opts):
                    ctext += [c.text or "" for c in ch.choices]
                text, comp = "".join(parts), "".join(ctext)
                return _case(name, "pass" if text and comp and usage else "fail", _client_evidence(text, usage, comp))
            r = await client.chat.completions.create(messages=msgs, **kw)
            cr = await client.completions.create(prompt=LONG_PROMPT, **kw)
            text, comp = r.choices[0].message.content or "", cr.choices[0].text or ""
            return _case(name, "pass" if text and comp and r.usage else "fail", _client_evidence(text, r.usage, comp))
        except Exception as e:  # the point is whether the client copes: any exception is the finding
            return _case(name, "fail", f"openai client raised {type(e).__name__}: {clip(e, 160)}")
        finally:
            await client.close()

    async def openai_stream(self) -> Case:
        return await self._openai("openai-client-stream", True)

    async def openai_nonstream(self) -> Case:
        return await self._openai("openai-client-nonstream", False)

    async def error_unknown_model(self) -> Case:
        b = orjson.loads(self.body("chat", "Hello.", stream=False, max_tokens=1))
        b["model"] = _BAD_MODEL
        return _case("error-unknown-model", *error_shape(await self.request(
            "POST", self.o.url + "/chat/completions", orjson.dumps(b))))

    async def error_too_long(self) -> Case:
        limit = self.o.context_len or await self._context_len()
        words = (limit or 200_000) * 11 // 10 + 64
        body = self.body("chat", " the" * words, stream=False, max_tokens=1)
        w = await self.request("POST", self.o.url + "/chat/completions", body)
        if w.status == 200 and limit is None:
            return _case("error-prompt-too-long", "skip", f"accepted a ~{words}-token prompt; context length unknown")
        return _case("error-prompt-too-long", *error_shape(w, f"~{words} tokens"))

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
        return _case("error-malformed-body", *error_shape(await self.request(
            "POST", self.o.url + "/chat/completions", body)))

    async def concurrent(self) -> Case:
        n = self.o.streams
        prompts = [f"{LONG_PROMPT} Name the keeper Keeper {i + 1}." for i in range(n)]
        got = await asyncio.gather(*(self.stream("chat", p, max_tokens=32) for p in prompts))
        return _case("concurrent-streams", *overlap(got))


# --------------------------------------------------------------------------- pure verdicts


def _case(name: str, status: str, message: str) -> Case:
    return Case(name=name, status=status, message=message, suite="check", data={"proves": ITEMS.get(name, "")})


def _client_evidence(text: str, usage: Any, comp: str) -> str:
    return f"chat {len(text)} chars, usage {'present' if usage else 'missing'}; completions {len(comp)} chars"


def _combine(verdicts: list[tuple[str, str]]) -> tuple[str, str]:
    """Fail if any part fails, skip if every part skipped, else pass; evidence of all parts."""
    statuses = [v for v, _ in verdicts]
    status = "fail" if "fail" in statuses else "skip" if all(v == "skip" for v in statuses) else "pass"
    return status, "; ".join(m for _, m in verdicts)


def framing(s: Stream) -> tuple[str, str]:
    if not s.ok():
        return "fail", s.wire.brief()
    if not s.wire.content_type.lower().startswith("text/event-stream"):
        return "fail", f"Content-Type {clip(s.wire.content_type, 60)!r}, not text/event-stream"
    if s.strict_error:
        return "fail", f"the stream does not parse: {s.strict_error}"
    if s.bad_events:
        return "fail", f"{len(s.bad_events)} non-JSON event(s), e.g. {clip(s.bad_events[0], 60)!r}"
    shapeless = [o for o in s.objects if not (isinstance(o, dict) and isinstance(o.get("choices"), list))]
    if shapeless:
        return "fail", f"{len(shapeless)} chunk(s) without a choices list, e.g. {clip(orjson.dumps(shapeless[0]), 80)}"
    if not s.done:
        return "fail", f"ended without data: [DONE] after {len(s.objects)} chunks"
    if s.after_done:
        return "fail", f"{s.after_done} event(s) after [DONE]"
    if not s.chunk_ns:
        return "fail", "no chunk carried output"
    return "pass", f"{len(s.objects)} JSON chunks ({len(s.chunk_ns)} with output), then [DONE]"


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
            return "fail", f"first chunk's delta has role {clip(role, 40)!r}, not 'assistant'"
    return "fail", "no chunk with choices"


def usage_present(streams: list[Stream]) -> tuple[str, str]:
    verdicts = []
    for s in streams:
        u = s.usage or {}
        ints = all(isinstance(u.get(k), int) for k in ("prompt_tokens", "completion_tokens"))
        if not s.ok():
            verdicts.append(("fail", f"{s.api}: {s.wire.brief()}"))
        elif ints:
            verdicts.append(("pass", f"{s.api}: prompt_tokens {u['prompt_tokens']}, completion_tokens "
                                     f"{u['completion_tokens']}"))
        else:
            verdicts.append(("fail", f"{s.api}: no usage with integer prompt/completion tokens"))
    return _combine(verdicts)


def non_stream(w: Wire, a: Stream) -> tuple[str, str]:
    data = w.json()
    if w.error or w.status != 200 or not isinstance(data, dict):
        return "fail", w.brief()
    try:
        choice = data["choices"][0]
        content = choice["message"]["content"]
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError):
        return "fail", f"no choices[0].message.content: {clip(w.body.decode('utf-8', 'replace'), 120)}"
    usage = data.get("usage")
    problems = []
    if not isinstance(content, str) or not content:
        problems.append("empty content")
    if not isinstance(finish, str):
        problems.append("no finish_reason")
    if not isinstance(usage, dict) or not all(isinstance(usage.get(k), int) for k in
                                              ("prompt_tokens", "completion_tokens", "total_tokens")):
        problems.append("usage lacks integer prompt/completion/total tokens")
    elif a.usage is not None:
        if set(usage) != set(a.usage):
            problems.append(f"usage keys {sorted(usage)} differ from the stream's {sorted(a.usage)}")
        if usage.get("prompt_tokens") != a.usage.get("prompt_tokens"):
            problems.append(f"prompt_tokens {usage.get('prompt_tokens')} vs {a.usage.get('prompt_tokens')} streamed")
    if problems:
        return "fail", "; ".join(clip(p, 160) for p in problems)
    same = "same text as streamed" if content == a.text else "text differs from the streamed one"
    return "pass", f"{len(content)} chars, finish_reason {finish!r}, usage {usage['completion_tokens']} tokens; {same}"


def error_shape(w: Wire, what: str = "") -> tuple[str, str]:
    """4xx with ``{"error": {"message": ...}}``, as the openai client expects."""
    if w.error:
        return "fail", w.error
    head = f"{what + ': ' if what else ''}HTTP {w.status}"
    if w.status is None or not 400 <= w.status < 500:
        return "fail", f"{head}, expected 4xx: {clip(w.body.decode('utf-8', 'replace'), 100)}"
    data = w.json()
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        kind = err.get("type") or err.get("code") or "-"
        return "pass", f"{head}, error.type {clip(kind, 40)!r}: {clip(err['message'], 100)}"
    return "fail", f"{head} but not an OpenAI error object: {clip(w.body.decode('utf-8', 'replace'), 100)}"


def real_streaming(s: Stream) -> tuple[str, str]:
    """Output chunks must arrive in many separate reads spread over the answer: a
    buffering server or proxy delivers them in one burst at the end."""
    if not s.ok():
        return "fail", s.wire.brief()
    times = s.chunk_ns
    if len(times) < 8:
        return "skip", f"only {len(times)} output chunks; too short to judge"
    total = s.wire.t_done - s.wire.t_sent
    span = times[-1] - times[0]
    reads = len(set(times))
    evidence = (f"{len(times)} output chunks in {reads} reads over {span / 1e6:.1f} ms "
                f"of a {total / 1e6:.1f} ms answer")
    if reads >= max(4, len(times) // 4) and span >= 0.1 * total:
        return "pass", evidence
    return "fail", evidence + " (buffered: arrives in a burst)"


def overlap(streams: list[Stream]) -> tuple[str, str]:
    """All first tokens before any stream finished: they were served together."""
    bad = [s for s in streams if not s.ok() or not s.chunk_ns]
    if bad:
        return "fail", f"{len(bad)} of {len(streams)} streams failed or streamed nothing: {bad[0].brief()}"
    burst = [s for s in streams if len(set(s.chunk_ns)) < max(2, len(s.chunk_ns) // 4)]
    if len(burst) > len(streams) // 2:
        return "skip", f"{len(burst)} of {len(streams)} answers arrived in bursts (buffered); token times cannot tell"
    first = [s.chunk_ns[0] for s in streams]
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


async def run_check(opts: CheckOptions) -> Outcome:
    """Run the battery; exit code 0 when nothing failed (skips included), else 1."""
    try:
        import openai  # noqa: F401 - imported now, not mid-battery where it would stall the event loop
    except ImportError:
        pass
    timeout = aiohttp.ClientTimeout(total=opts.timeout_s, sock_connect=min(10.0, opts.timeout_s))
    connector = aiohttp.TCPConnector(limit=4 * opts.streams + 16)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=1 << 20) as http:
        checker = Checker(opts, http)
        cases = await checker.run()
    failed = any(c.status == "fail" for c in cases)
    tok = getattr(opts.tokenizer, "name", None) or "none (counts output chunks)"
    header = [("endpoint", endpoint_label(opts.url)), ("model", checker.model or "?"), ("tokenizer", tok)]
    return Outcome(kind="check", title=f"endpoint check: {endpoint_label(opts.url)}",
                   status="fail" if failed else "pass", exit_code=1 if failed else 0, header=header, cases=cases)
