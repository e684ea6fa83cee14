"""The simulated OpenAI-compatible server: HTTP in front of a timing model.

Speaks chat and completions, streaming and not, with usage (and vLLM-style
``continuous_usage_stats``), ``/v1/models``, ``/tokenize`` and Prometheus
``/metrics``. What it streams has the shape real servers send (see
ENDPOINTS.md): a role-only first chat chunk, one chunk per token, a finish
chunk, a ``choices: []`` usage chunk, ``[DONE]``. Faults and quirks come from
``faults.py``. The ground truth of every request (arrival, queue wait, prefill,
the emission time of every token) can be written as JSON lines.

For speed on one core, a streamed token is written to its socket by the model's
engine step itself, not by a handler task woken for it (``_Writer``); request
handling waits for room between steps (``TimingModel.headroom``).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from aiohttp import HttpVersion11, web

from ..tokenizer import BUILTIN, WORDS
from .faults import FaultPlan, FaultSpec, plan_for
from .model import COALESCE_NS, FixedModel, SimRequest, TimingModel

__all__ = ["SimConfig", "SimServer"]

_WORD_JSON = [orjson.dumps(" " + w) for w in WORDS]
# Engine headroom (TimingModel.headroom) that handling needs, as estimated for a slow core: a new
# request (parse, tokenize ~0.1 us per body byte, admit, headers, first write); a stream's end.
_ARRIVAL_NS, _BODY_BYTE_NS, _FINISH_NS = 400_000, 100, 250_000
_STOP_WINDOW = 256  # stop strings longer than this are not looked for across chunks


@dataclass
class SimConfig:
    model_name: str = "sim"
    max_model_len: int = 131072
    tokens_per_chunk: int = 1
    natural_mean_tokens: int = 256  # mean answer length when EOS is not ignored
    faults: FaultSpec = field(default_factory=FaultSpec)
    truth_path: str | None = None


def _error(status: int, message: str, etype: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    return web.json_response(body, status=status)


def _natural_length(prompt_ids: list[int], mean: int) -> int:
    """Where the simulated model would emit EOS: a pure function of the prompt."""
    return _natural_draw(zlib.crc32(np.asarray(prompt_ids[-64:], dtype=np.int64).tobytes()), mean)


@functools.lru_cache(maxsize=4096)
def _natural_draw(h: int, mean: int) -> int:
    """Cached: seeding a numpy generator costs ~0.1 ms of a slow core, most of a request's handling,
    and workloads repeat prompts (shared system prompts, fixed benchmark prompts)."""
    return max(1, int(np.random.default_rng(h).exponential(mean)))


class _Frames:
    """The SSE frames of one streamed answer, pre-assembled around a fixed head so
    each token costs one bytes concatenation (the simulator must outpace loadgen)."""

    __slots__ = ("head", "chat", "pre", "mid")

    def __init__(self, rid: str, model: str, chat: bool) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = orjson.dumps({"id": f"cmpl-{rid}", "object": obj, "created": int(time.time()), "model": model})[:-1]
        self.chat = chat
        choice = b',"choices":[{"index":0,'
        self.pre = b"data: " + self.head + choice + (b'"delta":{"content":' if chat else b'"text":')
        self.mid = b'},"finish_reason":null}]' if chat else b',"finish_reason":null}]'

    def role(self) -> bytes:
        delta = b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
        return b"data: " + self.head + b',"choices":[{"index":0,' + delta

    def token(self, text_json: bytes, usage: bytes = b"") -> bytes:
        return self.pre + text_json + self.mid + usage + b"}\n\n"

    def finish(self, reason: str) -> bytes:
        body = b'"delta":{},"finish_reason":"' if self.chat else b'"text":"","finish_reason":"'
        return b"data: " + self.head + b',"choices":[{"index":0,' + body + reason.encode() + b'"}]}\n\n'

    def usage(self, usage: dict[str, Any]) -> bytes:
        return b"data: " + self.head + b',"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n"


class SimServer:
    """An aiohttp application around a ``TimingModel``."""

    def __init__(self, model: TimingModel | None = None, config: SimConfig | None = None):
        self.model: TimingModel = model or FixedModel()
        self.config = config or SimConfig()
        self._seq = 0
        self._truth_file: Any = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.add_routes(
            [
                web.post("/v1/chat/completions", self.chat),
                web.post("/v1/completions", self.completions),
                web.get("/v1/models", self.models),
                web.get("/metrics", self.metrics),
                web.get("/health", self.health),
                web.post("/tokenize", self.tokenize),
            ]
        )

    # -- lifecycle ---------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        # Everything allocated so far (modules, aiohttp, numpy) lives as long as the server: keep it
        # out of the collector's full passes, which otherwise walk it all (tens of ms on a slow core,
        # a stall of every stream) every few thousand requests. Undone in stop(), where any garbage
        # frozen with it is collected after all.
        gc.freeze()
        if self.config.truth_path:
            self._truth_file = open(self.config.truth_path, "ab")  # noqa: SIM115
        await self.model.start()
        # a short shutdown: answers still streaming to a client that left must not hold a stop for 60 s
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=4096, reuse_address=True)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{shown}:{bound[1]}/v1"
        return self.url

    async def stop(self) -> None:
        await self.model.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._truth_file is not None:
            self._truth_file.close()
            self._truth_file = None
        gc.unfreeze()

    # -- small endpoints ---------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "loadgen-sim"}]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            text = body.get("prompt")
            if text is None:
                text = "".join(m.get("content") or "" for m in body.get("messages", []))
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return _error(400, "body must be JSON with 'prompt' or 'messages'", "invalid_request_error")
        ids = BUILTIN.encode(str(text))
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.config.max_model_len})

    async def metrics(self, request: web.Request) -> web.Response:
        label = f'{{model_name="{self.config.model_name}"}}'
        lines = []
        for key, value in self.model.stats().items():
            kind = "counter" if key.endswith("_total") else "gauge"
            lines.append(f"# TYPE vllm:{key} {kind}")
            lines.append(f"vllm:{key}{label} {float(value)!r}")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # -- generation --------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def _parse(self, raw: bytes, chat: bool) -> tuple[dict[str, Any], str] | web.Response:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _error(400, "request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "invalid_request_error")
        if body.get("model") not in (None, self.config.model_name):
            return _error(
                404,
                f"The model `{str(body.get('model'))[:100]}` does not exist.",
                "NotFoundError",
                "model_not_found",
            )
        try:
            if chat:
                msgs = body["messages"]
                text = "".join(str(m.get("content") or "") for m in msgs)
            else:
                prompt = body["prompt"]
                text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        except (KeyError, TypeError, AttributeError):
            field_name = "messages" if chat else "prompt"
            return _error(400, f"'{field_name}' is required and must be well-formed", "invalid_request_error")
        return body, text

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = time.perf_counter_ns()
        # Handling a request costs the engine's core ~0.5 ms (more for a long prompt): done in the
        # gaps between engine steps, so that a burst of arrivals delays admissions, not tokens.
        await self.model.headroom(_ARRIVAL_NS + _BODY_BYTE_NS * (request.content_length or 0))
        parsed = self._parse(await request.read(), chat)
        if isinstance(parsed, web.Response):
            return parsed
        body, text = parsed
        cfg = self.config
        prompt_ids = BUILTIN.encode(text)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
            return _error(400, "max_tokens must be a non-negative integer", "invalid_request_error")
        room = cfg.max_model_len - len(prompt_ids)
        if room <= 0 or (max_tokens is not None and max_tokens > room):
            return _error(
                400,
                f"This model's maximum context length is {cfg.max_model_len} tokens; "
                f"the prompt has {len(prompt_ids)} and {max_tokens} were asked for.",
                "invalid_request_error",
                "context_length_exceeded",
            )
        limit = room if max_tokens is None else max_tokens
        ignore_eos = bool(body.get("ignore_eos")) and not cfg.faults.ignore_eos_ignored
        n_out = limit if ignore_eos else min(limit, _natural_length(prompt_ids, cfg.natural_mean_tokens))
        if cfg.faults.ignore_max_tokens and max_tokens is not None:
            n_out = min(max(n_out, 2 * max_tokens), room)
        finish = "length" if n_out >= limit else "stop"

        self._seq += 1
        seq_header = request.headers.get("X-Loadgen-Seq")
        rid = f"{request.headers.get('X-Loadgen-Run', 'sim')}-{seq_header or self._seq}"
        plan = plan_for(cfg.faults, self._seq, n_out)
        if plan.status == 429:
            resp = _error(429, "Rate limit reached; retry later.", "rate_limit_error", "rate_limit_exceeded")
            resp.headers["Retry-After"] = f"{cfg.faults.retry_after_s:g}"
            return resp
        if plan.status == 500:
            return _error(500, "The server had an error while processing your request.", "server_error")

        req = SimRequest(rid=rid, prompt_ids=prompt_ids, max_tokens=n_out, arrival_ns=arrival)
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str)]
        self.model.submit(req)
        try:
            if body.get("stream"):
                return await self._stream(request, req, body, chat, finish, plan, stops)
            return await self._whole(req, body, chat, finish, stops)
        finally:
            if not req.finished:
                self.model.cancel(req)
            self._write_truth(req)

    def _write_truth(self, req: SimRequest) -> None:
        if self._truth_file is not None:
            self._truth_file.write(orjson.dumps(req.truth()) + b"\n")
            self._truth_file.flush()

    def _usage(self, req: SimRequest, completion: int) -> dict[str, Any]:
        reported = int(completion * self.config.faults.usage_under)
        return {
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": reported,
            "total_tokens": len(req.prompt_ids) + reported,
            "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
        }

    async def _whole(
        self, req: SimRequest, body: dict[str, Any], chat: bool, finish: str, stops: list[str]
    ) -> web.Response:
        while not req.finished:
            await req.wait()
        await self.model.headroom(_FINISH_NS)
        words = [WORDS[_word_index(req, k)] for k in range(req.emitted)]
        text, n, finish = _apply_stop("".join(" " + w for w in words), n_words=len(words), stops=stops, finish=finish)
        created = int(time.time())
        if chat:
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            obj = "text_completion"
        out = {"id": f"cmpl-{req.rid}", "object": obj, "created": created, "model": self.config.model_name,
               "choices": [choice], "usage": self._usage(req, n)}
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def _stream(
        self, request: web.Request, req: SimRequest, body: dict[str, Any], chat: bool,
        finish: str, plan: FaultPlan, stops: list[str],
    ) -> web.StreamResponse:
        """Stream one answer. The handler only starts and ends it (and steps in for faults and a
        backed-up socket): each token is written by the model's step itself (``_Writer.fire`` or
        ``_Writer.on_emit``)."""
        cfg = self.config
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = bool(opts.get("continuous_usage_stats"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if request.version == HttpVersion11:
            resp.enable_chunked_encoding()  # explicit, so the direct writes know the framing
        await resp.prepare(request)
        frames = _Frames(req.rid, cfg.model_name, chat)
        w = _Writer(req, frames, cfg, plan, stops, self._usage if continuous else None, resp.chunked)
        headers_sent = False
        try:
            if chat:
                await resp.write(frames.role())
                headers_sent = True
            while True:
                data = w.take()
                if data:
                    w.stamp()
                    await resp.write(data)
                    headers_sent = True
                if w.error is not None:
                    raise w.error
                if w.action == _STALL:
                    w.action = 0
                    w.stalled = True
                    await asyncio.sleep(cfg.faults.stall_s)
                    continue
                if w.action == _CUT:
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                if w.complete():
                    break
                if data:
                    continue  # more may have been emitted while the write waited for the socket
                if headers_sent and not req.finished:
                    w.go_direct(request.transport)
                await req.wait()
                w.direct = False
            req.sink = req.prepare = None
            await self.model.headroom(_FINISH_NS)
            final = [frames.finish(w.finish or finish)]
            if include_usage:
                final.append(frames.usage(self._usage(req, w.sent)))
            final.append(b"data: [DONE]\n\n")
            await resp.write_eof(b"".join(final))  # one write: the last frames and the chunked end
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            req.cancelled = True
            raise
        finally:
            w.direct = False
            req.sink = req.prepare = None
        return resp


_STALL, _CUT = 1, 2  # fault points where the handler takes over (it must await, or close the connection)
# Bytes a stream may have queued in its socket (a slow reader) before its handler takes over from the
# direct writes: the handler writes through aiohttp, which waits for the reader to drain.
_DIRECT_LIMIT = 64 * 1024


class _Writer:
    """The streaming state of one answer: the SSE bytes of each newly emitted token, and who writes them.

    ``take`` turns the tokens emitted since its last call into bytes (chunking by ``tokens_per_chunk``,
    cutting at a stop string, adding continuous usage, injecting malformed lines, holding everything
    when ``buffered``). While ``direct`` the model calls ``on_emit`` (as ``SimRequest.sink``) inside
    its step, and the bytes go to the socket there and then: one ``transport.write`` per stream per
    step, with no task wake-up, no coroutine chain, no per-token future. On the hot path (one token
    per chunk, no options) the model does better still: ``prepare`` formats the token's chunk while
    the engine waits for the step's end, and ``fire`` writes it first thing at the end, so the last
    token of a step waits only for the other streams' writes (``SimRequest.prepare``). It is the same write aiohttp
    would make (``resp.enable_chunked_encoding()`` fixed the framing before ``prepare``, headers went
    out with the first ``resp.write``). Whatever needs awaiting or ends the stream (a stall, a
    disconnect, the end of the answer, a socket backing up, an error) wakes the handler instead.
    """

    __slots__ = ("req", "frames", "per_chunk", "usage", "stops", "plan", "buffered", "simple", "fast", "word0",
                 "post", "framed", "pending", "loop", "next", "fired",
                 "sent", "held", "tail", "finish", "action", "stalled", "stopped", "transport", "chunked",
                 "direct", "error")

    def __init__(self, req: SimRequest, frames: _Frames, cfg: SimConfig, plan: FaultPlan, stops: list[str],
                 usage: Callable[[SimRequest, int], dict[str, Any]] | None, chunked: bool) -> None:
        self.req, self.frames, self.plan, self.stops, self.usage = req, frames, plan, stops, usage
        self.per_chunk = max(1, cfg.tokens_per_chunk)
        self.buffered = cfg.faults.buffered
        self.simple = (self.per_chunk == 1 and not stops and usage is None and not self.buffered
                       and plan.stall_at < 0 and plan.malformed_at < 0 and plan.disconnect_at < 0)
        self.word0 = len(req.prompt_ids) * 31  # see _word_index
        self.fast = self.simple and chunked  # on_emit's inlined path applies
        self.post = frames.mid + b"}\n\n"  # a token frame is frames.pre + word + post
        self.framed = len(frames.pre) + len(self.post)
        self.sent = 0  # tokens taken (written, or held by the buffered fault)
        self.held: list[bytes] = []
        self.tail = ""
        self.finish: str | None = None  # "stop" once a stop string cut the answer
        self.action = 0  # _STALL or _CUT: the handler must act before anything more is taken
        self.stalled = self.stopped = False
        self.transport: Any = None
        self.chunked = chunked
        self.direct = False
        self.pending = False  # a flush is scheduled (on_emit, behind)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.next = b""  # the HTTP chunk of the next token, made by ``prepare``
        self.fired = False  # ``fire`` wrote the token being emitted

    def complete(self) -> bool:
        """Everything there is to send has been taken (the finish chunk is next)."""
        req = self.req
        return self.stopped or (req.finished and self.sent >= req.emitted and not self.held)

    def stamp(self) -> None:
        """``written_ns`` for the tokens taken: now, just before they are written."""
        w = self.req.written_ns
        n = self.sent - len(w)
        if n == 1:
            w.append(_now())
        elif n > 0:
            w.extend([_now()] * n)

    def take(self) -> bytes:
        """The bytes for the tokens emitted since the last call (b"" while less than a chunk is ready,
        while ``buffered`` holds them, or while a fault point waits for the handler)."""
        req = self.req
        ready, sent = req.emitted, self.sent
        if ready <= sent or self.stopped or self.action:
            return b""
        if self.simple:  # the hot path: no options, one chunk per token
            self.sent = ready
            token, word0 = self.frames.token, self.word0
            if ready == sent + 1:
                return token(_WORD_JSON[(word0 + sent * 7919) % _N_WORDS])
            return b"".join([token(_WORD_JSON[(word0 + k * 7919) % _N_WORDS]) for k in range(sent, ready)])
        if not req.finished and ready - sent < self.per_chunk:
            return b""
        frames, plan, stops = self.frames, self.plan, self.stops
        out: list[bytes] = []
        while sent < ready:
            k = min(self.per_chunk, ready - sent)
            if k < self.per_chunk and not req.finished:
                break  # a partial chunk only ends the answer: the rest waits for more tokens
            if sent <= plan.stall_at < sent + k and not self.stalled:
                self.action = _STALL
                break
            if sent <= plan.malformed_at < sent + k:
                out.append(b"data: {not json\n\n")
            if sent <= plan.disconnect_at < sent + k:
                self.action = _CUT
                break
            idx = [_word_index(req, j) for j in range(sent, sent + k)]
            piece = "".join(" " + WORDS[i] for i in idx)
            if stops:
                self.tail += piece
                cut = _first_stop(self.tail, stops)
                if cut is not None:
                    keep = piece[: max(0, len(piece) - (len(self.tail) - cut))]
                    if keep:
                        out.append(frames.token(orjson.dumps(keep)))
                    sent += k
                    self.finish, self.stopped = "stop", True
                    req.finished = True  # the model frees it at its next step
                    break
                self.tail = self.tail[-_STOP_WINDOW:]
            word_json = _WORD_JSON[idx[0]] if k == 1 else orjson.dumps(piece)
            usage = b""
            if self.usage is not None:
                usage = b',"usage":' + orjson.dumps(self.usage(req, sent + k))
            out.append(frames.token(word_json, usage))
            sent += k
        self.sent = sent
        if self.buffered and not req.finished:
            self.held.extend(out)
            return b""
        if self.held:
            out = self.held + out
            self.held = []
        return b"".join(out)

    def go_direct(self, transport: Any) -> None:
        """Let the model's steps write from now on, if the socket is open and keeping up."""
        if transport is not None and not transport.is_closing() \
                and transport.get_write_buffer_size() <= _DIRECT_LIMIT:
            self.transport, self.direct = transport, True
            self.loop = asyncio.get_running_loop()
            self.req.sink = self.on_emit
            if self.fast:
                self.req.prepare = self.prepare

    def prepare(self) -> Callable[[], None] | None:
        """Before a step's end (``SimRequest.prepare``): the HTTP chunk of the token the step will emit,
        formatted now, while the engine waits; returns ``fire``, which writes it at the end. Only on
        ``on_emit``'s hot path (one token, no options, chunked, writing directly)."""
        sent = self.sent
        if not self.direct or self.req.emitted != sent:
            return None
        word = _WORD_JSON[(self.word0 + sent * 7919) % _N_WORDS]
        self.next = b"%x\r\n%b%b%b\r\n" % (self.framed + len(word), self.frames.pre, word, self.post)
        return self.fire

    def fire(self) -> None:
        """At the step's end, before the model's bookkeeping: write the prepared token, stamped just
        before. It counts as taken; ``on_emit``, called for it in the bookkeeping, only checks the socket."""
        if not self.direct:
            return  # the handler took over meanwhile: the token goes the ordinary way
        t = self.transport
        try:
            if not t.is_closing():
                self.sent += 1
                self.fired = True
                self.req.written_ns.append(_now())
                t.write(self.next)
        except Exception as e:  # noqa: BLE001 - re-raised by the handler (on_emit wakes it)
            self.error, self.direct = e, False

    def on_emit(self) -> None:
        """Called by the model, inside its step, for each token: write it now, or wake the handler.

        A token emitted more than ``COALESCE_NS`` (10 ms) after its modelled instant (the model is far
        behind: the core cannot keep up) is not written at once: one write, when the model next yields to
        the event loop, carries all the tokens emitted until then. Writes are most of the cost of
        a token, so a model that falls behind catches up instead of falling further behind.
        Never raises (that would stop the engine): an error goes to the handler."""
        req = self.req
        if self.fired:  # written already by ``fire``: is the socket still keeping up?
            self.fired = False
            try:
                if not req.finished and self.direct and self.transport.get_write_buffer_size() <= _DIRECT_LIMIT:
                    return
            except Exception as e:  # noqa: BLE001 - re-raised by the handler
                self.error = e
            self.direct = False
            req.sink = None
            req.notify()
            return
        if not self.direct:
            req.notify()
            return
        if self.pending:
            return  # a flush is due: it takes this token too
        try:
            if req.emit_ns and req.emit_ns[-1] - req.model_ns[-1] > COALESCE_NS:
                self.pending = True
                self.loop.call_soon(self.flush)  # type: ignore[union-attr]
                return
            t = self.transport
            sent = self.sent
            if self.fast and req.emitted == sent + 1 and not t.is_closing():
                # The hot path (one token, no options, chunked): take() and stamp() inlined, one
                # formatting of the whole HTTP chunk, one write.
                self.sent = sent + 1
                word = _WORD_JSON[(self.word0 + sent * 7919) % _N_WORDS]
                req.written_ns.append(_now())
                t.write(b"%x\r\n%b%b%b\r\n" % (self.framed + len(word), self.frames.pre, word, self.post))
                if not req.finished and t.get_write_buffer_size() <= _DIRECT_LIMIT:
                    return
                self.direct = False
                req.sink = None
                req.notify()
                return
        except Exception as e:  # noqa: BLE001 - re-raised by the handler
            self.error, self.direct, req.sink = e, False, None
            req.notify()
            return
        self.flush()

    def flush(self) -> None:
        """Write what has been emitted and not yet taken; hand over to the handler when needed."""
        self.pending = False
        if not self.direct:
            return  # the handler took over meanwhile, and takes what is left
        req, t = self.req, self.transport
        try:
            if t.is_closing():  # the reader left: the handler's write will say so
                self.direct = False
            else:
                data = self.take()
                if data:
                    self.stamp()
                    t.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
                    if t.get_write_buffer_size() > _DIRECT_LIMIT:
                        self.direct = False
                if self.action or self.complete():
                    self.direct = False
        except Exception as e:  # noqa: BLE001 - re-raised by the handler
            self.error, self.direct = e, False
        if not self.direct:
            req.sink = None
            req.notify()


_N_WORDS = len(WORDS)
_now = time.perf_counter_ns


def _word_index(req: SimRequest, k: int) -> int:
    """The k-th output word of a request: deterministic, cheap."""
    return (len(req.prompt_ids) * 31 + k * 7919) % len(WORDS)


def _first_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def _apply_stop(text: str, n_words: int, stops: list[str], finish: str) -> tuple[str, int, str]:
    cut = _first_stop(text, stops) if stops else None
    if cut is None:
        return text, n_words, finish
    kept = text[:cut]
    return kept, BUILTIN.count(kept), "stop"
