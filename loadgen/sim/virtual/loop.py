"""The discrete-event loop of a virtual run: sessions in, engine steps back to back, requests out.

``VirtualLoop.run`` alternates two things on one virtual clock. Before each engine step, every
request due by the step's start is sent (submitted to the engine, as the server's handler submits
what arrived while a step ran); then the step is planned and applied with the engine's own
``step_at`` and ``finish_at`` (``sim/engine_loop.py``): the same scheduler, KV blocks, prefix
cache, preemption and step cost as the real-time loop, with no sleeping in between. When the
engine is idle the clock jumps to the next arrival. A request that ends hands its session the
answer (``context.Context``) and schedules the session's next turn ``think_ns`` after its last
token (closed loop within a session), after the turn's subagent sessions where it has any; a
closed-loop user starts its next session when the last ended.

Per token the loop keeps nothing: the run's ``tokens.TokenLog`` holds spans of steps (a steady
decode's tokens are one span of its engine's step ends), and the records' per-token columns are
built from it with numpy at the end; everything else is per request or per step. Steps in which
only counts change (every running sequence a steady decode, nobody waiting or ending, no arrival
due) run back to back in the engine (``quiet_steps``), without a plan each. A synthetic workload's
session comes as its one turn and its prompt's ids (``SingleTurns``): no text is built.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from loadgen.errors import ConfigError
from loadgen.sim.answer import SimConfig, natural_length
from loadgen.sim.model import SimRequest
from loadgen.sim.tool_calls import tool_call_for
from loadgen.sim.virtual.requests import NO_EXTRA, PromptIds, SessionRun, SingleTurns, Unsent, VirtualRequest
from loadgen.sim.virtual.tokens import TokenLog
from loadgen.workload.base import Workload
from loadgen.workload.session import Turn

if TYPE_CHECKING:
    from loadgen.sim.roofline import RooflineModel

__all__ = ["VirtualLoop"]

_NEVER = 1 << 62  # an instant after any run's end
_PUSHED_BITS = 32  # the low bits of a due turn's heap key: the order it was pushed in
_POOLED = ("embeddings", "rerank")  # prefill-only stages: not modelled in virtual time


class VirtualLoop:
    """Sends a workload's sessions into ``engine`` and steps it in virtual time (see the module note)."""

    def __init__(
        self,
        workload: Workload,
        engine: RooflineModel,
        sim: SimConfig,
        *,
        run_id: str,
        origin_ns: int,
        offsets_ns: npt.NDArray[np.int64] | None,
        concurrency: int | None,
        duration_ns: int | None,
        cut_ns: int | None,
        max_sessions: int | None,
        ignore_eos: bool,
    ) -> None:
        if sim.faults.any:
            raise ConfigError("--sim-virtual models no faults: drop the simulator's fault options")
        self.workload, self.engine, self.sim = workload, engine, sim
        self.run_id, self.origin = run_id, origin_ns
        self.offsets = offsets_ns if offsets_ns is not None else np.empty(0, np.int64)
        self.users = concurrency or 0
        self.start_by = None if duration_ns is None else origin_ns + duration_ns  # no session starts later
        self.cut = None if cut_ns is None else origin_ns + cut_ns  # nothing runs past it
        self.max_sessions, self.ignore_eos = max_sessions, ignore_eos
        self._prompt_ids = workload.prompt_ids if isinstance(workload, PromptIds) else None
        self._turn_shape: Callable[[int], Turn] | None = None
        self._prompt_view: Callable[[int], Sequence[int]] | None = None
        if isinstance(workload, SingleTurns):
            self._turn_shape, self._prompt_view = workload.turn_shape, workload.prompt_view
        self.room = min(sim.max_model_len, engine.max_model_len)
        self.ended: list[VirtualRequest] = []
        self.tokens = TokenLog()  # every token's instant, as spans
        self.done: list[VirtualRequest] = []  # every request sent, in the order it ended
        self.inflight: dict[VirtualRequest, None] = {}  # submitted, not ended (in order)
        self.unsent: list[Unsent] = []
        self.waiting: dict[SessionRun, None] = {}  # sessions whose next turn waits on its subagents
        # Sessions whose next turn is due, in the order (due, pushed): a heap of ints ``due << 32 | pushed``
        # (a tuple's comparisons made a push and a pop cost 3x; fewer than 2**32 pushes in a run), and
        # the session of each.
        self._heap: list[int] = []
        self._due: dict[int, SessionRun] = {}
        self._order = self._seq = self._sessions = self._next_offset = 0
        self.end_ns = origin_ns
        # steady decodes as counts (the scheduler's bulk decode), on every engine of the unit
        for e in getattr(engine, "engines", None) or [engine]:
            e.bulk_decode(self._tokens_out)

    # ---- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        eng, origin = self.engine, self.origin
        for user in range(self.users):
            self._start_session(origin, user)
        while True:
            start = eng._next_start()
            horizon = start if start is not None else self._next_due()
            if horizon is None or (self.cut is not None and horizon >= self.cut):
                break
            self._send_due(horizon)
            start = eng._next_start()
            if start is None:
                continue  # every request due was refused: nothing to run yet
            due = self._next_due()
            bound = _NEVER if due is None else due
            if self.cut is not None and self.cut < bound:
                bound = self.cut
            end = eng.quiet_steps(start, bound)
            if end != start:  # steps in which only counts changed, until the next has more to do
                self.end_ns = end
                continue
            step = eng.step_at(start)
            if step is None:
                raise RuntimeError("the virtual engine holds requests but can schedule none")
            plan, end = step
            eng.finish_at(plan, end)
            self.end_ns = end
            if self.ended:  # the same list object: every request in flight appends to it when it ends
                ended = self.ended[:]
                self.ended.clear()
                for r in ended:
                    self._answered(r, end)
        self._cut_off()

    def _next_due(self) -> int | None:
        """The earliest instant a turn or an open-loop session is due, if any."""
        t = self._heap[0] >> _PUSHED_BITS if self._heap else None
        if self._next_offset < len(self.offsets) and self._may_start():
            o = self.origin + int(self.offsets[self._next_offset])
            if self.start_by is None or o < self.start_by:
                t = o if t is None else min(t, o)
        return t

    def _may_start(self) -> bool:
        return self.max_sessions is None or self._sessions < self.max_sessions

    def _send_due(self, horizon: int) -> None:
        """Send every turn due by ``horizon``, and start every open-loop session due by then."""
        offs, heap = self.offsets, self._heap
        while self._next_offset < len(offs) and self._may_start():
            t = self.origin + int(offs[self._next_offset])
            if t > horizon or (self.start_by is not None and t >= self.start_by):
                break
            self._next_offset += 1
            self._start_session(t, -1)
        below, due = (horizon + 1) << _PUSHED_BITS, self._due
        while heap and heap[0] < below:
            key = heapq.heappop(heap)
            self._send(due.pop(key), key >> _PUSHED_BITS)

    @staticmethod
    def _tokens_out(r: SimRequest, ends: list[int], g0: int, g1: int) -> None:
        """A steady decode's tokens, one at each of the step ends ``ends[g0:g1]``, recorded when it
        leaves the scheduler's steady set (``BatchScheduler.bulk_decode``): what
        ``VirtualRequest.emit`` does per step."""
        v = cast(VirtualRequest, r)
        v.log.span(v.seq, ends, g0, g1)
        v.emitted += g1 - g0
        if v.emitted >= v.max_tokens and not v.finished:
            v.finished = True
            v.ended.append(v)

    # ---- sessions ---------------------------------------------------------------------
    def _start_session(self, t: int, user: int) -> None:
        if not self._may_start() or (self.start_by is not None and t >= self.start_by):
            return
        i = self._sessions
        shape = self._turn_shape
        if shape is not None:
            run = SessionRun(i, (shape(i),), NO_EXTRA, None, None, user, i)
        else:
            run = SessionRun.of(self.workload.session(i), None, user, i)
        self._sessions += 1
        run.due = t
        self._turn_due(run, t)

    def _turn_due(self, run: SessionRun, now: int) -> None:
        """Turn ``run.k`` is next: its subagents start ``now``; it is due at ``run.due`` (after them)."""
        turn = run.turns[run.k]
        if turn.children and not run.kids:
            run.kids = len(turn.children)
            self.waiting[run] = None
            for child in turn.children:
                kid = SessionRun.of(child, run, -1)
                kid.due = now
                self._turn_due(kid, now)
            return
        self._push(run)

    def _send(self, run: SessionRun, t: int) -> None:
        """Turn ``run.k`` goes to the server at ``t`` (a perfect client sends on time)."""
        turn = run.turns[run.k]
        api = turn.api or "chat"
        if api in _POOLED:
            raise ConfigError(f"--sim-virtual: {api} stages are not modelled in virtual time; run it in real time")
        given, ctx = self._prompt_ids, run.ctx
        ids: Sequence[int]
        if ctx is None:  # one turn given as its ids (SingleTurns)
            assert self._prompt_view is not None
            ids = self._prompt_view(run.index)
        elif given is not None and run.k == 0 and run.index >= 0 and ctx.empty:
            ids = ctx.add_turn(turn, given(run.index))
        else:
            ids = ctx.add_turn(turn)
        self._seq += 1
        r = VirtualRequest(f"{self.run_id}-{self._seq}", ids, t, run, turn, self._seq, self.ended, self.tokens)
        room = self.room - r.prompt_len
        limit = turn.max_tokens
        if room <= 0 or limit > room:
            r.error_status = 400
            r.error = f"HTTP 400: prompt ({len(ids)}) + max_tokens ({limit}) exceeds the context ({self.room})"
            self.done.append(r)
            self._session_failed(run, t)
            return
        n_out = limit if self.ignore_eos else min(limit, natural_length(ids, self.sim.natural_mean_tokens))
        r.max_tokens, r.finish = n_out, "length" if n_out >= limit else "stop"
        if self.sim.tool_calls > 0 and api == "chat":
            call = tool_call_for(run.extra, ids, self._seq, r.rid, self.sim.tool_calls, self.sim.tool_call_shape)
            r.tool_call = call is not None
        self.engine.submit(r)
        self.inflight[r] = None

    def _answered(self, r: VirtualRequest, end: int) -> None:
        """``r``'s last token went out at ``end``: its session goes on (or ends)."""
        self.done.append(r)
        del self.inflight[r]
        run = r.run
        run.k += 1
        turns = run.turns
        if run.ctx is not None and run.k < len(turns):  # (a last answer is never part of a prompt)
            run.ctx.add_answer(len(r.prompt_ids), r.emitted, r.tool_call)
        if run.k < len(turns):
            run.due = end + turns[run.k].think_ns
            self._turn_due(run, end)
        else:
            self._session_ended(run, end)

    def _push(self, run: SessionRun) -> None:
        """``run``'s next turn is due at ``run.due`` (after every one pushed before at that instant)."""
        self._order += 1
        key = run.due << _PUSHED_BITS | self._order
        heapq.heappush(self._heap, key)
        self._due[key] = run

    def _session_failed(self, run: SessionRun, t: int) -> None:
        """A turn was refused: the session's later turns are not sent."""
        why = f"not sent: turn {run.k} of its session ended http_error"
        self.unsent.extend(Unsent(run, k, t, why) for k in range(run.k + 1, len(run.turns)))
        self._session_ended(run, t)

    def _session_ended(self, run: SessionRun, end: int) -> None:
        parent = run.parent
        if parent is not None:
            parent.kids -= 1
            if not parent.kids:  # the last subagent ended: the parent's turn is due
                del self.waiting[parent]
                parent.due = max(parent.due, end)
                self._push(parent)
        elif run.user >= 0:
            self._start_session(end, run.user)

    def _cut_off(self) -> None:
        """The run's end: requests still in the engine are cancelled, turns still due are not sent,
        nor those of sessions still waiting on their subagents: every turn of every session started
        ends as exactly one record."""
        why = "not sent: the drain ended first"
        for req in self.inflight:
            self.engine.cancel(req)
            self.done.append(req)
            run = req.run
            self.unsent.extend(Unsent(run, k, req.t_sched, why) for k in range(run.k + 1, len(run.turns)))
        self.inflight.clear()
        for key in self._heap:
            run, t = self._due[key], key >> _PUSHED_BITS
            self.unsent.extend(Unsent(run, k, t, why) for k in range(run.k, len(run.turns)))
        self._heap.clear()
        self._due.clear()
        # a turn waiting on subagents still running would have been due after them: not before the cut
        cut = self.end_ns if self.cut is None else self.cut
        for run in self.waiting:
            t = max(run.due, cut)
            self.unsent.extend(Unsent(run, k, t, why) for k in range(run.k, len(run.turns)))
        self.waiting.clear()
