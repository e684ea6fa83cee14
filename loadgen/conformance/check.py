"""``loadgen check``: is this endpoint OpenAI-compatible, and honest about what it streams?

A battery of small requests, each item pass / fail / skip (or inconclusive, when
the client itself was too busy to tell) with evidence. It runs
before a bake-off because every figure loadgen reports rests on these: TTFT
needs real streaming, token throughput needs truthful ``usage``, fixed-length
traffic needs ``max_tokens`` and ``ignore_eos`` honoured. Each item says what it
proves in ``ITEMS``; docs/conformance.md says more.

This module sends the requests (``Checker``, ``run_check``); what it reads off
the socket is ``exchange`` (``Wire``, ``Stream``, ``LoopWatch``), the items and
the pure verdicts on them are ``check_items`` (the timing ones on ``arrivals``),
and the two items that go through the official client are ``openai_client``.
Everything the endpoint sends is clipped before it becomes evidence; every
request has a timeout.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from loadgen.client.endpoint import endpoint_label
from loadgen.conformance.check_items import (
    ITEMS,
    combine,
    error_shape,
    framing,
    item_case,
    non_stream,
    overlap,
    real_streaming,
    role_first,
    usage_present,
)
from loadgen.conformance.ci_outputs import Case, Outcome, clip
from loadgen.conformance.exchange import LoopWatch, Stream, Wire
from loadgen.conformance.openai_client import openai_client_item, preload_openai
from loadgen.workload.tokenizer import Tokenizer

__all__ = ["CheckOptions", "run_check"]

LONG_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. Use many short sentences."
# Prompts a model answers in a word or two, so only ignore_eos can make them long.
SHORT_PROMPTS = ("Reply with the single word done.", "Say hello and nothing else.", "Answer with just the word OK.")
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
        w = await self._exchange(method, url, body)
        if w.status is None and (w.error or "").startswith("ServerDisconnectedError") and not w.reads:
            # The stale keep-alive race, as the engine handles it: the server closed an idle pooled
            # connection as the request went out on it, so nothing was answered; send it once more.
            w = await self._exchange(method, url, body)
        return w

    async def _exchange(self, method: str, url: str, body: bytes | None) -> Wire:
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
            return cases + [
                item_case(k, "skip", "no model to ask for: pass --model") for k in ITEMS if k != "models-list"
            ]
        (a,) = await self.watched(self.stream("chat", LONG_PROMPT))  # alone, so its timing is undisturbed
        (b, c_wire), rest = await asyncio.gather(self._second_pair(), self._independent_items(a))
        cases += [
            item_case("chat-stream-framing", *framing(a)),
            item_case("completions-stream-framing", *framing(b)),
            item_case("chat-role-first", *role_first(a)),
            item_case("usage-present", *usage_present([a, b])),
            item_case("usage-matches-stream", *self.usage_matches([a, b])),
            item_case("max-tokens", *self.max_tokens(a)),
            item_case("non-stream-consistent", *non_stream(c_wire, a)),
            *rest,
            item_case("real-streaming", *real_streaming(a)),
            await self._timed("concurrent-streams", self.concurrent),
        ]
        order = list(ITEMS)
        return sorted(cases, key=lambda c: order.index(c.name))

    async def _second_pair(self) -> tuple[Stream, Wire]:
        """The completions stream and the non-streamed chat answer, for the items comparing them."""
        body = self.body("chat", LONG_PROMPT, stream=False)
        return await asyncio.gather(
            self.stream("completions", LONG_PROMPT), self.request("POST", self.o.url + "/chat/completions", body)
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
        return list(await asyncio.gather(*(self._timed(k, f) for k, f in items)))

    async def watched(self, *streams: Awaitable[Stream]) -> list[Stream]:
        """Streams whose timing is judged, read while a ``LoopWatch`` notes when the client was free."""
        async with LoopWatch() as watch:
            got = await asyncio.gather(*streams)
        for s in got:
            s.wire.looks = watch.looks
        return list(got)

    async def _timed(self, name: str, fn: Callable[[], Awaitable[Case]]) -> Case:
        t0 = time.perf_counter()
        try:
            case = await fn()
        except Exception as e:  # an item's own bug or an endpoint oddity must not end the battery
            case = item_case(name, "fail", f"check raised {type(e).__name__}: {clip(e, 160)}")
        return Case(case.name, case.status, case.message, case.suite, case.cells, case.data, time.perf_counter() - t0)

    async def models_list(self) -> Case:
        w = await self.request("GET", self.o.url + "/models")
        data = w.json() if w.status == 200 else None
        ids = []
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            ids = [str(m.get("id")) for m in data["data"] if isinstance(m, dict) and m.get("id") is not None]
            self.models_json = data
        if not ids:
            return item_case("models-list", "fail", f"no model list: {w.brief()}")
        if self.model is None:
            self.model = ids[0]
            return item_case("models-list", "pass", f"lists {len(ids)} model(s); using {clip(ids[0], 80)!r}")
        if self.model in ids:
            return item_case("models-list", "pass", f"lists {clip(self.model, 80)!r} among {len(ids)} model(s)")
        shown = ", ".join(clip(i, 60) for i in ids[:5])
        return item_case("models-list", "fail", f"{clip(self.model, 80)!r} is not listed (lists: {shown})")

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
                verdicts.append(
                    (
                        "skip",
                        f"{s.api}: usage {ct} > {n} chunks; chunks may carry several tokens "
                        "(pass --tokenizer to verify)",
                    )
                )
        return combine(verdicts)

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
                verdicts.append(
                    (
                        "fail",
                        f"prompt {i + 1}: asked {n} with ignore_eos, got {how} {k}, usage "
                        f"{s.completion_tokens}, finish_reason {s.finish_reason!r}",
                    )
                )
        return item_case("ignore-eos", *combine(verdicts))

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
            return item_case("stop-sequence", "fail", f"stop {word!r} appears in the answer: …{clip(got[-60:], 60)!r}")
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
        return await openai_client_item(name, o.url, o.api_key, self.model, o.timeout_s, LONG_PROMPT, stream=stream)

    async def error_unknown_model(self) -> Case:
        b = orjson.loads(self.body("chat", "Hello.", stream=False, max_tokens=1))
        b["model"] = _BAD_MODEL
        return item_case(
            "error-unknown-model",
            *error_shape(await self.request("POST", self.o.url + "/chat/completions", orjson.dumps(b))),
        )

    async def error_too_long(self) -> Case:
        limit = self.o.context_len or await self._context_len()
        words = (limit or 200_000) * 11 // 10 + 64
        body = self.body("chat", " the" * words, stream=False, max_tokens=1)
        w = await self.request("POST", self.o.url + "/chat/completions", body)
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
            "error-malformed-body", *error_shape(await self.request("POST", self.o.url + "/chat/completions", body))
        )

    async def concurrent(self) -> Case:
        n = self.o.streams
        prompts = [f"{LONG_PROMPT} Name the keeper Keeper {i + 1}." for i in range(n)]
        got = await self.watched(*(self.stream("chat", p, max_tokens=32) for p in prompts))
        return item_case("concurrent-streams", *overlap(got))


async def run_check(opts: CheckOptions) -> Outcome:
    """Run the battery; exit code 0 when nothing failed (skips included), else 1."""
    preload_openai()
    timeout = aiohttp.ClientTimeout(total=opts.timeout_s, sock_connect=min(10.0, opts.timeout_s))
    connector = aiohttp.TCPConnector(limit=4 * opts.streams + 16)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=1 << 20) as http:
        checker = Checker(opts, http)
        cases = await checker.run()
    failed = any(c.status == "fail" for c in cases)
    tok = getattr(opts.tokenizer, "name", None) or "none (counts output chunks)"
    header = [("endpoint", endpoint_label(opts.url)), ("model", checker.model or "?"), ("tokenizer", tok)]
    return Outcome(
        kind="check",
        title=f"endpoint check: {endpoint_label(opts.url)}",
        status="fail" if failed else "pass",
        exit_code=1 if failed else 0,
        header=header,
        cases=cases,
    )
