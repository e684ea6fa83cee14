"""The simulated OpenAI-compatible server: HTTP in front of a timing model.

Speaks chat, completions and the Responses API (``responses.py``), streaming and not, with usage
(and vLLM-style ``continuous_usage_stats``), ``/v1/models``, ``/tokenize`` and Prometheus
``/metrics``. What it streams has the shape real servers send (see
ENDPOINTS.md): a role-only first chat chunk, one chunk per token, a finish
chunk, a ``choices: []`` usage chunk, ``[DONE]``; a configured share of chat answers are
tool calls in vLLM's, SGLang's or llama.cpp's shape (``tool_calls.py``). Faults and quirks come from
``faults.py``. The ground truth of every request (arrival, queue wait, prefill,
the emission time of every token) can be written as JSON lines.

For speed on one core, a streamed token is written to its socket by the model's
engine step itself, not by a handler task woken for it (``StreamWriter``, in
``stream_writer.py``); request handling waits for room between steps
(``TimingModel.headroom``). What an answer says (its length, words, stop strings, SSE
frames) and ``SimConfig`` live in ``answer.py``; this module is the HTTP side: routes,
request validation with OpenAI-style errors, and the start and end of every answer.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import orjson
from aiohttp import HttpVersion11, web

from loadgen.sim.answer import SimConfig, SseFrames, apply_stop, natural_length, word_index
from loadgen.sim.faults import FaultPlan, plan_for
from loadgen.sim.model import FixedModel, SimRequest, TimingModel
from loadgen.sim.pooled import pooled_routes
from loadgen.sim.responses import ResponsesFrames, chat_view, prompt_text, response_object, usage_of
from loadgen.sim.stream_writer import CUT, STALL, StreamWriter
from loadgen.sim.tool_calls import ToolCall, finish_reason_of, tool_call_for
from loadgen.workload.tokenizer import BUILTIN, WORDS

__all__ = ["SimServer"]

_PROBE_HEADER = "X-Loadgen-Probe"  # the header of loadgen's probe request before a run

# Engine headroom (TimingModel.headroom) that handling needs, as estimated for a slow core: a new
# request (parse, tokenize ~0.1 us per body byte, admit, headers, first write); a stream's end.
_ARRIVAL_NS, _BODY_BYTE_NS, _FINISH_NS = 400_000, 100, 250_000


def _error(status: int, message: str, etype: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    return web.json_response(body, status=status)


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
                web.post("/v1/responses", self.responses),
                web.get("/v1/models", self.models),
                web.get("/metrics", self.metrics),
                web.get("/health", self.health),
                web.post("/tokenize", self.tokenize),
                *pooled_routes(self),  # /v1/embeddings, /v1/rerank, /rerank (pooled.py)
            ]
        )

    # -- lifecycle ---------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False) -> str:
        # Everything allocated so far (modules, aiohttp, numpy) lives as long as the server: keep it
        # out of the collector's full passes, which otherwise walk it all (tens of ms on a slow core,
        # a stall of every stream) every few thousand requests. Undone in stop(), where any garbage
        # frozen with it is collected after all.
        gc.freeze()
        if self.config.truth_path:
            self._truth_file = open(self.config.truth_path, "ab")  # noqa: SIM115
        await self.model.start()
        # a short shutdown: answers still streaming to a client that left must not hold a stop for 60 s;
        # and a client that leaves cancels its handler, whose ``finally`` takes the request out of the
        # engine at once (a queued one would else stay until its first token, a backlog for the next point)
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        # reuse_port: one of the replicas sharing a port (sim/replicas.py), the kernel spreading connections
        site = web.TCPSite(self._runner, host, port, backlog=4096, reuse_address=True, reuse_port=reuse_port)
        await site.start()
        bound = self._runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{shown}:{bound[1]}/v1"
        return self.url

    async def also_listen(self, host: str, port: int = 0) -> str:
        """Serve on another address too, after ``start`` (a replica's own, beside the port it shares); its URL."""
        assert self._runner is not None, "start() first"
        site = web.TCPSite(self._runner, host, port, backlog=4096)
        await site.start()
        bound = self._runner.addresses[-1]  # the sites' sockets in the order they started
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        return f"http://{shown}:{bound[1]}/v1"

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
        name = self.config.model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        label = f'{{model_name="{name}"}}'  # label values escaped as the text format requires
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

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False, responses=True)

    def _parse(self, raw: bytes, chat: bool, responses: bool = False) -> tuple[dict[str, Any], str] | web.Response:
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
            if responses:
                text = prompt_text(body)
            elif chat:
                msgs = body["messages"]
                text = "".join(str(m.get("content") or "") for m in msgs)
            else:
                prompt = body["prompt"]
                text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        except (KeyError, TypeError, AttributeError):
            field_name = "input" if responses else "messages" if chat else "prompt"
            return _error(400, f"'{field_name}' is required and must be well-formed", "invalid_request_error")
        return body, text

    async def _generate(self, request: web.Request, chat: bool, responses: bool = False) -> web.StreamResponse:
        arrival = time.perf_counter_ns()
        # Handling a request costs the engine's core ~0.5 ms (more for a long prompt): done in the
        # gaps between engine steps, so that a burst of arrivals delays admissions, not tokens.
        await self.model.headroom(_ARRIVAL_NS + _BODY_BYTE_NS * (request.content_length or 0))
        parsed = self._parse(await request.read(), chat, responses)
        if isinstance(parsed, web.Response):
            return parsed
        body, text = parsed
        cfg = self.config
        prompt_ids = BUILTIN.encode(text)
        if responses:
            max_tokens = body.get("max_output_tokens")
        else:
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
        n_out = limit if ignore_eos else min(limit, natural_length(prompt_ids, cfg.natural_mean_tokens))
        if cfg.faults.ignore_max_tokens and max_tokens is not None:
            n_out = min(max(n_out, 2 * max_tokens), room)
        finish = "length" if n_out >= limit else "stop"

        # loadgen's probe before a run (client.usage_probe) is not part of the run: it neither
        # takes a fault-plan number (the run's faults stay where they were planned) nor enters the truth
        probe = _PROBE_HEADER in request.headers
        if not probe:
            self._seq += 1
        seq_header = request.headers.get("X-Loadgen-Seq")
        rid = f"{request.headers.get('X-Loadgen-Run', 'sim')}-{seq_header or self._seq}"
        seq = int(seq_header) if seq_header and seq_header.isdigit() else self._seq
        # a request's faults are keyed by its number in the run (the order requests arrive in is
        # timing's): the same traffic meets the same faults, whatever the transport or the load
        plan = FaultPlan() if probe else plan_for(cfg.faults, seq, n_out)
        if plan.status == 429:
            resp = _error(429, "Rate limit reached; retry later.", "rate_limit_error", "rate_limit_exceeded")
            resp.headers["Retry-After"] = f"{cfg.faults.retry_after_s:g}"
            return resp
        if plan.status == 500:
            return _error(500, "The server had an error while processing your request.", "server_error")

        req = SimRequest(rid=rid, prompt_ids=prompt_ids, max_tokens=n_out, arrival_ns=arrival)
        asked = chat_view(body) if responses else body
        tool = (
            tool_call_for(asked, prompt_ids, seq, rid, cfg.tool_calls, cfg.tool_call_shape)
            if chat or responses
            else None
        )
        req.tool_call = tool is not None
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str)]
        self.model.submit(req)
        try:
            if responses:
                if body.get("stream"):
                    return await self._stream_responses(request, req, finish, plan, stops, tool)
                return await self._whole_responses(req, finish, stops, tool)
            if body.get("stream"):
                return await self._stream(request, req, body, chat, finish, plan, stops, tool)
            return await self._whole(req, chat, finish, stops, tool)
        finally:
            if not req.finished:
                self.model.cancel(req)
            if not probe:
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
        self, req: SimRequest, chat: bool, finish: str, stops: list[str], tool: ToolCall | None
    ) -> web.Response:
        while not req.finished:
            await req.wait()
        await self.model.headroom(_FINISH_NS)
        words = [WORDS[word_index(req, k)] for k in range(req.emitted)]
        natural, full = finish, "".join(" " + w for w in words)
        text, n, finish = apply_stop(full, n_words=len(words), stops=stops, finish=finish)
        created = int(time.time())
        message: dict[str, Any]
        if chat and tool is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [tool.to_json(text)]}
            finish = finish_reason_of(tool, natural, stopped=len(text) < len(full))
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
            obj = "chat.completion"
        elif chat:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            obj = "text_completion"
        out = {
            "id": f"cmpl-{req.rid}",
            "object": obj,
            "created": created,
            "model": self.config.model_name,
            "choices": [choice],
            "usage": self._usage(req, n),
        }
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        body: dict[str, Any],
        chat: bool,
        finish: str,
        plan: FaultPlan,
        stops: list[str],
        tool: ToolCall | None,
    ) -> web.StreamResponse:
        """Stream one answer. The handler only starts and ends it (and steps in for faults and a
        backed-up socket): each token is written by the model's step itself (``StreamWriter.fire`` or
        ``StreamWriter.on_emit``)."""
        cfg = self.config
        opts = body.get("stream_options") or {}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if request.version == HttpVersion11:
            resp.enable_chunked_encoding()  # explicit, so the direct writes know the framing
        await resp.prepare(request)
        frames = SseFrames(req.rid, cfg.model_name, chat, tool)
        usage = self._usage if opts.get("continuous_usage_stats") else None
        w = StreamWriter(req, frames, cfg, plan, stops, usage, resp.chunked)
        try:
            if chat:  # the role chunk, and a tool call's header: no generated text, at receipt
                await resp.write(frames.role(b',"usage":' + orjson.dumps(usage(req, 0)) if usage else b""))
            if not await self._relay(request, resp, w, headers_sent=chat):
                return resp  # the connection was cut (the disconnect fault)
            req.sink = req.prepare = None
            await self.model.headroom(_FINISH_NS)
            reason = w.finish or finish
            if tool is not None:
                reason = finish_reason_of(tool, finish, stopped=w.finish is not None)
            final = [frames.finish(reason)]
            if opts.get("include_usage"):
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

    async def _whole_responses(
        self, req: SimRequest, finish: str, stops: list[str], tool: ToolCall | None
    ) -> web.Response:
        """A whole Responses answer: the ``response`` object, its one output item and its usage."""
        while not req.finished:
            await req.wait()
        await self.model.headroom(_FINISH_NS)
        full = "".join(" " + WORDS[word_index(req, k)] for k in range(req.emitted))
        text, n, finish = apply_stop(full, n_words=req.emitted, stops=stops, finish=finish)
        frames = ResponsesFrames(req.rid, self.config.model_name, tool)
        status = "incomplete" if finish == "length" else "completed"
        cut = "max_output_tokens" if finish == "length" else None
        out = response_object(frames, [frames.item(text, status)], status, usage_of(self._usage(req, n)), cut)
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def _stream_responses(
        self,
        request: web.Request,
        req: SimRequest,
        finish: str,
        plan: FaultPlan,
        stops: list[str],
        tool: ToolCall | None,
    ) -> web.StreamResponse:
        """Stream one Responses answer (responses.py): as ``_stream``, in that API's events."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if request.version == HttpVersion11:
            resp.enable_chunked_encoding()
        await resp.prepare(request)
        frames = ResponsesFrames(req.rid, self.config.model_name, tool)
        w = StreamWriter(req, frames, self.config, plan, stops, None, resp.chunked)
        w.fast = False  # each event has its sequence number: not the fixed bytes the fast path writes
        try:
            await resp.write(frames.opening())  # at receipt, a tool call's header with it
            if not await self._relay(request, resp, w, headers_sent=True):
                return resp
            req.sink = req.prepare = None
            await self.model.headroom(_FINISH_NS)
            full = "".join(" " + WORDS[word_index(req, k)] for k in range(w.sent))
            text = apply_stop(full, n_words=w.sent, stops=stops, finish=finish)[0]
            length = w.finish is None and finish == "length"
            await resp.write_eof(frames.closing(text, length, usage_of(self._usage(req, w.sent))))
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            req.cancelled = True
            raise
        finally:
            w.direct = False
            req.sink = req.prepare = None
        return resp

    async def _relay(self, request: web.Request, resp: web.StreamResponse, w: StreamWriter, headers_sent: bool) -> bool:
        """Until the whole answer is taken: write what the model's steps did not, act at fault points,
        and hand the stream to the steps (``go_direct``) whenever it is keeping up. False when the
        connection was cut on purpose (the disconnect fault)."""
        req = w.req
        while True:
            data = w.take()
            if data:
                w.stamp()
                await resp.write(data)
                headers_sent = True
            if w.error is not None:
                raise w.error
            if w.action == STALL:
                w.action = 0
                w.stalled = True
                await asyncio.sleep(self.config.faults.stall_s)
                continue
            if w.action == CUT:
                if request.transport is not None:
                    request.transport.close()
                return False
            if w.complete():
                return True
            if data:
                continue  # more may have been emitted while the write waited for the socket
            if headers_sent and not req.finished:
                w.go_direct(request.transport)  # the headers are out: the steps may write from now on
            await req.wait()
            w.direct = False
