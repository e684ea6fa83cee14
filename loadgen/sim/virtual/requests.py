"""What a virtual run plays and sends: its sessions (``SessionRun``), its requests
(``VirtualRequest``), the turns it never sent (``Unsent``), and the two shapes of workload it
can read without building a prompt's text (``PromptIds``, ``SingleTurns``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from loadgen.sim.model import SimRequest
from loadgen.sim.virtual.context import Context
from loadgen.sim.virtual.tokens import TokenLog
from loadgen.workload.session import Session, Turn

__all__ = ["VirtualRequest", "SessionRun", "Unsent", "PromptIds", "SingleTurns", "NO_EXTRA"]


class VirtualRequest(SimRequest):
    """A request of a virtual run: the server's ``SimRequest`` plus who sent it and when it was due.

    Built from the turn it sends by its own ``__init__`` (a run builds one per request: the dataclass's
    took every field as an argument). ``SimRequest``'s per-token lists (``emit_ns``, ``model_ns``,
    ``written_ns``, ``chunk_tokens``) are left unset: a virtual request's tokens are the run's
    ``TokenLog``'s spans, and reading one of those lists is a bug (AttributeError)."""

    ended: list[VirtualRequest]  # the loop's list of requests that ended
    log: TokenLog  # the loop's: where its tokens' instants go
    run: SessionRun
    seq: int  # the request's number in the run (the record's ``request``)
    session_id: int  # its session's number (the record's ``session``)
    prompt_len: int  # tokens in its prompt (``len(prompt_ids)``)
    turn: int
    t_sched: int
    prompt_tokens_requested: int
    max_tokens_requested: int
    finish: str
    tools_offered: bool
    error_status: int  # the server refused it (400: context too long): never submitted
    error: str

    def __init__(
        self,
        rid: str,
        prompt_ids: Sequence[int],
        t_sched: int,
        run: SessionRun,
        turn: Turn,
        seq: int,
        ended: list[VirtualRequest],
        log: TokenLog,
    ) -> None:
        """Turn ``run.k`` of ``run`` (``turn``), sent at ``t_sched`` as request ``seq``; no tokens to
        produce yet (``max_tokens`` 0: the caller sets them once the server would accept it)."""
        self.rid, self.prompt_ids, self.max_tokens, self.arrival_ns = rid, prompt_ids, 0, t_sched
        self.emitted, self.tool_call, self.cached_tokens, self.kv_ready, self.preemptions = 0, False, 0, 0, 0
        self.queue_wait_ns = self.prefill_start_ns = self.prefill_end_ns = None
        self.finished = self.cancelled = False
        self.sink = self.prepare = self._waiter = None
        self.ended, self.log, self.run, self.seq = ended, log, run, seq
        self.session_id, self.prompt_len, self.turn, self.t_sched = run.session_id, len(prompt_ids), run.k, t_sched
        self.prompt_tokens_requested, self.max_tokens_requested = turn.prompt_tokens, turn.max_tokens
        self.finish, self.tools_offered, self.error_status, self.error = "length", run.tools, 0, ""

    def __repr__(self) -> str:
        return f"VirtualRequest({self.rid!r}, seq={self.seq}, {self.emitted}/{self.max_tokens} tokens)"

    def emit(self, k: int, now_ns: int, model_ns: int | None = None) -> None:
        """``k`` tokens at ``now_ns`` (a step's end): logged, and the end reported."""
        if k:
            self.log.emit(self.seq, now_ns, k)
        self.emitted += k
        if self.emitted >= self.max_tokens and not self.finished:
            self.finished = True
            self.ended.append(self)


@dataclass(eq=False, slots=True)
class Unsent:
    """A turn that was never sent (its session was cut, or the run ended first)."""

    run: SessionRun
    turn: int
    t_sched: int
    why: str


@runtime_checkable
class PromptIds(Protocol):
    """A workload that gives a session's first prompt as the built-in tokenizer's ids without its
    text being tokenized: ``prompt_ids(i) == BUILTIN.encode(text)`` where ``text`` is the first turn's
    of ``session(i)`` (a session without a system prompt), a fresh list each call. Synthetic prompts
    are built from word ids, so tokenizing their text again is most of what a request costs here."""

    def prompt_ids(self, i: int) -> list[int]: ...


@runtime_checkable
class SingleTurns(PromptIds, Protocol):
    """A ``PromptIds`` workload whose every session is one turn, with no system prompt and no extra
    fields, that gives that turn without its text: ``turn_shape(i)`` is ``session(i).turns[0]`` but
    for its ``text``, which ``prompt_ids(i)`` gives as ids. A virtual run never reads a prompt's
    text, and building it (and decoding the word stream it is cut from) cost it more than the rest
    of the session did; such a session has no context to keep either (nothing follows its turn).
    ``prompt_view(i)`` holds the same ints as ``prompt_ids(i)`` in any sequence whose slices are
    sequences (a memoryview, an array): the run only takes its length and slices (natural_length, the prefix
    cache's block names), and a list of a long prompt's ints cost more than the rest of a request."""

    def turn_shape(self, i: int) -> Turn: ...

    def prompt_view(self, i: int) -> Sequence[int]: ...


NO_EXTRA: dict[str, Any] = {}  # the extra fields of a session given by ``turn_shape``: none (never changed)


class SessionRun:
    """One session being played: its turns, its context, and whom it reports to when it ends.

    ``ctx`` is None for a session given as one turn and its prompt's ids (``SingleTurns``)."""

    __slots__ = ("turns", "session_id", "extra", "index", "k", "ctx", "parent", "kids", "due", "user", "tools")

    def __init__(
        self,
        session_id: int,
        turns: tuple[Turn, ...],
        extra: dict[str, Any],
        ctx: Context | None,
        parent: SessionRun | None,
        user: int,
        index: int = -1,
    ) -> None:
        self.session_id, self.turns, self.extra, self.ctx = session_id, turns, extra, ctx
        self.k, self.parent, self.user = 0, parent, user
        self.index = index  # the workload's index of a session the run started (-1: a subagent's)
        self.kids = 0  # subagent sessions still running
        self.due = 0  # when the next turn is due (think time from the last answer)
        self.tools = bool(extra.get("tools"))

    @classmethod
    def of(cls, session: Session, parent: SessionRun | None, user: int, index: int = -1) -> SessionRun:
        """The run of ``session`` (its context from its system prompt)."""
        return cls(session.session, session.turns, session.extra, Context(session.system), parent, user, index)
