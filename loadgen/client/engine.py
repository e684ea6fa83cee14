"""The engine: sends each request at its intended time, times every chunk, records.

It computes no statistics. Open loop: a session starts at its scheduled offset
whether or not earlier ones finished; closed loop (a fixed number of users,
each sending when its previous request ended) is a separate, labelled mode.
Every request yields exactly one ``Record``, whatever happens to it.

It takes its clock and its transport as parameters (``time.perf_counter_ns`` and
aiohttp by default), so its scheduling, holds, timeouts, drain and cancellation can
be driven without sockets, on virtual time (``loadgen.clock.VirtualLoop``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np

from loadgen.client.aiohttp_transport import AiohttpTransport
from loadgen.client.config import EngineConfig, LiveCounters, Plan, Timeouts, redact
from loadgen.client.holds import HoldQueue
from loadgen.client.protocol.chunk_errors import StreamError
from loadgen.client.protocol.sse import BadStream
from loadgen.client.protocol.tally import StreamTally
from loadgen.client.transport import SEQ_HEADER, Exchange, FastPath, Transport, WireError
from loadgen.clock import SPIN_NS, Clock, quiet_gc, sleep_until
from loadgen.records import Record, RecordWriter
from loadgen.workload.session import Conversation, Session, Turn, build_body

__all__ = ["Engine"]

_LOOKAHEAD = 256  # sessions built ahead of their send time
_BUILD_MARGIN_NS = 3_000_000  # stop building when the next send is this close
# A request is started this long before its instant and its bytes held until then (holds.py):
# the client's own work before the write (~0.3-1 ms on a small machine) is not schedule lag.
# Longer than a burst of reads (a decode step's tokens for every stream arrive at once,
# and hundreds of streams take several ms to read), so a request is ready before its
# instant even when a burst delayed its preparation; it is then sent from inside the burst.
LEAD_NS = 25_000_000
_LONG_WAIT_NS = 50_000_000  # a dispatcher wait longer than this also watches for a stop


class _Ahead(NamedTuple):
    """A session built ahead of its send time."""

    at: int  # its intended instant
    session: Session


class _Inflight:
    """A request being sent or answered: what the timeouts watch."""

    __slots__ = ("task", "tally", "deadline_first", "deadline_total", "why")

    def __init__(self, task: asyncio.Task[Any] | None, tally: StreamTally, now: int, t: Timeouts) -> None:
        self.task = task
        self.tally = tally  # its ``t_read``: when the body's last read came (0: none yet)
        self.deadline_first = now + int(t.first_byte * 1e9)
        self.deadline_total = now + int(t.total * 1e9)
        self.why: str | None = None  # why the engine cut it off (a timeout), if it did


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        writer: RecordWriter,
        *,
        api_key: str | None = None,
        clock: Clock = time.perf_counter_ns,
        transport: Transport | None = None,
    ) -> None:
        self.cfg = config
        self.writer = writer
        self.clock = clock
        self.transport: Transport = (
            transport
            if transport is not None
            else AiohttpTransport(
                config.url + config.path, connect_timeout_s=config.timeouts.connect, read_bufsize=config.read_bufsize
            )
        )
        self.live = LiveCounters()
        self.fast_path = FastPath(False, "the run has not started")  # what the transport said at the start
        self._secrets = (api_key,) if api_key else ()
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._stop = asyncio.Event()
        self._inflight: dict[int, _Inflight] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._seq = 0
        self._slots: asyncio.Semaphore | None = None
        self._holds = HoldQueue(clock)  # requests held for their instants (sent from reads too)
        self._lead_ns = LEAD_NS

    # -- public ----------------------------------------------------------------
    def stop(self) -> None:
        """Stop sending new requests (Ctrl-C); requests in flight get the grace."""
        self._stop.set()

    async def run(self, plan: Plan, start_ns: int, grace_s: float = 30.0) -> None:
        """Send the plan from ``start_ns`` (a shared instant on the engine's clock)."""
        self._slots = asyncio.Semaphore(self.cfg.max_inflight)
        connections = plan.concurrency or self.cfg.max_inflight
        async with self.transport.open(self.clock, self._holds, connections) as fit:
            self.fast_path = fit
            self._lead_ns = LEAD_NS if fit.ok else 0  # no holding: each request is prepared at its instant
            keeper = asyncio.get_running_loop().create_task(self._housekeeping())
            try:
                with quiet_gc():
                    if plan.concurrency:
                        await self._closed_loop(plan, start_ns)
                    else:
                        await self._open_loop(plan, start_ns)
                    await self._drain(grace_s)
            finally:
                keeper.cancel()
                self.writer.flush()

    # -- dispatch -----------------------------------------------------------------
    async def _open_loop(self, plan: Plan, start_ns: int) -> None:
        """Send each session at its instant. Sessions are built ahead, in the idle time
        before the next send is due (up to ``_LOOKAHEAD`` of them), so building a long
        prompt never delays a send that is already due. Each request is started
        ``LEAD_NS`` early and its bytes held until the instant (holds.py)."""
        assert plan.offsets_ns is not None
        offsets = plan.offsets_ns
        indices = (plan.indices if plan.indices is not None else np.arange(len(offsets))).tolist()
        self.live.scheduled = len(indices)
        loop = asyncio.get_running_loop()
        lead, holds, clock = self._lead_ns, self._holds, self.clock
        ahead: deque[_Ahead] = deque()
        todo = iter(indices)
        exhausted = False
        while True:
            while (
                not exhausted
                and len(ahead) < _LOOKAHEAD
                and (not ahead or min(ahead[0].at - lead, holds.next_due) - clock() > _BUILD_MARGIN_NS)
            ):
                i = next(todo, None)
                if i is None:
                    exhausted = True
                    break
                ahead.append(_Ahead(start_ns + int(offsets[i]), plan.session(i)))
            if not ahead:
                return
            nxt = ahead.popleft()
            delay = nxt.at - lead - clock()
            if delay > _LONG_WAIT_NS:  # long gaps: stay responsive to a stop
                try:
                    await asyncio.wait_for(self._stop.wait(), (delay - SPIN_NS) / 1e9)
                    return  # stopped: the drain starts now, not at the next instant
                except asyncio.TimeoutError:
                    pass
            await sleep_until(nxt.at - lead, clock, spin_ns=0)  # coarse: the hold is the precise part
            if self._stop.is_set():
                return
            task = loop.create_task(self._run_session(nxt.session, nxt.at))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(0)  # let it send now, before more sessions are built

    async def _closed_loop(self, plan: Plan, start_ns: int) -> None:
        end = start_ns + int(plan.duration_s * 1e9) if plan.duration_s else None
        counter = iter(range(self.cfg.shard, 1 << 62, self.cfg.shards))
        count = plan.count

        async def user() -> None:
            for i in counter:
                if count is not None and i >= count:
                    return
                now = self.clock()
                if self._stop.is_set() or (end is not None and now >= end):
                    return
                await self._run_session(plan.session(i), now)

        await sleep_until(start_ns, self.clock)
        users = [asyncio.ensure_future(user()) for _ in range(plan.concurrency or 1)]
        self._tasks.update(users)
        for u in users:
            u.add_done_callback(self._tasks.discard)
        everyone: asyncio.Future[Any] = asyncio.gather(*users, return_exceptions=True)
        stopper: asyncio.Future[Any] = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait([everyone, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()

    async def _drain(self, grace_s: float) -> None:
        """Give requests still in flight ``grace_s``; the rest are recorded as cancelled."""
        if not self._tasks:
            return
        _, still = await asyncio.wait(list(self._tasks), timeout=grace_s)
        for t in still:
            t.cancel()
        if still:
            await asyncio.wait(still, timeout=10)

    # -- sessions and requests ----------------------------------------------------
    async def _run_session(self, session: Session, t_start: int) -> None:
        conv = Conversation(session.system)
        t_sched = t_start
        for turn_no, turn in enumerate(session.turns):
            if turn.children:
                await asyncio.gather(*(self._run_session(c, self.clock()) for c in turn.children))
                t_sched = max(t_sched, self.clock())
            if turn_no > 0:  # a later turn, after its think time: started early and held, as the first
                await sleep_until(t_sched - self._lead_ns, self.clock, spin_ns=0)
            if self._stop.is_set() and turn_no > 0:
                return
            conv.add_turn(turn)
            keep = self.cfg.keep_text or turn_no + 1 < len(session.turns)
            rec, text = await self._request(session, turn, turn_no, conv, t_sched, keep)
            if rec.status != "ok":
                return  # a session cannot go on without its answer
            conv.add_answer(text)
            if turn_no + 1 < len(session.turns):
                nxt = session.turns[turn_no + 1]
                t_sched = (rec.t_done or self.clock()) + nxt.think_ns

    async def _request(
        self, session: Session, turn: Turn, turn_no: int, conv: Conversation, t_sched: int, keep_text: bool
    ) -> tuple[Record, str]:
        cfg = self.cfg
        seq = cfg.shard + cfg.shards * self._seq
        self._seq += 1
        rec = Record(
            run_id=cfg.run_id,
            point=cfg.point,
            shard=cfg.shard,
            request=seq,
            session=session.session,
            turn=turn_no,
            endpoint=cfg.endpoint_label,
            model=cfg.model,
            api=cfg.api,
            t_sched=t_sched,
            prompt_tokens_requested=turn.prompt_tokens or None,
            output_tokens_requested=turn.max_tokens,
        )
        extra = {**cfg.extra_body, **session.extra} if session.extra else cfg.extra_body
        body = build_body(cfg.api, cfg.model, conv, turn.max_tokens, ignore_eos=cfg.ignore_eos, extra=extra)
        tally = StreamTally(cfg.api, keep_text=keep_text)
        headers = {
            **self._headers,
            "X-Loadgen-Run": cfg.run_id,
            SEQ_HEADER: str(seq),
            "X-Request-Id": f"{cfg.run_id}-{seq}",
        }
        assert self._slots is not None
        if self._slots.locked():
            self.live.capped += 1
        async with self._slots:
            # its timeouts run from its instant (a request prepared early is not waiting yet)
            me = _Inflight(asyncio.current_task(), tally, max(self.clock(), t_sched), cfg.timeouts)
            self._inflight[seq] = me
            self.live.inflight += 1
            try:
                await self._exchange(rec, tally, Exchange(seq, body, headers, t_sched))
            except asyncio.CancelledError:
                rec.status = "timeout" if me.why else "cancelled"
                rec.error = me.why or "run stopped before the answer ended"
                if not me.why:
                    self._finish(rec, tally)
                    raise
            finally:
                del self._inflight[seq]
                self.live.inflight -= 1
        self._finish(rec, tally)
        return rec, tally.text

    async def _exchange(self, rec: Record, tally: StreamTally, ex: Exchange) -> None:
        self.live.sent += 1
        try:
            # the hot path is inside: each read stamped on arrival and fed to the tally
            await self.transport.exchange(ex, tally.feed)
            if ex.status != 200:
                rec.status = "http_error"
                rec.error = redact(f"HTTP {ex.status}: {ex.error.decode('utf-8', 'replace')}", self._secrets)
                if ex.retry_after:
                    rec.error = redact(f"{rec.error} (Retry-After: {ex.retry_after})", self._secrets)
                return
            tally.close(self.clock())
            if tally.events == 0:
                rec.status = "bad_stream"
                rec.error = f"HTTP 200 but no SSE events (Content-Type {ex.content_type!r})"
            elif not tally.done and tally.finish_reason is None:
                rec.status = "disconnected"
                rec.error = "stream ended without [DONE] or a finish_reason"
        except StreamError as e:
            rec.status, rec.error = "http_error", redact(f"error in stream: {e}", self._secrets)
        except BadStream as e:
            rec.status, rec.error = "bad_stream", redact(str(e), self._secrets)
        except WireError as e:
            rec.status, rec.error = e.status, redact(str(e), self._secrets)
        except (ValueError, OSError) as e:
            rec.status, rec.error = "client_error", redact(f"{type(e).__name__}: {e}", self._secrets)
        finally:  # what the wire saw, however it ended
            rec.t_sent, rec.t_headers, rec.http_status = ex.t_sent, ex.t_headers, ex.status

    def _finish(self, rec: Record, tally: StreamTally) -> None:
        if rec.t_done is not None:
            return
        rec.t_done = self.clock()
        counts, total, source = tally.reconcile()
        rec.chunk_ns = tally.chunk_ns
        rec.chunk_tokens = counts
        rec.output_tokens = total
        rec.output_tokens_source = source
        rec.output_tokens_reported = tally.completion_tokens
        rec.prompt_tokens_reported = tally.prompt_tokens
        rec.cached_tokens = tally.cached_tokens
        rec.finish_reason = tally.finish_reason
        if tally.chunk_ns:
            rec.t_first, rec.t_last = tally.chunk_ns[0], tally.chunk_ns[-1]
        if self.cfg.keep_text:
            rec.output_text = tally.text
        self.writer.add(rec)
        live = self.live
        live.done += 1
        if rec.status != "ok":
            live.errors += 1
        elif rec.t_first is not None:
            live.recent_ttft_ms.append((rec.t_first - rec.t_sched) / 1e6)
            if rec.output_tokens > 1 and rec.t_last is not None:
                live.recent_itl_ms.append((rec.t_last - rec.t_first) / 1e6 / (rec.output_tokens - 1))
        if rec.t_sent is not None:
            live.recent_lag_ms.append((rec.t_sent - rec.t_sched) / 1e6)

    async def _housekeeping(self) -> None:
        """Flush records, enforce timeouts, and measure event-loop lag."""
        interval = self.cfg.flush_interval_s
        idle_ns = int(self.cfg.timeouts.idle * 1e9)
        while True:
            before = self.clock()
            await asyncio.sleep(interval)
            now = self.clock()
            lag_ms = (now - before) / 1e6 - interval * 1e3
            self.live.loop_lag_max_ms = max(self.live.loop_lag_max_ms, lag_ms)
            self.writer.flush()
            for me in list(self._inflight.values()):
                if me.why or me.task is None:
                    continue
                if now > me.deadline_total:
                    me.why = "total timeout"
                elif not me.tally.t_read and now > me.deadline_first:
                    me.why = "no data before the first-byte timeout"
                elif me.tally.t_read and now - me.tally.t_read > idle_ns:
                    me.why = "idle timeout between chunks"
                if me.why:
                    me.task.cancel()
