"""One simulated answer over HTTP, from admission to its last byte: whole or streamed, in the
chat/completions or the Responses API's shape.

The handler only starts and ends a streamed answer (and steps in for faults and a backed-up
socket): each token is written by the model's engine step itself (``StreamWriter``). The
usage an answer reports is what the fault spec lets it say (``usage_under``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from aiohttp import HttpVersion11, web

from loadgen.sim.answer import SimConfig, SseFrames, apply_stop, word_index
from loadgen.sim.faults import FaultPlan
from loadgen.sim.model import SimRequest, TimingModel
from loadgen.sim.responses import ResponsesFrames, response_object, usage_of
from loadgen.sim.stream_writer import CUT, STALL, StreamWriter
from loadgen.sim.tool_calls import ToolCall, finish_reason_of
from loadgen.workload.tokenizer import WORDS

__all__ = ["Replies"]

# Engine headroom (TimingModel.headroom) that a stream's end needs, as estimated for a slow core.
_FINISH_NS = 250_000


@contextmanager
def _streaming(req: SimRequest, w: StreamWriter) -> Iterator[None]:
    """A streamed answer's life: a client that left cancels the request; at the end, however it
    came, the model's steps stop writing to the socket."""
    try:
        yield
    except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
        req.cancelled = True
        raise
    finally:
        w.direct = False
        req.sink = req.prepare = None


class Replies:
    """The answers of one ``SimServer``: its timing model and its configuration."""

    def __init__(self, model: TimingModel, config: SimConfig) -> None:
        self.model = model
        self.config = config

    def usage(self, req: SimRequest, completion: int) -> dict[str, Any]:
        reported = int(completion * self.config.faults.usage_under)
        return {
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": reported,
            "total_tokens": len(req.prompt_ids) + reported,
            "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
        }

    async def whole(
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
            "usage": self.usage(req, n),
        }
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def stream(
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
        usage = self.usage if opts.get("continuous_usage_stats") else None
        w = StreamWriter(req, frames, cfg, plan, stops, usage, resp.chunked)
        with _streaming(req, w):
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
                final.append(frames.usage(self.usage(req, w.sent)))
            final.append(b"data: [DONE]\n\n")
            await resp.write_eof(b"".join(final))  # one write: the last frames and the chunked end
        return resp

    async def whole_responses(
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
        out = response_object(frames, [frames.item(text, status)], status, usage_of(self.usage(req, n)), cut)
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def stream_responses(
        self,
        request: web.Request,
        req: SimRequest,
        finish: str,
        plan: FaultPlan,
        stops: list[str],
        tool: ToolCall | None,
    ) -> web.StreamResponse:
        """Stream one Responses answer (responses.py): as ``stream``, in that API's events."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if request.version == HttpVersion11:
            resp.enable_chunked_encoding()
        await resp.prepare(request)
        frames = ResponsesFrames(req.rid, self.config.model_name, tool)
        w = StreamWriter(req, frames, self.config, plan, stops, None, resp.chunked)
        w.fast = False  # each event has its sequence number: not the fixed bytes the fast path writes
        with _streaming(req, w):
            await resp.write(frames.opening())  # at receipt, a tool call's header with it
            if not await self._relay(request, resp, w, headers_sent=True):
                return resp
            req.sink = req.prepare = None
            await self.model.headroom(_FINISH_NS)
            full = "".join(" " + WORDS[word_index(req, k)] for k in range(w.sent))
            text = apply_stop(full, n_words=w.sent, stops=stops, finish=finish)[0]
            length = w.finish is None and finish == "length"
            await resp.write_eof(frames.closing(text, length, usage_of(self.usage(req, w.sent))))
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
