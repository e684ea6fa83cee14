"""The streaming writer of the simulated server: one streamed answer's state, and who writes its tokens.

This is the simulator's hot path and its subtlest part, so it stands apart from the HTTP handlers
(``server.py``): ``StreamWriter`` turns newly emitted tokens into SSE bytes and, while a stream keeps
up, writes them to the socket from inside the engine's step (``SimRequest.sink`` and ``prepare``),
so a token costs one ``transport.write`` and no task wake-up. The simulator must outpace the client
it measures, and on one core that is what lets it. The HTTP handler only starts and ends a stream,
and takes over for faults, a backed-up socket or an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson

from loadgen.sim.answer import SimConfig, SseFrames, chunk_seed, chunk_size, first_stop, word_index
from loadgen.sim.faults import FaultPlan
from loadgen.sim.model import COALESCE_NS, SimRequest
from loadgen.workload.tokenizer import WORDS

__all__ = ["StreamWriter", "STALL", "CUT"]

_WORD_JSON = [orjson.dumps(" " + w) for w in WORDS]  # each word as a JSON string, made once
_N_WORDS = len(WORDS)
_now = time.perf_counter_ns  # the clock of ``written_ns``: the client's, for the ground truth
_STOP_WINDOW = 256  # stop strings longer than this are not looked for across chunks

STALL, CUT = 1, 2  # fault points where the handler takes over (it must await, or close the connection)
# Bytes a stream may have queued in its socket (a slow reader) before its handler takes over from the
# direct writes: the handler writes through aiohttp, which waits for the reader to drain.
_DIRECT_LIMIT = 64 * 1024


class StreamWriter:
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

    __slots__ = (
        "req",
        "frames",
        "per_chunk",
        "per_chunk_max",
        "seed",
        "usage",
        "stops",
        "plan",
        "buffered",
        "simple",
        "faulty",
        "fast",
        "word0",
        "post",
        "framed",
        "pending",
        "loop",
        "next",
        "fired",
        "sent",
        "held",
        "tail",
        "finish",
        "action",
        "stalled",
        "stopped",
        "transport",
        "chunked",
        "direct",
        "error",
    )

    def __init__(
        self,
        req: SimRequest,
        frames: SseFrames,
        cfg: SimConfig,
        plan: FaultPlan,
        stops: list[str],
        usage: Callable[[SimRequest, int], dict[str, Any]] | None,
        chunked: bool,
    ) -> None:
        self.req, self.frames, self.plan, self.stops, self.usage = req, frames, plan, stops, usage
        self.per_chunk = max(1, cfg.tokens_per_chunk)
        self.per_chunk_max = max(self.per_chunk, cfg.tokens_per_chunk_max)
        self.seed = chunk_seed(req.prompt_ids) if self.per_chunk_max > self.per_chunk else 0
        self.buffered = cfg.faults.buffered
        self.faulty = plan.stall_at >= 0 or plan.malformed_at >= 0 or plan.disconnect_at >= 0
        self.simple = self.per_chunk_max == 1 and not stops and usage is None and not self.buffered and not self.faulty
        self.word0 = len(req.prompt_ids) * 31  # see answer.word_index
        self.fast = self.simple and chunked  # on_emit's inlined path applies
        self.post = frames.mid + b"}\n\n"  # a token frame is frames.pre + word + post
        self.framed = len(frames.pre) + len(self.post)
        self.sent = 0  # tokens taken (written, or held by the buffered fault)
        self.held: list[bytes] = []
        self.tail = ""
        self.finish: str | None = None  # "stop" once a stop string cut the answer
        self.action = 0  # STALL or CUT: the handler must act before anything more is taken
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
        if not req.finished and ready - sent < self._size(len(req.chunk_tokens)):
            return b""
        return self._release(self._chunks(ready))

    def _size(self, c: int) -> int:
        """Tokens in the c-th chunk: ``tokens_per_chunk``, or a draw up to ``tokens_per_chunk_max``."""
        return chunk_size(self.seed, c, self.per_chunk, self.per_chunk_max)

    def _chunks(self, ready: int) -> list[bytes]:
        """The frames of the tokens from ``sent`` up to ``ready``, ``tokens_per_chunk`` a frame (or a size
        drawn per chunk; a partial chunk only at the end of the answer); stops at a fault point or a stop
        string. Advances ``sent``, and records each frame's tokens in ``req.chunk_tokens``."""
        req, frames = self.req, self.frames
        out: list[bytes] = []
        sent = self.sent
        while sent < ready:
            size = self._size(len(req.chunk_tokens))
            k = min(size, ready - sent)
            if k < size and not req.finished:
                break  # a partial chunk only ends the answer: the rest waits for more tokens
            if self.faulty and self._fault_point(sent, k, out):
                break
            idx = [word_index(req, j) for j in range(sent, sent + k)]
            piece = "".join(" " + WORDS[i] for i in idx)
            n_out = len(out)
            if self.stops and self._stopped_in(piece, out):
                if len(out) > n_out:  # the part before the stop string went out as a chunk
                    req.chunk_tokens.append(k)
                sent += k
                break
            word_json = _WORD_JSON[idx[0]] if k == 1 else orjson.dumps(piece)
            usage = b""
            if self.usage is not None:
                usage = b',"usage":' + orjson.dumps(self.usage(req, sent + k))
            out.append(frames.token(word_json, usage))
            req.chunk_tokens.append(k)
            sent += k
        self.sent = sent
        return out

    def _fault_point(self, sent: int, k: int, out: list[bytes]) -> bool:
        """The faults planned within the next chunk (tokens ``sent`` .. ``sent + k``): a malformed line
        goes into ``out``; a stall or a cut sets ``action`` and returns True (the handler acts first)."""
        plan = self.plan
        if sent <= plan.stall_at < sent + k and not self.stalled:
            self.action = STALL
            return True
        if sent <= plan.malformed_at < sent + k:
            out.append(b"data: {not json\n\n")
        if sent <= plan.disconnect_at < sent + k:
            self.action = CUT
            return True
        return False

    def _stopped_in(self, piece: str, out: list[bytes]) -> bool:
        """Whether a stop string ends the answer within ``piece`` (looked for across chunks, over the
        last ``_STOP_WINDOW`` characters); if so the part before it goes into ``out`` and the answer ends."""
        self.tail += piece
        cut = first_stop(self.tail, self.stops)
        if cut is None:
            self.tail = self.tail[-_STOP_WINDOW:]
            return False
        keep = piece[: max(0, len(piece) - (len(self.tail) - cut))]
        if keep:
            out.append(self.frames.token(orjson.dumps(keep)))
        self.finish, self.stopped = "stop", True
        self.req.finished = True  # the model frees it at its next step
        return True

    def _release(self, out: list[bytes]) -> bytes:
        """The bytes to write now: nothing while the ``buffered`` fault holds the answer back, then all of it."""
        if self.buffered and not self.req.finished:
            self.held.extend(out)
            return b""
        if self.held:
            out = self.held + out
            self.held = []
        return b"".join(out)

    def go_direct(self, transport: Any) -> None:
        """Let the model's steps write from now on, if the socket is open and keeping up."""
        if transport is not None and not transport.is_closing() and transport.get_write_buffer_size() <= _DIRECT_LIMIT:
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
            loop = self.loop  # set with ``direct`` (go_direct)
            if loop is not None and req.emit_ns and req.emit_ns[-1] - req.model_ns[-1] > COALESCE_NS:
                self.pending = True
                loop.call_soon(self.flush)
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
