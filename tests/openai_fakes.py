"""Loopback stand-ins for real servers, sending streams shaped as vLLM and llama.cpp send them.

Recorded shapes (tests/../shared/ENDPOINTS.md has the field notes), built here from a
deterministic "model": the answer to a prompt is a fixed sequence of distinct words
(one token each), as long as ``natural`` tokens unless ``max_tokens`` cuts it or
``ignore_eos`` makes it exactly ``max_tokens``; a stop string ends it just before.

- ``vllm``: chat's first chunk ``delta: {role: assistant, content: ""}``; token chunks;
  a finish chunk with ``content: ""``; with include_usage a last chunk with ``choices: []``
  and the usage; ``[DONE]``. Non-streamed usage carries ``prompt_tokens_details: null``
  (null, not absent). An unknown model is a 404 with an OpenAI error object.
  ``empty_content``: every token chunk has ``content: ""`` (random weights), usage still
  counts them.
- ``llamacpp``: chat's first chunk ``delta: {role: assistant, content: null}``; a finish
  chunk with ``delta: {}``; the usage chunk also has a ``timings`` object; on
  ``/v1/completions`` usage rides on the finish chunk. Any model name is accepted.
  ``drop_reused``: a request that arrives on a connection that already served one is
  dropped unanswered (the connection closed), as llama.cpp's close-after-each-stream
  looks to a client that reused the pooled connection.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

__all__ = ["FakeServer", "WORDS"]

WORDS = [
    f"{a}{b}"
    for a in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
    for b in ("red", "blue", "green", "gold", "grey", "pink", "teal", "rust", "sand", "jade")
]  # 80 distinct words of letters only: any one occurs once in an answer of up to 80 tokens
CONTEXT = 4096


def _answer(prompt: str, body: dict[str, Any], natural: int) -> tuple[list[str], str]:
    """(tokens, finish_reason) the fake model gives ``prompt`` under ``body``'s limits."""
    limit = int(body.get("max_tokens") or 10_000)
    n = limit if body.get("ignore_eos") else min(natural, limit)
    start = sum(prompt.encode()) % len(WORDS)
    tokens = [" " + WORDS[(start + i) % len(WORDS)] for i in range(min(n, len(WORDS)))]
    tokens += [" more"] * (n - len(tokens))
    finish = "length" if n == limit else "stop"
    stops = body.get("stop") or []
    for i in range(len(tokens)):
        if any(s in "".join(tokens[: i + 1]) for s in stops):
            return tokens[:i], "stop"
    return tokens, finish


class FakeServer:
    """A vLLM- or llama.cpp-style OpenAI server on loopback (``start``/``stop`` for run_in_thread)."""

    def __init__(
        self,
        style: str,
        *,
        itl_s: float = 0.005,
        empty_content: bool = False,
        drop_reused: bool = False,
        model: str | None = None,
    ) -> None:
        assert style in ("vllm", "llamacpp")
        self.style = style
        self.itl_s = itl_s
        self.empty_content = empty_content
        self.drop_reused = drop_reused
        self.model = model or ("org/vllm-model" if style == "vllm" else "llama-model.gguf")
        self.dropped = 0
        self.served = 0
        self._seen: set[object] = (
            set()
        )  # the connections that served a request (held, so none is mistaken for a new one)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str, port: int) -> None:
        app = web.Application(client_max_size=16 << 20)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/tokenize", self._tokenize)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- helpers
    def _drop(self, request: web.Request) -> bool:
        """Whether to drop this request unanswered (it came on a reused connection)."""
        conn = request.transport
        if self.drop_reused and conn in self._seen:
            self.dropped += 1
            assert request.transport is not None
            request.transport.close()
            return True
        self._seen.add(conn)
        self.served += 1
        return False

    @staticmethod
    def _error(status: int, message: str, kind: str) -> web.Response:
        body = {"error": {"message": message, "type": kind, "code": status}}
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return self._error(400, "could not parse the JSON body", "BadRequestError")
        if not isinstance(body, dict):
            return self._error(400, "the body is not an object", "BadRequestError")
        if self.style == "vllm" and body.get("model") != self.model:
            return self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        return body

    def _usage(self, prompt_n: int, n: int, *, stream: bool) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": prompt_n, "total_tokens": prompt_n + n, "completion_tokens": n}
        if self.style == "vllm" and not stream:
            usage["prompt_tokens_details"] = None
        return usage

    def _timings(self, prompt_n: int, n: int) -> dict[str, Any]:
        return {"prompt_n": prompt_n, "prompt_ms": 3.1, "predicted_n": n, "predicted_ms": n * self.itl_s * 1000}

    # -- routes
    async def _models(self, request: web.Request) -> web.Response:
        entry: dict[str, Any] = {"id": self.model, "object": "model", "owned_by": self.style}
        if self.style == "vllm":
            entry["max_model_len"] = CONTEXT
        return web.json_response({"object": "list", "data": [entry]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        return web.json_response({"tokens": list(range(len(str(body.get("prompt", "")).split())))})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self._drop(request):
            return web.Response()
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
        return await self._generate(request, body, prompt, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        if self._drop(request):
            return web.Response()
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        return await self._generate(request, body, str(body.get("prompt", "")), chat=False)

    async def _generate(
        self, request: web.Request, body: dict[str, Any], prompt: str, chat: bool
    ) -> web.StreamResponse:
        prompt_n = len(prompt.split())
        if prompt_n > CONTEXT:
            kind = "exceed_context_size_error" if self.style == "llamacpp" else "BadRequestError"
            return self._error(400, f"the prompt has {prompt_n} tokens, more than the context {CONTEXT}", kind)
        natural = 2 if len(prompt) < 40 else 200
        tokens, finish = _answer(prompt, body, natural)
        if not body.get("stream"):
            return self._whole(body, tokens, finish, prompt_n, chat)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        usage_asked = bool((body.get("stream_options") or {}).get("include_usage"))
        for chunk in self._chunks(body, tokens, finish, prompt_n, chat, usage_asked):
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if chunk.get("choices") and self.itl_s:
                await asyncio.sleep(self.itl_s)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _chunks(
        self, body: dict[str, Any], tokens: list[str], finish: str, prompt_n: int, chat: bool, usage_asked: bool
    ) -> list[dict[str, Any]]:
        head = {"id": "cmpl-1", "created": int(time.time()), "model": body.get("model")}
        head["object"] = "chat.completion.chunk" if chat else "text_completion"
        n = len(tokens)
        text = [("" if self.empty_content else t) for t in tokens]
        usage = self._usage(prompt_n, n, stream=True)
        out: list[dict[str, Any]] = []
        if chat:
            first = {"role": "assistant", "content": "" if self.style == "vllm" else None}
            out.append({**head, "choices": [{"index": 0, "delta": first, "logprobs": None, "finish_reason": None}]})
            out += [
                {**head, "choices": [{"index": 0, "delta": {"content": t}, "logprobs": None, "finish_reason": None}]}
                for t in text
            ]
            last_delta: dict[str, Any] = {"content": ""} if self.style == "vllm" else {}
            out.append(
                {**head, "choices": [{"index": 0, "delta": last_delta, "logprobs": None, "finish_reason": finish}]}
            )
        else:
            out += [
                {**head, "choices": [{"index": 0, "text": t, "logprobs": None, "finish_reason": None}]} for t in text
            ]
            out.append({**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish}]})
            if self.style == "llamacpp":  # usage rides on the finish chunk, asked or not
                out[-1] |= {"usage": usage, "timings": self._timings(prompt_n, n)}
                return out
        if usage_asked:
            last = {**head, "choices": [], "usage": usage}
            if self.style == "llamacpp":
                last["timings"] = self._timings(prompt_n, n)
            out.append(last)
        return out

    def _whole(self, body: dict[str, Any], tokens: list[str], finish: str, prompt_n: int, chat: bool) -> web.Response:
        text = "".join("" if self.empty_content else t for t in tokens)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
            if self.style == "vllm":
                choice["message"]["reasoning_content"] = None
        else:
            choice["text"] = text
        answer: dict[str, Any] = {
            "id": "cmpl-1",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": self._usage(prompt_n, len(tokens), stream=False),
        }
        if self.style == "llamacpp":
            answer["timings"] = self._timings(prompt_n, len(tokens))
        return web.json_response(answer)
