"""The catalogue of hostile behaviours (tests/hostile.py serves them): name, route, what it does.

Each is an ``async (Request, Response) -> None`` that writes its answer through the
``Response`` (which stops it at the byte cap); the server stops it at the time cap.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import orjson
from hostile_wire import (
    GAP_S,
    HOSTILE_HEADER,
    HOSTILE_TEXT,
    Request,
    Response,
    echo_text,
    error_json,
    make_chunk,
    make_usage,
    normal_stream,
    usage_chunk,
)

__all__ = ["BEHAVIOURS", "Behaviour", "Handler", "behaviour", "models_of", "not_found", "ok", "unknown"]


async def ok(req: Request, out: Response) -> None:
    await out.head()
    await out.events(normal_stream(req))
    await out.end()


Handler = Callable[[Request, Response], Awaitable[None]]


class Behaviour(NamedTuple):
    name: str
    route: str  # completions | models | metrics | connect
    doc: str
    handler: Handler


BEHAVIOURS: dict[str, Behaviour] = {}


def behaviour(name: str, doc: str, route: str = "completions") -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        BEHAVIOURS[name] = Behaviour(name, route, doc, fn)
        return fn

    return register


behaviour("ok", "a well-formed stream: role, one chunk per token, finish, usage, [DONE]")(ok)


# -- untrusted numbers ---------------------------------------------------------------------
def _stream_with_usage(usage: dict[str, Any]) -> Handler:
    async def handler(req: Request, out: Response) -> None:
        await out.head()
        await out.events(normal_stream(req, usage))
        await out.end()

    return handler


behaviour("usage-huge", "usage counts of 3000000000 (above int32)")(
    _stream_with_usage(make_usage(3_000_000_000, 3_000_000_000, 3_000_000_000))
)
behaviour("usage-negative", "negative usage counts")(_stream_with_usage(make_usage(-7, -3, -1)))
behaviour("usage-mismatch", "usage says 1000 tokens for a handful of chunks, prompt 0")(
    _stream_with_usage(make_usage(0, 1000, 5000))
)
behaviour("usage-nonint", "usage counts of the wrong types: a string, a float, a bool")(
    _stream_with_usage(make_usage(3.5, "12", True))
)


@behaviour("usage-decreasing", "running usage on every chunk that counts down (10, 9, 8, ...)")
async def _usage_decreasing(req: Request, out: Response) -> None:
    await out.head()
    payloads = [make_chunk(req, f" tok{i}", usage=make_usage(16, 10 - i)) for i in range(req.tokens)]
    await out.events([*payloads, make_chunk(req, finish="length", usage=make_usage(16, 2)), b"[DONE]"])
    await out.end()


@behaviour("nan-infinity", "NaN, Infinity and -Infinity literals in chunks and usage")
async def _nan(req: Request, out: Response) -> None:
    await out.head()
    body = normal_stream(req)
    body[1] = body[1][:-1] + b',"logprobs":{"x":NaN,"y":-Infinity}}'
    body[-2] = b'{"choices":[],"usage":{"prompt_tokens":NaN,"completion_tokens":Infinity,"total_tokens":-Infinity}}'
    await out.events(body)
    await out.end()


@behaviour("deep-json", "a chunk nested 100000 levels deep (200 KB)")
async def _deep(req: Request, out: Response) -> None:
    await out.head()
    body = normal_stream(req)
    body[1] = body[1][:-1] + b',"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    await out.events(body)
    await out.end()


@behaviour("many-choices", "every chunk carries 10000 output choices (n was 1)")
async def _many_choices(req: Request, out: Response) -> None:
    await out.head()
    choices = [{"index": i, "delta": {"content": "x"}, "finish_reason": None} for i in range(10_000)]
    wide = orjson.dumps({"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "choices": choices})
    await out.events([wide] * req.tokens + normal_stream(req)[-3:])
    await out.end()


# -- framing -------------------------------------------------------------------------------
@behaviour("huge-line", "one 8 MiB SSE line without a newline, then the body ends")
async def _huge_line(req: Request, out: Response) -> None:
    await out.head()
    await out.chunk(b'data: {"choices":[{"index":0,"delta":{"content":"')
    block = b"a" * 65536
    for _ in range(128):
        await out.chunk(block)
    await out.end()


@behaviour("endless-line", "an endless body without a newline (until the cap)")
async def _endless_line(req: Request, out: Response) -> None:
    await out.head()
    await out.chunk(b"data: ")
    block = b"a" * 65536
    while True:
        await out.chunk(block)


@behaviour("binary-garbage", "1 MiB of random bytes as text/event-stream")
async def _garbage(req: Request, out: Response) -> None:
    await out.head()
    rng = random.Random(13)
    for _ in range(16):
        await out.chunk(rng.randbytes(65536))
    await out.end()


def _compressed(encoding: str, wbits: int) -> Handler:
    async def handler(req: Request, out: Response) -> None:
        await out.head(headers=(("Content-Encoding", encoding),))
        z = zlib.compressobj(wbits=wbits)
        for p in normal_stream(req):
            await out.chunk(z.compress(b"data: " + p + b"\n\n") + z.flush(zlib.Z_SYNC_FLUSH))
            await asyncio.sleep(GAP_S)
        await out.chunk(z.flush())
        await out.end()

    return handler


behaviour("gzip", "the normal stream gzip-compressed (Content-Encoding: gzip), whatever was asked")(
    _compressed("gzip", 31)
)
behaviour("deflate", "the normal stream zlib-compressed (Content-Encoding: deflate)")(_compressed("deflate", 15))


@behaviour("http10-close", "HTTP/1.0, no Content-Length: the body ends when the connection closes")
async def _http10(req: Request, out: Response) -> None:
    await out.head(version=b"HTTP/1.0", chunked=False)
    for p in normal_stream(req):
        await out.raw(b"data: " + p + b"\n\n")
        await asyncio.sleep(GAP_S)
    out.close("complete")


@behaviour("trickle", "the normal stream at 1 byte a second")
async def _trickle(req: Request, out: Response) -> None:
    await out.head(chunked=False, version=b"HTTP/1.0")
    for p in normal_stream(req):
        for b in b"data: " + p + b"\n\n":
            await out.raw(bytes((b,)))
            await asyncio.sleep(1.0)
    out.close("complete")


@behaviour("trickle-headers", "the response head at 1 byte every 0.5 s")
async def _trickle_headers(req: Request, out: Response) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    for b in head:
        await out.raw(bytes((b,)))
        await asyncio.sleep(0.5)
    await out.events(normal_stream(req))
    await out.end()


@behaviour("never-answer", "reads the request and never answers (until the cap)")
async def _never(req: Request, out: Response) -> None:
    closed = await out.wait_close(1e9)
    out.close("client closed" if closed else "cap time")


@behaviour("accept-silent", "accepts the connection and never answers; no request is parsed or logged", "connect")
async def _silent(req: Request, out: Response) -> None:
    closed = await out.wait_close(1e9)
    out.close("client closed" if closed else "cap time")


@behaviour("reset-connect", "accepts and resets the connection at once (TCP RST)", "connect")
async def _reset_connect(req: Request, out: Response) -> None:
    out.reset()


@behaviour("reset-mid", "two tokens, then a TCP RST")
async def _reset_mid(req: Request, out: Response) -> None:
    await out.head()
    await out.events(normal_stream(req)[:3])
    out.reset()


@behaviour("close-after-headers", "200 and its headers, then the connection closes")
async def _close_after_headers(req: Request, out: Response) -> None:
    await out.head()
    out.close()


@behaviour("close-after-answer", "a normal answer on a keep-alive connection, then the server closes it")
async def _close_after_answer(req: Request, out: Response) -> None:
    await ok(req, out)
    out.close("complete")


@behaviour("empty-200", "200 text/event-stream with an empty body (Content-Length: 0)")
async def _empty_200(req: Request, out: Response) -> None:
    await out.respond(200, b"", content_type="text/event-stream")


@behaviour("short-body", "Content-Length: 100000, two tokens, then the connection closes")
async def _short_body(req: Request, out: Response) -> None:
    await out.head(headers=(("Content-Length", "100000"),), chunked=False)
    for p in normal_stream(req)[:3]:
        await out.raw(b"data: " + p + b"\n\n")
        await asyncio.sleep(GAP_S)
    out.close()


@behaviour("bad-chunked", "a chunked body whose chunk-size line is not hex")
async def _bad_chunked(req: Request, out: Response) -> None:
    await out.head()
    await out.events(normal_stream(req)[:2])
    await out.raw(b"zz\r\nnot a chunk\r\n")
    out.close()


@behaviour("no-done", "tokens, then a clean end of body without finish_reason or [DONE]")
async def _no_done(req: Request, out: Response) -> None:
    await out.head()
    await out.events(normal_stream(req)[:-3])
    await out.end()


@behaviour("done-then-more", "[DONE], then more tokens and another [DONE]")
async def _done_more(req: Request, out: Response) -> None:
    await out.head()
    await out.events(normal_stream(req) + normal_stream(req)[1:])
    await out.end()


@behaviour("comments-forever", "SSE comments (': keep-alive') every 0.2 s, never any data")
async def _comments(req: Request, out: Response) -> None:
    await out.head()
    while True:
        await out.chunk(b": keep-alive\n\n")
        await asyncio.sleep(0.2)


@behaviour("json-body", "a whole non-streamed chat.completion (application/json) to a streaming request")
async def _json_body(req: Request, out: Response) -> None:
    message = {"role": "assistant", "content": " tok" * req.tokens}
    obj = {"id": "chatcmpl-hostile", "object": "chat.completion", "created": 0, "model": req.model}
    obj |= {"choices": [{"index": 0, "message": message, "finish_reason": "length"}], "usage": make_usage()}
    await out.respond(200, orjson.dumps(obj))


@behaviour("invalid-utf8", "one content chunk holds bytes that are not UTF-8")
async def _bad_utf8(req: Request, out: Response) -> None:
    await out.head()
    body = normal_stream(req)
    body[2] = body[2].replace(b" tok1", b" \xff\xfe\xc3(\xed\xa0\x80 tok1")
    await out.events(body)
    await out.end()


@behaviour("tool-calls", "tool-call deltas (name, then argument fragments), finish_reason tool_calls")
async def _tool_calls(req: Request, out: Response) -> None:
    await out.head()
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    frags = ['{"city', '":"Par', 'is"}']
    deltas = [{"role": "assistant", "tool_calls": [call]}]
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": f}}]} for f in frags]
    body = [make_chunk(req, delta=d) for d in deltas]
    body += [make_chunk(req, finish="tool_calls"), usage_chunk(make_usage(16, 12)), b"[DONE]"]
    await out.events(body)
    await out.end()


# -- HTTP errors ---------------------------------------------------------------------------
@behaviour("http429", "every request: 429 with Retry-After")
async def _429(req: Request, out: Response) -> None:
    await out.respond(429, error_json("Rate limit exceeded", 429), headers=(("Retry-After", "7"),))


@behaviour("http404-json", "404 with an OpenAI-style JSON error message")
async def _404(req: Request, out: Response) -> None:
    await out.respond(404, error_json(f"The model `{req.model}` does not exist.", 404))


@behaviour("http500-html", "500 with a 200 KB HTML page")
async def _500(req: Request, out: Response) -> None:
    page = b"<html><body><h1>Internal Server Error</h1><script>alert(1)</script>" + b"<p>x</p>" * 25_000
    await out.respond(500, page + b"</body></html>", content_type="text/html")


@behaviour("redirect-loop", "307 to itself, for ever")
async def _redirect_loop(req: Request, out: Response) -> None:
    await out.respond(307, b"", headers=(("Location", req.path),))


@behaviour("redirect-echo", "307 to this server's echo-auth behaviour (same origin)")
async def _redirect_echo(req: Request, out: Response) -> None:
    tail = req.path.split("/v1/", 1)[-1]
    await out.respond(307, b"", headers=(("Location", f"/b/echo-auth/v1/{tail}"),))


# -- hostile strings -----------------------------------------------------------------------
@behaviour("markup", "control characters, ANSI, bidi and HTML in model, finish_reason, content and headers")
async def _markup(req: Request, out: Response) -> None:
    headers = (("X-Hostile", HOSTILE_HEADER), ("Server", HOSTILE_HEADER), ("Retry-After", HOSTILE_HEADER))
    await out.head(headers=headers, reason=HOSTILE_HEADER)
    body = [make_chunk(req, HOSTILE_TEXT, model=HOSTILE_TEXT) for _ in range(req.tokens)]
    body += [make_chunk(req, finish=HOSTILE_TEXT, model=HOSTILE_TEXT), usage_chunk(make_usage()), b"[DONE]"]
    await out.events(body)
    await out.end()


@behaviour(
    "markup-fields",
    "escapes and markup in every other string: SSE event/id lines, id, object, system_fingerprint, role, "
    "reasoning, refusal, tool call id/name/arguments, logprobs tokens, stop_reason, usage keys",
)
async def _markup_fields(req: Request, out: Response) -> None:
    h = HOSTILE_TEXT
    await out.head()
    fields: dict[str, Any] = {"id": h, "object": h, "system_fingerprint": h, "created": 2**63 - 1}
    call = {"index": 0, "id": h, "type": h, "function": {"name": h, "arguments": h}}
    deltas = [
        {"role": h, "content": ""},
        {"reasoning_content": h, "reasoning": h},
        {"tool_calls": [call]},
        {"refusal": h},
    ]
    body = [make_chunk(req, delta=d, **fields) for d in deltas]
    logprobs = {"content": [{"token": h, "logprob": -0.1, "bytes": [27, 91], "top_logprobs": [{"token": h}]}]}
    body += [make_chunk(req, f" tok{i}", logprobs=logprobs, **fields) for i in range(req.tokens)]
    body.append(make_chunk(req, finish="stop", stop_reason=h, **fields))
    usage = make_usage() | {h: 1, "completion_tokens_details": {"reasoning_tokens": 2, h: h}}
    body += [usage_chunk(usage), b"[DONE]"]
    sse_head = ("event: " + h + "\nid: " + h + "\nretry: 99999999999999999999\n").encode()
    for p in body:
        await out.chunk(sse_head + b"data: " + p + b"\n\n")
        await asyncio.sleep(GAP_S)
    await out.end()


@behaviour("long-strings", "a 300 KB finish_reason and model id")
async def _long_strings(req: Request, out: Response) -> None:
    await out.head()
    long = "finish-" + "x" * 300_000
    await out.events(normal_stream(req, finish=long, model=long))
    await out.end()


@behaviour("markup-error", "400 whose JSON error message and headers carry control characters and markup")
async def _markup_error(req: Request, out: Response) -> None:
    body = error_json(HOSTILE_TEXT * 20, 400)
    await out.head(400, (("Content-Length", str(len(body))), ("X-Hostile", HOSTILE_HEADER)), chunked=False)
    await out.raw(body)


@behaviour("stream-error", "two tokens, then an in-stream error object with markup in its message")
async def _stream_error(req: Request, out: Response) -> None:
    await out.head()
    await out.events([*normal_stream(req)[:3], error_json(HOSTILE_TEXT, 500)])
    await out.end()


@behaviour("status-weird", "status 999 with a reason phrase of escapes and markup")
async def _status_weird(req: Request, out: Response) -> None:
    await out.head(999, reason=HOSTILE_HEADER)
    await out.events(normal_stream(req))
    await out.end()


@behaviour("header-huge", "a 1 MiB response header value")
async def _header_huge(req: Request, out: Response) -> None:
    await out.head(headers=(("X-Huge", b"h" * (1 << 20)),))
    await out.events(normal_stream(req))
    await out.end()


# -- echoing the key -----------------------------------------------------------------------
@behaviour("echo-auth", "the Authorization header (raw, URL-encoded, base64) in content, model, finish_reason, headers")
async def _echo_auth(req: Request, out: Response) -> None:
    echo = echo_text(req)
    await out.head(headers=(("X-Echo", echo), ("Retry-After", echo)))
    await out.events(normal_stream(req, finish=echo, model=echo) + [make_chunk(req, echo)])
    await out.end()


@behaviour("echo-auth-error", "401 whose JSON error message and headers echo the Authorization header")
async def _echo_auth_error(req: Request, out: Response) -> None:
    echo = echo_text(req)
    await out.respond(401, error_json(f"bad key: {echo}", 401), headers=(("X-Echo", echo), ("Retry-After", echo)))


@behaviour("echo-auth-stream-error", "two tokens, then an in-stream error echoing the Authorization header")
async def _echo_auth_stream_error(req: Request, out: Response) -> None:
    await out.head()
    await out.events([*normal_stream(req)[:3], error_json(f"bad key: {echo_text(req)}", 401)])
    await out.end()


# -- /v1/models and /metrics ---------------------------------------------------------------
@behaviour("models-endless", "/v1/models: an endless JSON list (until the cap)", "models")
async def _models_endless(req: Request, out: Response) -> None:
    await out.head(content_type="application/json")
    await out.chunk(b'{"object":"list","data":[')
    block = b'{"id":"m","object":"model"},' * 2048
    while True:
        await out.chunk(block)


@behaviour("models-garbage", "/v1/models: 200 application/json of random bytes", "models")
async def _models_garbage(req: Request, out: Response) -> None:
    await out.respond(200, random.Random(7).randbytes(65536))


@behaviour("models-markup", "/v1/models: the first model id is 100 KB of escapes, bidi and markup", "models")
async def _models_markup(req: Request, out: Response) -> None:
    models = [{"id": HOSTILE_TEXT * 1000, "object": "model"}, {"id": "second", "object": "model"}]
    await out.respond(200, orjson.dumps({"object": "list", "data": models}))


@behaviour("metrics-endless", "/metrics: an endless Prometheus text (until the cap)", "metrics")
async def _metrics_endless(req: Request, out: Response) -> None:
    await out.head(content_type="text/plain; version=0.0.4")
    block = b'vllm:num_requests_running{model_name="m"} 1\n' * 2048
    while True:
        await out.chunk(block)


@behaviour("metrics-markup", "/metrics: label values and HELP text of escapes and markup, absurd values", "metrics")
async def _metrics_markup(req: Request, out: Response) -> None:
    h = HOSTILE_TEXT.replace('"', "")
    text = (
        f"# HELP vllm:num_requests_running {h}\n"
        f'vllm:num_requests_running{{model_name="{h}"}} 3e308\n'
        f'vllm:num_requests_waiting{{model_name="{h}"}} -1e300\n'
        "vllm:kv_cache_usage_perc NaN\n"
        f"vllm:{h} 1\n"
    )
    await out.respond(200, text.encode(), content_type="text/plain; version=0.0.4")


def models_of(name: str) -> Handler:
    async def handler(req: Request, out: Response) -> None:
        await out.respond(200, orjson.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}))

    return handler


async def not_found(req: Request, out: Response) -> None:
    await out.respond(404, b"not found\n", content_type="text/plain")


async def unknown(req: Request, out: Response) -> None:
    await out.respond(404, error_json(f"no hostile behaviour at {req.path}", 404))
