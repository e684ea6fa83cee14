"""Sessions as the engine runs them: each turn sent in order, and a record for every turn.

Each session runs in a task of its own (a ``_Run``; a closed-loop user runs its sessions in its
own task, one after another: ``run_here``), its turns one after another: turn k+1
is due ``think_ns`` after turn k's answer ended. A session cannot go on without its answer,
so after a turn that failed its later turns are ``not_sent``; so are the turns a stop or the
end of the drain leaves unsent. A stop cuts every session that has nothing on the wire (it
waits for its instant, a think time, or a ``--max-inflight`` slot); the end of the drain cuts
every one (what is on the wire is then ``cancelled``). Whatever way a session's task ends
(even cancelled before it ran, or by a bug), every turn of it gets exactly one record.

Each request's timeouts (config.Timeouts) are watched by a timer of its own
(``request_timer.RequestTimer``).

A request offering ``tools`` has its answer's calls captured, counted (``tool_calls``), and sent
back by the next turn with a ``role: tool`` message each (``workload.session.Conversation``).

A pipeline's stage turn (``Turn.stage``) goes to its stage's route (``EngineConfig.route``: its
endpoint, model and API) through that stage's transport; a pooled stage (embeddings, rerank)
sends its own body fields (``Turn.extra``) and stays outside the conversation, and ``--extra-body``
goes only to the turns of the run's own API (the generating requests).
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple, Protocol

import orjson

from loadgen.client.config import EngineConfig, LiveCounters, Route
from loadgen.client.fingerprint import Traffic, first_request, later_request
from loadgen.client.outcome import Say, fill, judge, judge_error, new_record, not_sent
from loadgen.client.protocol.tallies import Tally, new_tally
from loadgen.client.protocol.template import Learned
from loadgen.client.request_timer import Limits, RequestTimer
from loadgen.client.slots import Slots
from loadgen.client.transport import SEQ_HEADER, Exchange, Transport
from loadgen.clock import Clock, sleep_until
from loadgen.records import Record, RecordWriter
from loadgen.workload.pooled import POOLED_APIS, inputs_sent
from loadgen.workload.request_body import request_body
from loadgen.workload.session import Conversation, Session, ToolCall, Turn
from loadgen.workload.tokenizer import Tokenizer

__all__ = ["Ahead", "Host", "SessionRuns"]


class Host(Protocol):
    """What the sessions use of their engine (``loadgen.client.engine.Engine``)."""

    cfg: EngineConfig
    writer: RecordWriter
    clock: Clock
    transport: Transport
    live: LiveCounters
    say: Say
    traffic: Traffic
    tokenizer: Tokenizer | None
    stage_transports: dict[str, Transport]

    @property
    def stopped(self) -> bool:
        """The run was stopped: nothing more is sent."""
        ...

    @property
    def stop_cause(self) -> str:
        """Why, as a record's error says it."""
        ...


class Ahead(NamedTuple):
    """A session built ahead of its send time."""

    at: int  # its intended instant
    session: Session


class _Run:
    """One session in its task: what a stop or the end of the drain may cut."""

    __slots__ = ("task", "session", "t_start", "started", "ex", "children", "cut", "first", "last", "answer", "called")

    def __init__(self, session: Session, t_start: int) -> None:
        self.task: asyncio.Task[None] | None = None
        self.session = session
        self.t_start = t_start
        self.started = False  # its coroutine ran (a task cancelled before that never runs it)
        self.ex: Exchange | None = None  # its request being prepared, waiting for a slot, or on the wire
        self.children = False  # it waits for its subagent sessions (each a run of its own)
        self.cut: str | None = None  # why the engine cut it off
        self.first = 0  # the salt-free digest of its first request (its later turns are keyed by it)
        self.last = 0  # the exact digest of its latest request (the next one's chains from it)
        self.answer = ""  # the text of its latest answer (the next request repeats it)
        self.called = 0  # the tool calls of its latest answer (the next request answers each)

    @property
    def on_wire(self) -> bool:
        return self.ex is not None and self.ex.t_sent is not None

    def cut_off(self, cause: str) -> None:
        if self.cut is None:
            self.cut = cause
        if self.task is not None:
            self.task.cancel()


class SessionRuns:
    """The sessions of one engine run, their requests, and what is still owed a record."""

    def __init__(self, engine: Host, headers: dict[str, str]) -> None:
        self.engine = engine
        self.headers = headers
        self.lead_ns = 0  # how early a request is prepared (the engine sets it for the transport)
        self.last_instant = 0  # the latest instant of a turn handed to the wire: the drain counts from it
        self.idle = asyncio.Event()  # no top-level task running
        self.idle.set()
        self._top: set[asyncio.Future[Any]] = set()
        self._runs: dict[asyncio.Task[Any], _Run] = {}
        self._slots = Slots(1)
        self._limits: Limits | None = None  # the run's timeouts (``open``)
        self._all_cut = False  # the end of the drain cut every session (cut_all)
        self._seq = 0
        self._routes: dict[tuple[str, str], Route] = {}
        self._learned: dict[Route, Learned] = {}  # each route's content template (protocol.template)
        self._model_json = orjson.dumps(engine.cfg.model)  # (what the salt-free fingerprint leaves out)

    def route(self, turn: Turn) -> Route:
        """Where ``turn``'s request goes (worked out once per stage and API)."""
        key = (turn.stage, turn.api)
        found = self._routes.get(key)
        if found is None:
            found = self._routes[key] = self.engine.cfg.route(*key)
        return found

    def open(self, max_inflight: int) -> None:
        self._slots = Slots(max_inflight)
        self._limits = Limits(self.engine.cfg.timeouts, self.engine.clock)

    @property
    def busy(self) -> bool:
        return bool(self._top)

    # -- tasks ----------------------------------------------------------------------
    def track(self, task: asyncio.Task[Any] | asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Count ``task`` among those the drain waits for."""
        self._top.add(task)
        self.idle.clear()
        task.add_done_callback(self._untrack)
        return task

    def _untrack(self, task: asyncio.Future[Any]) -> None:
        self._top.discard(task)
        if not self._top:
            self.idle.set()

    def spawn(self, session: Session, t_start: int, top: bool = False) -> asyncio.Task[None]:
        """Run ``session`` (its first turn due at ``t_start``) in a task of its own."""
        run = _Run(session, t_start)
        task = run.task = asyncio.get_running_loop().create_task(self._session(run))
        self._runs[task] = run
        task.add_done_callback(self._ended)
        if top:
            self.track(task)
        return task

    async def run_here(self, session: Session, t_start: int) -> None:
        """Run ``session`` in the calling task (a closed-loop user's, which runs one session at a
        time), as ``spawn``'s own task would, and return when it ended, however it ended: cut
        off by the engine (a stop), it returns; the caller's own cancellation (the end of the
        drain cuts the users too) goes on. No task, no gather: ~4 us a request less than
        spawning one and waiting for it (benchmarks/client_capacity.py, 1-token answers)."""
        task = asyncio.current_task()
        assert task is not None, "run_here() outside a task"
        run = _Run(session, t_start)
        run.task = task
        self._runs[task] = run
        try:
            await self._session(run)
        except asyncio.CancelledError:
            if run.cut is None or self._all_cut:
                raise
            uncancel = getattr(task, "uncancel", None)  # 3.11 on: the cut's cancel taken back
            if uncancel is not None and uncancel() > 0:
                raise  # cancelled by someone else too
        except Exception as e:
            self._bug(e)
        finally:
            self._runs.pop(task, None)

    def _ended(self, task: asyncio.Task[None]) -> None:
        run = self._runs.pop(task, None)
        if run is not None and not run.started:  # cancelled before it ran: every turn is still owed
            self.record_unsent(run.session, 0, run.t_start, f"not sent: {run.cut or 'cancelled before it started'}")
        if not task.cancelled() and task.exception() is not None:
            self._bug(task.exception())

    def _bug(self, e: BaseException | None) -> None:
        """A session's task raised (a bug): counted and shown."""
        live = self.engine.live
        live.internal_errors += 1
        live.last_error = self.engine.say(f"session: {type(e).__name__}: {e}")

    def cut_unsent(self, cause: str) -> None:
        """A stop: every session with nothing on the wire ends now, its turns ``not_sent``."""
        for run in list(self._runs.values()):
            if not run.children and not run.on_wire:
                run.cut_off(cause)

    async def cut_all(self, cause: str) -> None:
        """The end of the drain: every session ends now (on the wire: ``cancelled``)."""
        self._all_cut = True
        for run in list(self._runs.values()):
            run.cut_off(cause)
        for task in list(self._top):
            task.cancel()
        tasks = [*self._runs, *self._top]
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    # -- one session ----------------------------------------------------------------
    async def _session(self, run: _Run) -> None:
        run.started = True
        engine, session = self.engine, run.session
        turns = session.turns
        t_sched, done, children_of, cause = run.t_start, 0, -1, "?"
        try:
            conv = Conversation(session.system)
            for k, turn in enumerate(turns):
                if turn.children and not engine.stopped:
                    children_of, run.children = k, True
                    kids = [self.spawn(c, engine.clock()) for c in turn.children]
                    await asyncio.gather(*kids, return_exceptions=True)
                    run.children = False
                    t_sched = max(t_sched, engine.clock())
                if k > 0 and not engine.stopped:  # a later turn, after its think time: started early and held
                    await sleep_until(t_sched - self.lead_ns, engine.clock, spin_ns=0)
                if engine.stopped:
                    cause = engine.stop_cause
                    break
                pooled = self.route(turn).api in POOLED_APIS  # a pooled stage: outside the context
                if not pooled:
                    conv.add_turn(turn)
                keep = engine.cfg.keep_text or k + 1 < len(turns)
                try:
                    rec, text, calls = await self._request(run, turn, k, conv, t_sched, keep)
                finally:
                    done = k + 1  # recorded, however it ended
                if rec.status != "ok":
                    cause = f"turn {k} of its session ended {rec.status}"
                    break
                if not pooled:
                    conv.add_answer(text, calls)
                run.answer, run.called = text, len(calls)
                if k + 1 < len(turns):
                    t_sched = (rec.t_done or engine.clock()) + turns[k + 1].think_ns
        except asyncio.CancelledError:
            cause = run.cut or "the engine was cancelled"
            raise
        except Exception as e:  # a bug: the turns are still owed their records
            cause = f"internal error ({type(e).__name__}: {e})"
            raise
        finally:
            if done < len(turns):  # the earliest instant each could have had
                at = max(t_sched, engine.clock())
                self.record_unsent(session, done, at, f"not sent: {cause}", children_ran=children_of == done)

    def record_unsent(self, session: Session, first: int, t_sched: int, why: str, children_ran: bool = False) -> None:
        """A ``not_sent`` record for each turn of ``session`` from ``first`` on, and for each
        turn of their subagent sessions (except those of turn ``first`` when they ran)."""
        for k in range(first, len(session.turns)):
            turn = session.turns[k]
            if turn.children and not (children_ran and k == first):
                for child in turn.children:
                    self.record_unsent(child, 0, t_sched, why)
            rec = new_record(self.engine.cfg, self._next_seq(), session.session, k, turn, t_sched, self.route(turn))
            self._unsent(rec, why)

    # -- one request ----------------------------------------------------------------
    def _next_seq(self) -> int:
        cfg = self.engine.cfg
        seq = cfg.shard + cfg.shards * self._seq
        self._seq += 1
        return seq

    async def _request(
        self, run: _Run, turn: Turn, turn_no: int, conv: Conversation, t_sched: int, keep_text: bool
    ) -> tuple[Record, str, tuple[ToolCall, ...]]:
        engine = self.engine
        cfg, live, session = engine.cfg, engine.live, run.session
        seq = self._next_seq()
        route = self.route(turn)
        rec = new_record(cfg, seq, session.session, turn_no, turn, t_sched, route)
        if turn.extra is not None:  # a stage's own body (--extra-body is the generating requests')
            extra = turn.extra
        else:
            extra = {**cfg.extra_body, **session.extra} if session.extra else cfg.extra_body
        body = request_body(
            route.api,
            route.model,
            conv,
            turn.max_tokens,
            ignore_eos=cfg.ignore_eos,
            extra=extra,
            continuous_usage=cfg.continuous_usage,
            max_tokens_field=cfg.max_tokens_field,
        )
        learned = self._learned.get(route)
        if learned is None:
            learned = self._learned[route] = Learned()
        tally = new_tally(route.api, extra, keep_text=keep_text, tokenizer=engine.tokenizer, learned=learned)
        if route.api in POOLED_APIS:
            rec.inputs = inputs_sent(route.api, extra)
        ids = {"X-Loadgen-Run": cfg.run_id, SEQ_HEADER: str(seq), "X-Request-Id": f"{cfg.run_id}-{seq}"}
        headers = {**self.headers, **ids}
        ex = run.ex = Exchange(seq, body, headers, t_sched)
        me: RequestTimer | None = None
        slots = self._slots
        try:
            if not slots.take():
                live.capped += 1
                await slots.wait()
            try:
                if engine.stopped:  # a slot freed after the stop: nothing more goes out
                    return self._unsent(rec, f"not sent: {engine.stop_cause}"), "", ()
                # its timeouts run from its instant (a request prepared early is not waiting yet)
                assert self._limits is not None, "a request before open()"
                me = RequestTimer(run.task, tally, max(engine.clock(), t_sched), self._limits)
                live.inflight += 1
                self.last_instant = max(self.last_instant, t_sched)
                try:
                    await self._exchange(rec, tally, ex, engine.stage_transports.get(turn.stage, engine.transport))
                finally:
                    me.end()
                    live.inflight -= 1
                    if ex.t_sent is not None:  # after the exchange: hashing never delays a write
                        self._fingerprint(run, turn_no, turn, body)
            finally:
                slots.give()
        except asyncio.CancelledError:
            if me is not None and me.why:  # cut off by a timeout: recorded as that, the session ends
                rec.status, rec.error = "timeout", me.why
                uncancel = getattr(asyncio.current_task(), "uncancel", None)  # 3.11 on: the cancel was ours
                if uncancel is not None:
                    uncancel()
            else:
                cause = run.cut or "the engine was cancelled"
                if ex.t_sent is None:
                    self._unsent(rec, f"not sent: {cause}")
                else:
                    rec.status, rec.error = "cancelled", f"cancelled before the answer ended: {cause}"
                    self._finish(rec, tally)
                raise
        finally:
            run.ex = None
        self._finish(rec, tally)
        return rec, tally.text, tally.tool_calls or ()

    async def _exchange(self, rec: Record, tally: Tally, ex: Exchange, transport: Transport) -> None:
        engine = self.engine
        engine.live.sent += 1
        try:
            # the hot path is inside: each read stamped on arrival and fed to the tally
            await transport.exchange(ex, tally.feed)
            # it ended with its last byte (the last read), not after the HTTP client's cleanup
            t_end = tally.t_read if ex.status == 200 and tally.t_read else engine.clock()
            judge(rec, ex, tally, t_end, engine.say)
            rec.t_done = t_end
        except Exception as e:  # any: a failure is data, and a bug must not lose the record
            judge_error(rec, e, engine.say)
        finally:  # what the wire saw, however it ended
            rec.t_sent, rec.t_headers, rec.http_status = ex.t_sent, ex.t_headers, ex.status

    def _fingerprint(self, run: _Run, turn_no: int, turn: Turn, body: bytes) -> None:
        """Count a request written to the wire in the run's traffic fingerprints (client.fingerprint)."""
        if turn_no == 0:
            salt = run.session.salt
            salt_json = orjson.dumps(salt)[1:-1] if salt else b""
            run.last, run.first = first_request(body, salt_json, self._model_json)
            self.engine.traffic.add(run.last, run.first)
            return
        # what it adds: a tool result per call of the previous answer (if it called), and its text
        added = (f"\x00tools {run.called}\x00" if run.called else "") + turn.text + turn.follow_up
        run.last, unsalted = later_request(run.last, run.first, turn_no, turn.max_tokens, run.answer, added)
        self.engine.traffic.add(run.last, unsalted)

    def _finish(self, rec: Record, tally: Tally) -> None:
        engine = self.engine
        try:
            # an answer that came back ended at its last read (``_exchange``); a failure, now
            fill(rec, tally, rec.t_done or engine.clock(), engine.cfg.keep_text, engine.say)
            rec.tool_calls = tally.tool_call_count
        except Exception as e:  # a bug in the tally: the record is still written
            rec.status = "client_error"
            rec.error = engine.say(f"internal error recording the answer ({type(e).__name__}: {e})")
            rec.t_done = rec.t_done or engine.clock()
        self._write(rec)
        live = engine.live
        live.output_tokens += rec.output_tokens
        if rec.status != "ok":
            live.errors += 1
        elif rec.t_first is not None:
            live.recent_ttft_ms.append((rec.t_first - rec.t_sched) / 1e6)
            if rec.output_tokens > 1 and rec.t_last is not None:
                live.recent_itl_ms.append((rec.t_last - rec.t_first) / 1e6 / (rec.output_tokens - 1))
        if rec.t_sent is not None:
            live.recent_lag_ms.append((rec.t_sent - rec.t_sched) / 1e6)

    def _unsent(self, rec: Record, why: str) -> Record:
        self._write(not_sent(rec, self.engine.say(why)))
        self.engine.live.not_sent += 1
        return rec

    def _write(self, rec: Record) -> None:
        live = self.engine.live
        live.done += 1
        try:
            self.engine.writer.add(rec)
        except Exception as e:  # the writer must never take the run down; counted, shown
            live.writer_errors += 1
            live.last_error = self.engine.say(f"writer.add: {type(e).__name__}: {e}")
            try:
                self.engine.writer.add_degraded(rec, e)  # the request still ends as one record
            except Exception as again:
                live.last_error = self.engine.say(f"writer.add_degraded: {type(again).__name__}: {again}")
