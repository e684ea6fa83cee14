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
frames) and ``SimConfig`` live in ``answer.py``; writing an answer out, whole or streamed, is
``replies.py``; this module is the HTTP side: routes, request validation with OpenAI-style
errors, each request's fault plan and tool call, and its ground truth.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import orjson
from aiohttp import web

from loadgen.sim.answer import SimConfig, natural_length
from loadgen.sim.faults import FaultPlan, plan_for
from loadgen.sim.model import FixedModel, SimRequest, TimingModel
from loadgen.sim.pooled import pooled_routes
from loadgen.sim.replies import Replies
from loadgen.sim.responses import chat_view, prompt_text
from loadgen.sim.tool_calls import tool_call_for
from loadgen.workload.tokenizer import BUILTIN

__all__ = ["SimServer"]

_PROBE_HEADER = "X-Loadgen-Probe"  # the header of loadgen's probe request before a run

# Engine headroom (TimingModel.headroom) that handling needs, as estimated for a slow core: a new
# request (parse, tokenize ~0.1 us per body byte, admit, headers, first write); its end: replies.py.
_ARRIVAL_NS, _BODY_BYTE_NS = 400_000, 100


def _error(status: int, message: str, etype: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    return web.json_response(body, status=status)


class SimServer:
    """An aiohttp application around a ``TimingModel``."""

    def __init__(self, model: TimingModel | None = None, config: SimConfig | None = None):
        self.model: TimingModel = model or FixedModel()
        self.config = config or SimConfig()
        self.replies = Replies(self.model, self.config)
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

    @property
    def received(self) -> int:
        """The run's requests this server has read so far (loadgen's probes aside): what a caller
        waits on to know every request is on the wire."""
        return self._seq

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
            replies = self.replies
            if responses:
                if body.get("stream"):
                    return await replies.stream_responses(request, req, finish, plan, stops, tool)
                return await replies.whole_responses(req, finish, stops, tool)
            if body.get("stream"):
                return await replies.stream(request, req, body, chat, finish, plan, stops, tool)
            return await replies.whole(req, chat, finish, stops, tool)
        finally:
            if not req.finished:
                self.model.cancel(req)
            if not probe:
                self._write_truth(req)

    def _write_truth(self, req: SimRequest) -> None:
        if self._truth_file is not None:
            self._truth_file.write(orjson.dumps(req.truth()) + b"\n")
            self._truth_file.flush()
