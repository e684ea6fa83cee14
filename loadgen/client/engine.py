"""The engine: sends each request at its intended time, times every chunk, records.

It computes no statistics. Open loop: a session starts at its scheduled offset
whether or not earlier ones finished; closed loop (a fixed number of users,
each sending when its previous request ended) is a separate, labelled mode.
Every scheduled request yields exactly one ``Record``, whatever happens to it: one
never written to the wire (the run was stopped first, its session could not go on,
the drain ended while it waited for a ``--max-inflight`` slot) is ``not_sent``.

A stop (``stop``: Ctrl-C, SIGTERM) ends the sending at once; what is on the wire gets the
drain. The drain lasts while sessions run (their think times and later turns too), up to
``grace_s`` after the last turn sent (or the stop); then what is on the wire is cancelled
and every turn not sent is recorded as such. A second stop ends the drain at once.

Each request's timeouts are a timer of its own (session_runs.py), so a deadline fires within
a millisecond or two of its time however many requests are in flight; a probe (loop_probe.py)
measures for the whole run how late the loop runs what is due and how late it stamps a read.

It takes its clock and its transport as parameters (``time.perf_counter_ns`` and
the one ``--transport`` names by default: client.wire.choice), so its scheduling, holds,
timeouts, drain and cancellation can be driven without sockets, on virtual time
(``loadgen.clock.VirtualLoop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from loadgen.client.config import EngineConfig, LiveCounters, Plan
from loadgen.client.fingerprint import Traffic
from loadgen.client.gc_pauses import short_gc_pauses
from loadgen.client.holds import HoldQueue
from loadgen.client.loop_probe import LoopProbe
from loadgen.client.outcome import Say
from loadgen.client.session_runs import Ahead, SessionRuns
from loadgen.client.transport import FastPath, Transport
from loadgen.client.wire.choice import WireChoice, transport_for
from loadgen.clock import SPIN_NS, Clock, sleep_until
from loadgen.records import RecordWriter
from loadgen.redaction import Secrets
from loadgen.untrusted import clean_text
from loadgen.workload.session import Session
from loadgen.workload.tokenizer import Tokenizer, get_tokenizer

__all__ = ["Engine", "LEAD_NS"]

_LOOKAHEAD = 256  # sessions built ahead of their send time
_BUILD_MARGIN_NS = 3_000_000  # stop building when the next send is this close
# A request is started this long before its instant and its bytes held until then (holds.py):
# the client's own work before the write (~0.3-1 ms on a small machine) is not schedule lag.
# Its preparation takes several turns of the loop (the dispatcher's wake, the session task's
# first step, a fresh connection's connect and its completion, the hold), and a turn lasts a
# burst of reads (a decode step's tokens for every stream arrive at once: 800 streams take
# 8-12 ms to read on the 2-core VM). 25 ms, two such turns, left a ramp to 800 streams
# preparing requests after their instants; 100 ms holds for eight, so a request is ready
# before its instant even when bursts delayed its preparation, and is then sent from
# inside the burst.
LEAD_NS = 100_000_000
_LONG_WAIT_NS = 50_000_000  # a dispatcher wait longer than this also watches for a stop
_UNSENT_YIELD = 256  # never-sent sessions recorded between two yields to the loop


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        writer: RecordWriter,
        *,
        api_key: str | None = None,
        secrets: Secrets | None = None,
        clock: Clock = time.perf_counter_ns,
        transport: Transport | None = None,
    ) -> None:
        self.cfg = config
        self.writer = writer
        self.clock = clock
        self.wire: WireChoice | None = None  # the transport chosen for the run's URL, and why (client.wire.choice)
        self.transport: Transport = transport if transport is not None else self._transport_to(config.request_url)
        # a pipeline's stages, each through a transport of its own (its URL, its pool: client.stages);
        # a scripted transport (tests) carries every stage
        self.stage_transports: dict[str, Transport] = {
            s.stage: transport if transport is not None else self._transport_to(config.route(s.stage, s.api).url)
            for s in config.stages
        }
        self.live = LiveCounters()
        self.traffic = Traffic()  # fingerprints of the requests written to the wire (client.fingerprint)
        self.fast_path = FastPath(False, "the run has not started")  # what the transport said at the start
        self.stop_reason: str | None = None  # why the run was stopped (``stop``), if it was
        self.drain_cut = False  # a second stop ended the drain early
        self.secrets = (
            secrets if secrets is not None else config.http.secrets(api_key, config.url, [s.url for s in config.stages])
        )
        self.say = Say(self.secrets)
        # counts each output chunk's text when the stream has no running usage (loaded once: a file)
        self.tokenizer: Tokenizer | None = get_tokenizer(config.tokenizer) if config.tokenizer else None
        self.probe = LoopProbe(clock)  # the client's self-check: loop lag and read lateness
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}
        headers.update(config.http.request_headers(api_key))  # the key's header and every -H header
        self._holds = HoldQueue(clock)  # requests held for their instants (sent from reads too)
        self.sessions = SessionRuns(self, headers)
        self._drained = False
        self._stop = asyncio.Event()
        self._cut = asyncio.Event()  # a second stop: the drain ends now
        self._stopped_at = 0
        # the sessions never started (the run was stopped first), with their instants (None: now)
        self._left: Iterator[tuple[Session, int | None]] = iter(())

    def _transport_to(self, url: str) -> Transport:
        """The transport that carries requests to ``url`` (one route of the endpoint)."""
        choice = transport_for(self.cfg, url)
        if self.wire is None:  # the run's own URL comes first
            self.wire = choice
        return choice.transport

    # -- public ----------------------------------------------------------------
    def stop(self, reason: str = "interrupted") -> None:
        """First call: stop sending (nothing more goes out; what is on the wire gets the drain).
        Second call: end the drain now. Never awaits, so a signal handler may call it."""
        if self.stop_reason is None:
            self.stop_reason = clean_text(reason, 80) or "interrupted"
            self._stopped_at = self.clock()
            self.live.stop_ns = self._stopped_at
            self._stop.set()
            self._holds.close()  # before any read can send one of them
            self.sessions.cut_unsent(f"run stopped ({self.stop_reason})")
        elif not self._drained and not self._cut.is_set():
            self.drain_cut = True
            self._cut.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def stop_cause(self) -> str:
        """Why a turn is no longer sent, once the run was stopped."""
        return f"run stopped ({self.stop_reason})"

    async def run(self, plan: Plan, start_ns: int, grace_s: float = 30.0) -> None:
        """Send the plan from ``start_ns`` (a shared instant on the engine's clock)."""
        self.sessions.open(self.cfg.max_inflight)
        self.live.start_ns = start_ns
        connections = plan.concurrency or self.cfg.max_inflight
        async with contextlib.AsyncExitStack() as opened:
            fit = await opened.enter_async_context(self.transport.open(self.clock, self._holds, connections))
            for t in {id(t): t for t in self.stage_transports.values() if t is not self.transport}.values():
                own = await opened.enter_async_context(t.open(self.clock, self._holds, connections))
                fit = fit if own.ok else own  # every route must hold requests for the run to
            self.fast_path = fit
            self.sessions.lead_ns = LEAD_NS if fit.ok else 0  # no holding: each request prepared at its instant
            self.probe.start()
            keeper = asyncio.get_running_loop().create_task(self._housekeeping())
            try:
                with short_gc_pauses():
                    if plan.concurrency:
                        await self._closed_loop(plan, start_ns)
                    else:
                        await self._open_loop(plan, start_ns)
                    await self._drain(grace_s)
                self._drained = True
                await self._record_left()
            finally:
                keeper.cancel()
                self.probe.stop()
                self.live.loop_lag_max_ms = self.probe.lag_max_ms
                self._flush()

    # -- dispatch -----------------------------------------------------------------
    async def _open_loop(self, plan: Plan, start_ns: int) -> None:
        """Send each session at its instant. Sessions are built ahead, in the idle time
        before the next send is due (up to ``_LOOKAHEAD`` of them), so building a long
        prompt never delays a send that is already due. Each request is started
        ``LEAD_NS`` early and its bytes held until the instant (holds.py). Stopped, the
        sessions not dispatched are kept for ``_record_left``."""
        assert plan.offsets_ns is not None
        offsets = plan.offsets_ns
        indices = (plan.indices if plan.indices is not None else np.arange(len(offsets))).tolist()
        self.live.scheduled = len(indices)
        self.live.span_ns = int(offsets[indices].max()) if indices else 0  # the last send, for the live view
        lead, holds, clock, sessions = self.sessions.lead_ns, self._holds, self.clock, self.sessions
        ahead: deque[Ahead] = deque()
        todo = iter(indices)
        self._left = _unstarted(plan, ahead, todo, offsets, start_ns)
        exhausted = False
        while not self._stop.is_set():
            while (
                not exhausted
                and len(ahead) < _LOOKAHEAD
                and (not ahead or min(ahead[0].at - lead, holds.next_due) - clock() > _BUILD_MARGIN_NS)
            ):
                i = next(todo, None)
                if i is None:
                    exhausted = True
                    break
                ahead.append(Ahead(start_ns + int(offsets[i]), plan.session(i)))
            if not ahead:
                return
            nxt = ahead[0]
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
            ahead.popleft()
            sessions.spawn(nxt.session, nxt.at, top=True)
            if not ahead or ahead[0].at - lead > clock():
                await asyncio.sleep(0)  # let it send now, before more sessions are built
            # else the next is due too: started in this same turn of the loop. Yielding after
            # each start let a busy loop (turns of 8-20 ms at the end of a ramp to 800 streams)
            # start one or two sessions a turn, fewer than fell due: its last 200 ms fell 100-385
            # ms behind (test_engine_schedule's busy loop pins it).

    async def _closed_loop(self, plan: Plan, start_ns: int) -> None:
        """Users each send a session when their previous one ended. Stopped, the sessions of
        ``count`` never started are kept for ``_record_left``."""
        end = start_ns + int(plan.duration_s * 1e9) if plan.duration_s else None
        counter = iter(range(self.cfg.shard, 1 << 62, self.cfg.shards))
        count = plan.count
        sessions, unstarted = self.sessions, []

        async def user() -> None:
            for i in counter:
                if count is not None and i >= count:
                    return
                now = self.clock()
                if self._stop.is_set() or (end is not None and now >= end):
                    unstarted.append(i)
                    return
                await sessions.run_here(plan.session(i), now)

        await sleep_until(start_ns, self.clock)
        users = [sessions.track(asyncio.ensure_future(user())) for _ in range(plan.concurrency or 1)]
        everyone: asyncio.Future[Any] = asyncio.gather(*users, return_exceptions=True)
        stopper: asyncio.Future[Any] = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait([everyone, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if count is not None:  # (with only a duration, nothing is owed after the stop)
            n = count
            rest = itertools.takewhile(lambda i: i < n, counter)
            self._left = ((plan.session(i), None) for it in (unstarted, rest) for i in it)

    async def _drain(self, grace_s: float) -> None:
        """Wait for the running sessions, until ``grace_s`` after the last turn sent (or the
        stop, or a second stop); then what is on the wire is cancelled, the rest not sent."""
        sessions, grace_ns = self.sessions, int(grace_s * 1e9)
        while sessions.busy and not self._cut.is_set():
            left = max(sessions.last_instant, self._stopped_at) + grace_ns - self.clock()
            if left <= 0:
                break
            waits = [asyncio.ensure_future(sessions.idle.wait()), asyncio.ensure_future(self._cut.wait())]
            await asyncio.wait(waits, timeout=left / 1e9, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        if not sessions.busy:
            return
        if self._cut.is_set():
            cause = f"drain cut short ({self.stop_reason})"
        elif self.stop_reason is not None:
            cause = f"run stopped ({self.stop_reason}), drain of {grace_s:g} s over"
        else:
            cause = f"drain of {grace_s:g} s after the last send over"
        await sessions.cut_all(cause)

    async def _record_left(self) -> None:
        """Record every session the run was stopped before starting, each turn ``not_sent``
        (with its planned instant; in closed loop, the time it was given up)."""
        if not self._stop.is_set():
            return
        why = f"not sent: {self.stop_cause}"
        for n, (session, at) in enumerate(self._left, 1):
            self.sessions.record_unsent(session, 0, self.clock() if at is None else at, why)
            if n % _UNSENT_YIELD == 0:
                await asyncio.sleep(0)  # a second stop, the live view, a flush: they still run

    # -- housekeeping -------------------------------------------------------------
    def _flush(self) -> None:
        try:
            self.writer.flush()
        except Exception as e:  # the writer must never take the run down; counted, shown
            self.live.writer_errors += 1
            self.live.last_error = self.say(f"writer.flush: {type(e).__name__}: {e}")

    async def _housekeeping(self) -> None:
        """Flush records and show the loop lag in the live view. One pass that fails (a writer,
        a bug) is counted and the next goes on; timeouts are not enforced here (each request has
        its own timer)."""
        interval = self.cfg.flush_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                self.live.loop_lag_max_ms = self.probe.lag_max_ms
                self._flush()
            except Exception as e:
                self.live.housekeeping_errors += 1
                self.live.last_error = self.say(f"housekeeping: {type(e).__name__}: {e}")


def _unstarted(
    plan: Plan, ahead: deque[Ahead], todo: Iterator[int], offsets: np.ndarray, start_ns: int
) -> Iterator[tuple[Session, int | None]]:
    """The open loop's sessions not dispatched, when it stops: those built ahead, then the rest."""
    while ahead:
        nxt = ahead.popleft()
        yield nxt.session, nxt.at
    for i in todo:
        yield plan.session(i), start_ns + int(offsets[i])
