"""The timing models behind the simulated server, and the request they share.

The server (``sim/server.py``) speaks HTTP; a model decides *when* each output
token exists. A model emits tokens by bumping ``SimRequest.emitted`` (recording
each token's emission time in ``emit_ns``). That either calls the request's ``sink``
(the server's streaming writer, which writes the new token to the socket there
and then, inside the model's step, unless the model had it written already through
``prepare``) or wakes ``SimRequest.wait()``, where the
server's handler wakes, writes every newly emitted token, and waits again. A
slow reader never stalls the model (the writer hands a backed-up stream to its
handler), and several tokens emitted between two wake-ups go out in one TCP
write, as a real server's would.

All times are on the ``time.perf_counter_ns`` clock (CLOCK_MONOTONIC), the same
clock loadgen's engine uses, so the ground truth lines up with client records.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from loadgen.clock import sleep_until

__all__ = ["SimRequest", "TimingModel", "FixedModel", "Clock", "COALESCE_NS"]

Clock = Callable[[], int]
# A token emitted more than this after its modelled instant (the model is far behind: the core cannot
# keep up) is not written at once but with the tokens that follow it (``StreamWriter.on_emit``, stream_writer.py):
# fewer writes, so the model catches up. Not lower: a brief stall of the core (a hypervisor taking it
# for a millisecond) leaves a step a little late, and coalescing its tokens would make the next steps
# late too, their tokens waiting for the same deferred write.
COALESCE_NS = 10_000_000


@dataclass(eq=False, slots=True)
class SimRequest:
    rid: str
    # built-in tokenizer ids, for prefix-cache hashing: a list, or any sequence whose slices are sequences
    # (a virtual run's synthetic prompts are arrays); never changed while the request is in the engine
    prompt_ids: Sequence[int]
    max_tokens: int  # tokens this request will produce (EOS already decided)
    arrival_ns: int
    emitted: int = 0
    emit_ns: list[int] = field(default_factory=list)  # when each token really went out
    model_ns: list[int] = field(default_factory=list)  # when the timing model says it should have
    written_ns: list[int] = field(default_factory=list)  # when the server wrote it to the socket
    # Tokens per output-carrying SSE event, in order, when not one each (multi-token chunks): the
    # streaming writer fills it; empty means one token an event (the truth file says so in full).
    chunk_tokens: list[int] = field(default_factory=list)
    tool_call: bool = False  # the answer is a tool call: its tokens are the call's argument fragments
    queue_wait_ns: int | None = None
    prefill_start_ns: int | None = None
    prefill_end_ns: int | None = None
    cached_tokens: int = 0
    kv_ready: int = 0  # tokens whose KV is already on this engine (sent by a prefill pool): not computed
    preemptions: int = 0
    finished: bool = False
    cancelled: bool = False
    # Called (synchronously, by the model) on every ``emit`` instead of waking the handler: the
    # server's streaming writer, which sends a step's tokens from inside the step. It wakes the
    # handler itself (``notify``) for anything it does not do there.
    sink: Callable[[], None] | None = None
    # Optional, beside ``sink``: called by a stepping model *before* a step's end for a request that
    # will emit one token then. Returns a function that writes that token to the socket (it counts
    # as taken), called at the step's end before any bookkeeping, or None when the sink will handle the
    # token on ``emit`` as usual. It keeps the per-token work between the modelled instant and the
    # socket to one call: what the step's last token waits for is the writes before it, little else.
    prepare: Callable[[], Callable[[], None] | None] | None = None
    _waiter: asyncio.Future[None] | None = None

    def notify(self) -> None:
        """Wake the handler (a bare future: cheaper than an Event)."""
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until the next ``emit``/``notify`` (the caller checks what changed)."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def emit(self, k: int, now_ns: int, model_ns: int | None = None) -> None:
        """Record ``k`` new tokens at ``now_ns`` (and their modelled instant) and wake the handler."""
        if model_ns is None:
            model_ns = now_ns
        if k == 1:  # the hot path: no temporary lists (fewer allocations, fewer GC passes)
            self.emit_ns.append(now_ns)
            self.model_ns.append(model_ns)
        elif k:
            self.emit_ns.extend([now_ns] * k)
            self.model_ns.extend([model_ns] * k)
        self.emitted += k
        if self.emitted >= self.max_tokens:
            self.finished = True
        sink = self.sink
        if sink is not None:
            sink()
        else:
            self.notify()

    def truth(self) -> dict[str, Any]:
        """The ground-truth line for ``--truth``."""
        return {
            "rid": self.rid,
            "arrival_ns": self.arrival_ns,
            "prompt_tokens": len(self.prompt_ids),
            "cached_tokens": self.cached_tokens,
            "queue_wait_ns": self.queue_wait_ns,
            "prefill_start_ns": self.prefill_start_ns,
            "prefill_end_ns": self.prefill_end_ns,
            "emit_ns": self.emit_ns,
            "model_ns": self.model_ns,
            "written_ns": self.written_ns,
            "chunk_tokens": self.chunk_tokens or [1] * len(self.written_ns),
            "tool_call": self.tool_call,
            "preemptions": self.preemptions,
            "cancelled": self.cancelled,
        }


class TimingModel(Protocol):
    """What the server needs from a timing model."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def submit(self, req: SimRequest) -> None:
        """Accept a request; tokens will be emitted on the model's own schedule."""

    def cancel(self, req: SimRequest) -> None:
        """The client went away: free the request's resources."""

    def stats(self) -> dict[str, float]:
        """Gauges and counters for ``/metrics`` (vLLM-style names, without prefix)."""

    async def headroom(self, need_ns: int) -> None:
        """Return when front-end work of about ``need_ns`` (handling a request) can run without
        making the model's next emission late; a model with no steps returns at once."""


class FixedModel:
    """Every request: first token ``ttft_s`` after arrival, then one every ``itl_s``.

    Independent of load (infinite capacity). One ticker task keeps a heap of
    each request's next emission instant (arrival + ttft + k*itl, absolute, so
    jitter never accumulates into drift) and waits for the earliest with
    ``clock.sleep_until``, so tokens go out within a fraction of a millisecond
    of their modelled time.
    """

    def __init__(self, ttft_s: float = 0.05, itl_s: float = 0.01, clock: Clock = time.perf_counter_ns):
        self.ttft_ns = int(ttft_s * 1e9)
        self.itl_ns = int(itl_s * 1e9)
        self.clock = clock
        self._heap: list[tuple[int, int, SimRequest]] = []
        self._order = 0
        self._wake = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._requests = 0
        self.late_ns_max = 0

    async def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def submit(self, req: SimRequest) -> None:
        self._requests += 1
        self._prompt_tokens += len(req.prompt_ids)
        req.queue_wait_ns = 0
        req.prefill_start_ns = req.arrival_ns
        if req.max_tokens <= 0:
            req.finished = True
            req.notify()
            return
        self._push(req.arrival_ns + self.ttft_ns, req)

    def _push(self, due: int, req: SimRequest) -> None:
        self._order += 1
        if not self._heap or due < self._heap[0][0]:
            self._wake.set()
        heapq.heappush(self._heap, (due, self._order, req))

    def cancel(self, req: SimRequest) -> None:
        req.cancelled = True  # dropped from the heap when its next token comes due

    async def headroom(self, need_ns: int) -> None:
        return  # no engine steps to protect: every request is served as it comes

    async def _tick(self) -> None:
        heap = self._heap
        while True:
            if not heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._wake.clear()
            if not await sleep_until(heap[0][0], self.clock, self._wake):
                continue  # an earlier instant arrived
            now = self.clock()
            while heap and heap[0][0] <= now:
                due, _, req = heapq.heappop(heap)
                if req.cancelled:
                    continue
                self.late_ns_max = max(self.late_ns_max, now - due)
                if req.emitted == 0:
                    req.prefill_end_ns = now
                req.emit(1, now)
                self._generation_tokens += 1
                if not req.finished:
                    self._push(req.arrival_ns + self.ttft_ns + req.emitted * self.itl_ns, req)

    def stats(self) -> dict[str, float]:
        running = len(self._heap)
        return {
            "num_requests_running": running,
            "num_requests_waiting": 0,
            "kv_cache_usage_perc": 0.0,
            "prompt_tokens_total": self._prompt_tokens,
            "generation_tokens_total": self._generation_tokens,
            "request_success_total": self._requests,
            "num_preemptions_total": 0,
            "prefix_cache_queries_total": 0,
            "prefix_cache_hits_total": 0,
            "max_lateness_seconds": self.late_ns_max / 1e9,
        }
