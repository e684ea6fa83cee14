"""Sessions as wholes: per-session figures of a multi-turn run, and what a session's load is called.

A session (a conversation, an agent's task with its subagents) is every record that
carries its ``session`` id within its load point. Its figures (``per_session``):

- turns scheduled (its records), turns completed ``ok``, turns ``not_sent``;
- **duration**: from its first turn's ``t_sched`` to its last turn's ``t_done``, exact when
  every turn ended ``ok`` (the session completed). A session that did not complete is a
  **right-censored** sample (docs/metrics.md, "Censoring"): it took at least as long as it
  was observed, i.e. to the latest end of its turns, each turn's end taken as for E2E (its
  ``t_done``, or, for a turn that never ended, the end of the records' observation). The
  ``not_sent`` turns after a turn that did not end ok were never due and add nothing;
- turn latency: E2E per turn, censored exactly as the request E2E (``columns.Latencies``).

A session counts in a window when its first turn's ``t_sched`` is in it, as a request
does. ``session_summary`` folds the window's sessions: started and completed counts,
duration percentiles (a lower bound, ``>= x``, where one reaches a censored session),
turns per session, the sessions/s offered (their starts over the span of their starts)
and the req/s they produced (turns sent per second of the window). ``load_unit``
says whether a workload's load is sessions/s (its sessions have more than one turn) or
req/s, from its ``describe()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loadgen.analysis.columns import Cols, Floats, Ints, Mask, int_column, ms
from loadgen.analysis.latencies import Latencies
from loadgen.analysis.stats import Dist, describe
from loadgen.analysis.window import Window

__all__ = ["SESSION_PERCENTILES", "SessionTable", "SessionSummary", "per_session", "session_summary", "load_unit"]

SESSION_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class SessionTable:
    """One entry per session (sorted by point, then session id); durations in ms."""

    point: Ints
    session: Ints
    turns: Ints  # records (turns scheduled), subagents' included
    turns_ok: Ints
    turns_not_sent: Ints
    turns_sent: Ints
    start_ns: Ints  # first turn's t_sched
    complete: Mask  # every turn ended ok
    duration_ms: Floats  # exact where complete, else the censored value (at least this long)

    @property
    def n(self) -> int:
        return int(self.session.size)

    def rows(self) -> list[dict[str, Any]]:
        """The table as JSON-ready rows (for a per-session listing or a CSV)."""
        return [
            {
                "point": int(self.point[i]),
                "session": int(self.session[i]),
                "turns": int(self.turns[i]),
                "turns_ok": int(self.turns_ok[i]),
                "turns_not_sent": int(self.turns_not_sent[i]),
                "complete": bool(self.complete[i]),
                "duration_ms": _finite(self.duration_ms[i]),
                "duration_censored": not bool(self.complete[i]),
            }
            for i in range(self.n)
        ]


def per_session(table: pa.Table, c: Cols | None = None, lat: Latencies | None = None) -> tuple[SessionTable, Ints]:
    """Every session of ``table`` (records.SCHEMA: one run or one load point), and for each
    record the index of its session in the returned table."""
    c = c if c is not None else Cols.of(table)
    lat = lat if lat is not None else Latencies.of(c)
    if c.n == 0:
        e = np.zeros(0, dtype=np.int64)
        return SessionTable(e, e, e, e, e, e, e, np.zeros(0, dtype=bool), np.zeros(0)), e
    point = int_column(table, "point")[0] if "point" in table.column_names else np.zeros(c.n, dtype=np.int64)
    session = c.ints["session"][0]
    keys, of = _pairs(point, session)
    n = len(keys)

    def count(mask: Mask) -> Ints:
        out: Ints = np.bincount(of[mask], minlength=n).astype(np.int64)
        return out

    start = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(start, of, c.t_sched)
    done, has_done = c.t["t_done"]
    ok_rows = c.ok & has_done
    end = start.copy()  # (read only where every turn ended ok, so each has its t_done)
    np.maximum.at(end, of[ok_rows], done[ok_rows])
    turns, turns_ok = count(np.ones(c.n, dtype=bool)), count(c.ok)
    complete = turns_ok == turns
    exact = np.where(complete, ms(end, start), np.nan)
    # a turn's end after the session's start: t_sched offset + its E2E (exact or censored), in ms
    row_end = ms(c.t_sched, start[of]) + np.where(np.isnan(lat.e2e), lat.e2e_c, lat.e2e)
    seen = np.full(n, -np.inf)
    good = ~np.isnan(row_end)
    np.maximum.at(seen, of[good], row_end[good])
    censored = np.maximum(seen, 0.0)
    table_ = SessionTable(
        point=keys[:, 0].astype(np.int64),
        session=keys[:, 1].astype(np.int64),
        turns=turns,
        turns_ok=turns_ok,
        turns_not_sent=count(c.status == "not_sent"),
        turns_sent=count(c.t["t_sent"][1]),
        start_ns=start,
        complete=complete,
        duration_ms=np.where(complete, exact, censored),
    )
    return table_, of


def _pairs(point: Ints, session: Ints) -> tuple[NDArray[np.int64], Ints]:
    """The distinct (point, session) pairs sorted (as rows of a (k, 2) array) and each row's
    index among them: one 1-d ``np.unique`` of a combined key where the ids allow it."""
    lo, hi = (int(session.min()), int(session.max())) if session.size else (0, 0)
    p_lo, p_hi = (int(point.min()), int(point.max())) if point.size else (0, 0)
    width = hi - lo + 1
    if width * (p_hi - p_lo + 1) < 2**62:
        uniq, of = np.unique((point - p_lo) * width + (session - lo), return_inverse=True)
        p, s = np.divmod(uniq, width)
        return np.stack([p + p_lo, s + lo], axis=1), of.reshape(-1)
    keys, of = np.unique(np.stack([point, session], axis=1), axis=0, return_inverse=True)
    return keys, of.reshape(-1)


@dataclass(frozen=True)
class SessionSummary:
    """The sessions that started in a window (their first turn scheduled in it), as wholes."""

    window_s: float
    sessions: int  # scheduled in the window
    started: int  # with at least one turn sent
    completed: int  # every turn ended ok
    multi_turn: bool  # some session of the run has more than one turn: its load is sessions/s
    turns: int  # scheduled, of those sessions (subagents' turns included)
    turns_ok: int
    turns_not_sent: int
    duration: Dist  # ms; censored for a session that did not complete
    turns_per_session: Dist
    turn_e2e: Dist  # ms, every turn of those sessions, censored as the request E2E
    offered_sessions_per_s: float  # their starts per second, over the span of their starts
    produced_requests_per_s: float  # turns (any session's) sent in the window / its length

    @property
    def unit(self) -> str:
        return "sessions/s" if self.multi_turn else "req/s"

    def lines(self) -> list[str]:
        """The summary in words, one line each (the terminal prints them, the report shows them);
        a percentile that reaches a session that did not complete is shown ``>= x``."""
        if not self.sessions:
            return ["sessions: none started in the window"]
        rate = f"{_num(self.offered_sessions_per_s, 2)} sessions/s offered, producing "
        rate += f"{_num(self.produced_requests_per_s, 2)} req/s"
        cens = self.duration.censored
        return [
            f"sessions: {self.sessions:,} in the window ({rate}); {self.completed:,} completed, "
            f"{self.sessions - self.completed:,} not completed",
            f"session duration: {_pcts(self.duration, 1e-3, ' s')}"
            + (f" ({cens:,} not completed: at least this long)" if cens else ""),
            f"turns per session: {_pcts(self.turns_per_session, 1.0, '')}; {self.turns:,} scheduled, "
            f"{self.turns_ok:,} ok, {self.turns_not_sent:,} not sent; turn E2E {_pcts(self.turn_e2e, 1.0, ' ms')}",
        ]

    def to_json(self) -> dict[str, Any]:
        """Strict JSON: units in the key names, null (never "inf") where no figure exists."""
        return {
            "sessions": self.sessions,
            "sessions_started": self.started,
            "sessions_completed": self.completed,
            "sessions_not_completed": self.sessions - self.completed,
            "multi_turn": self.multi_turn,
            "load_unit": self.unit,
            "turns": self.turns,
            "turns_ok": self.turns_ok,
            "turns_not_sent": self.turns_not_sent,
            "session_duration_ms": self.duration.to_json(),
            "turns_per_session": self.turns_per_session.to_json(),
            "turn_e2e_ms": self.turn_e2e.to_json(),
            "offered_sessions_per_s": _finite(self.offered_sessions_per_s),
            "produced_requests_per_s": _finite(self.produced_requests_per_s),
            "window_s": _finite(self.window_s),
        }


def session_summary(table: pa.Table, window: Window) -> SessionSummary:
    """Fold the sessions whose first turn was scheduled in ``window`` (see the module's docstring);
    once per table and window."""
    c = Cols.of(table)
    return c.once(("session_summary", window), lambda: _session_summary(table, c, window))


def _session_summary(table: pa.Table, c: Cols, window: Window) -> SessionSummary:
    lat = Latencies.of(c)
    s, of = per_session(table, c, lat)
    inwin = window.contains(s.start_ns)
    rows = inwin[of] if c.n else np.zeros(0, dtype=bool)
    sent, has_sent = c.t["t_sent"]
    length = window.length_s
    dur = s.duration_ms[inwin]
    done = s.complete[inwin]
    return SessionSummary(
        window_s=length,
        sessions=int(inwin.sum()),
        started=int((s.turns_sent[inwin] > 0).sum()),
        completed=int(done.sum()),
        multi_turn=bool((s.turns > 1).any()),
        turns=int(s.turns[inwin].sum()),
        turns_ok=int(s.turns_ok[inwin].sum()),
        turns_not_sent=int(s.turns_not_sent[inwin].sum()),
        duration=describe(dur[done], percentiles=SESSION_PERCENTILES, censored=dur[~done]),
        turns_per_session=describe(s.turns[inwin].astype(np.float64), percentiles=SESSION_PERCENTILES),
        turn_e2e=describe(lat.e2e[rows], percentiles=SESSION_PERCENTILES, censored=lat.e2e_c[rows]),
        offered_sessions_per_s=_start_rate(s.start_ns[inwin]),
        produced_requests_per_s=_rate(int((has_sent & window.contains(sent)).sum()), length),
    )


def load_unit(workload_describe: dict[str, Any]) -> str:
    """``"sessions/s"`` when the described workload's sessions can have more than one turn
    (multi-turn chat, agentic, ShareGPT conversations, agentic traces), else ``"req/s"``."""
    d = workload_describe
    if "mean_turns" in d:  # ShareGPT conversations
        return "sessions/s" if float(d["mean_turns"] or 0) > 1 else "req/s"
    if "sessions" in d and "requests" in d:  # agentic traces: requests over sessions (subagents too)
        return "sessions/s" if int(d["requests"] or 0) > int(d["sessions"] or 0) else "req/s"
    turns = d.get("turns")
    if turns is None and isinstance(d.get("agent"), dict):
        turns = d["agent"].get("turns")
    if isinstance(turns, dict):
        return "sessions/s" if _more_than_one(turns) else "req/s"
    return "sessions/s" if d.get("kind") == "agentic" else "req/s"


def _more_than_one(dist: dict[str, Any]) -> bool:
    """Whether a described distribution of turn counts can draw more than 1."""
    for key in ("max", "value", "high"):
        v = dist.get(key)
        if isinstance(v, (int, float)):
            return bool(v > 1)
    mean = dist.get("mean")
    return not isinstance(mean, (int, float)) or mean > 1


def _pcts(d: Dist, scale: float, unit: str) -> str:
    """``p50 12.3 s, p90 >= 40.1 s, p99 >= 55.0 s`` (``-`` without samples)."""
    if not d.n:
        return "-"
    out = []
    for p in SESSION_PERCENTILES:
        v = d.pct(p)[0] * scale
        out.append(f"p{p:g} {'>= ' if d.lower_bound(p) else ''}{_num(v, 1)}{unit}")
    return ", ".join(out)


def _num(v: float, digits: int) -> str:
    if not np.isfinite(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}f}"


def _start_rate(starts: Ints) -> float:
    """Sessions per second from their first turns' instants: n over their span plus one mean
    gap (as ``choose_window`` spans requests: a constant rate r gives exactly r); NaN below 2."""
    n = int(starts.size)
    if n < 2:
        return float("nan")
    span_s = float(starts.max() - starts.min()) / 1e9 * n / (n - 1)
    return n / span_s if span_s > 0 else float("nan")


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("nan")


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None
