"""Validity is data (DESIGN.md): what may have distorted a run or a load point, as codes and words.

Every reason to distrust or qualify a figure is a ``Caveat`` (a code and a readable
message). Some codes make the run or point *suspect*: its figures may be wrong, or too
imprecise for the verdicts asked; a ``Validity`` carries them. The other caveats qualify
figures without making them suspect (some requests failed, outputs ended early, ...).
Two of those say how to read TTFT and ITL at all and come first among the caveats
(``FIRST_CODES``, ``analysis.stream_shape``): ``buffered_stream`` (most ok requests got most
of their tokens in one read after a long silence: TTFT ~ E2E, ITL ~ 0) and ``no_done_marker``
(ok streams that ended with a finish_reason but no ``[DONE]``).

Suspect codes (``SUSPECT_CODES``):
- ``client_lag``: schedule lag p99 above the limit: the client fell behind its schedule;
- ``client_loop_lag``: the client's loop-lag probe (run.json client ``loop_lag_p99_ms``) ran
  later at p99 than the same limit: chunk and first-token stamps may be late by about that much;
- ``client_cpu``: the client used >= 90% of a core over a point long enough to tell;
- ``sim_late``: the built-in simulator fell behind its own model;
- ``few_samples``: fewer samples than a bounded p99 needs (or none);
- ``interrupted``: the run (or point) was stopped before it finished;
- ``writer_degraded``: records were written in a degraded form (some fields lost);
- ``worker_lost``: a distributed run's worker was lost mid-point (it stopped heartbeating, or its
  engine died): its shard's requests with no record home are recorded ``not_sent``;
- ``cache_warm``, ``traffic_differs``: hooks for the prefix-cache and traffic checks
  (their caveats are passed in by the code that detects them).

Verdicts respect validity: compare's winners, the gate's PASS/FAIL, the sweep's
saturation call, capacity and frontier are made only on points that are not suspect.
``few_samples`` is the one code that does not withhold them: each of those verdicts has
its own sample-size rule (confidence bounds, the profile's ``min_samples``, the
saturation call's count guard), which decides whether the samples suffice for *that*
verdict; ``Validity.withholding`` leaves it out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from loadgen.analysis.client_health import client_notes
from loadgen.analysis.metrics import Summary
from loadgen.analysis.prompt_cache import cache_warmth
from loadgen.analysis.stats import min_samples_bounded
from loadgen.analysis.stream_shape import buffered_message, no_done_message
from loadgen.run_folder import point_states, run_state_of

__all__ = [
    "cache_caveats",
    "SUSPECT_CODES",
    "SIZED_CODES",
    "FIRST_CODES",
    "first_codes_first",
    "Caveat",
    "Validity",
    "VALID",
    "ValidityJson",
    "summary_caveats",
    "client_caveats",
    "simulator_caveats",
    "state_caveats",
    "run_state",
    "point_state",
    "interruption",
    "run_caveats",
    "point_caveats",
    "validity_json",
]

SUSPECT_CODES = (
    "client_lag",
    "client_loop_lag",
    "client_cpu",
    "sim_late",
    "few_samples",
    "interrupted",
    "cache_warm",
    "traffic_differs",
    "writer_degraded",
    "worker_lost",
)
SIZED_CODES = ("few_samples",)  # left to each verdict's own sample-size rule
FIRST_CODES = ("buffered_stream", "no_done_marker")  # how to read TTFT and ITL at all: said first


@dataclass(frozen=True)
class Caveat:
    """One reason to distrust or qualify a figure: a stable code and a readable message."""

    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def first_codes_first(caveats: Iterable[Caveat]) -> list[Caveat]:
    """The caveats with those of ``FIRST_CODES`` moved to the front (otherwise in their order)."""
    cs = list(caveats)
    return [c for c in cs if c.code in FIRST_CODES] + [c for c in cs if c.code not in FIRST_CODES]


@dataclass(frozen=True)
class Validity:
    """``valid``, or ``suspect`` with its codes and one message per code."""

    state: str = "valid"
    codes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @classmethod
    def of(cls, caveats: Iterable[Caveat]) -> Validity:
        """The suspect codes among ``caveats`` (the first message of each code)."""
        seen: dict[str, str] = {}
        for c in caveats:
            if c.code in SUSPECT_CODES and c.code not in seen:
                seen[c.code] = c.message
        if not seen:
            return VALID
        return cls("suspect", tuple(seen), tuple(seen.values()))

    @property
    def suspect(self) -> bool:
        return self.state == "suspect"

    @property
    def withholding(self) -> Validity:
        """The codes that withhold a verdict with its own sample-size rule: all but ``few_samples``."""
        return Validity.of(Caveat(c, r) for c, r in zip(self.codes, self.reasons, strict=True) if c not in SIZED_CODES)

    def merged(self, other: Validity) -> Validity:
        """Both sets of codes (a point's own and its run's)."""
        mine = [Caveat(c, r) for c, r in zip(self.codes, self.reasons, strict=True)]
        theirs = [Caveat(c, r) for c, r in zip(other.codes, other.reasons, strict=True)]
        return Validity.of(mine + theirs)

    def why(self) -> str:
        """The reasons in one line ("" when valid)."""
        return "; ".join(self.reasons)

    def __str__(self) -> str:
        return "valid" if not self.suspect else f"suspect ({', '.join(self.codes)}): {self.why()}"


VALID = Validity()


class ValidityJson(TypedDict):
    """summary.json's "validity": the state, the suspect codes, and every caveat as {code, message}."""

    state: str
    codes: list[str]
    warnings: list[dict[str, str]]


def validity_json(caveats: Iterable[Caveat], also: Validity = VALID) -> ValidityJson:
    """summary.json's "validity" for these caveats (``also``: run-level codes to add to a point's)."""
    cs = list(caveats)
    v = Validity.of(cs).merged(also)
    return {"state": v.state, "codes": list(v.codes), "warnings": [c.to_json() for c in cs]}


# --------------------------------------------------------------------------- from the records


def summary_caveats(summary: Summary, *, lag_p99_limit_ms: float = 10.0, min_samples: int = 100) -> list[Caveat]:
    """What the figures of one window say about themselves: lag, sample size, token honesty, failures."""
    s = summary
    if s.requests == 0:
        return [Caveat("few_samples", "no requests in the window")]
    shape = (("buffered_stream", buffered_message(s)), ("no_done_marker", no_done_message(s)))
    out = [Caveat(code, message) for code, message in shape if message]
    lag99 = s.schedule_lag.pct(99)[0] if s.schedule_lag.n else math.nan
    if lag99 > lag_p99_limit_ms:
        out.append(
            Caveat(
                "client_lag",
                f"schedule lag p99 is {lag99:.1f} ms (limit {lag_p99_limit_ms:g} ms): "
                "the client fell behind its schedule; result suspect",
            )
        )
    if s.ok == 0:
        out.append(Caveat("no_success", f"no request succeeded out of {s.requests} in the window"))
    out += _few_samples(s, min_samples)
    if s.token_mismatch:
        out.append(
            Caveat(
                "token_mismatch", f"{s.token_mismatch} requests: reported output tokens differ from the streamed count"
            )
        )
    if s.prompt_compared and abs(s.prompt_gap_pct) > 10:
        out.append(
            Caveat(
                "prompt_gap",
                f"prompt tokens reported differ from requested by {s.prompt_gap_pct:+.1f} % "
                "(tokenizer mismatch? prompts are not the size intended)",
            )
        )
    if s.output_short:
        out.append(
            Caveat(
                "output_short",
                f"{s.output_short} of {s.ok} ok requests ended before max_tokens "
                "(is ignore_eos honoured?); shorter outputs flatter latency",
            )
        )
    if s.single_burst and not any(c.code == "buffered_stream" for c in out):
        out.append(Caveat("single_burst", f"{s.single_burst} responses arrived in one chunk (buffered, not streamed?)"))
    if s.failed:
        detail = ", ".join(f"{k} {v}" for k, v in s.errors_by_status.items() if k != "cancelled")
        out.append(Caveat("failed", f"{s.failed} of {s.requests} requests failed ({detail})"))
    if s.cancelled:
        out.append(Caveat("cancelled", f"{s.cancelled} requests were cancelled (still in flight at stop)"))
    return out


def _few_samples(s: Summary, min_samples: int) -> list[Caveat]:
    """One caveat naming every latency figure with fewer samples than a bounded p99 needs."""
    few, need, conf = [], 0, 0.95
    for name, d in (("TTFT", s.ttft), ("TPOT", s.tpot), ("E2E", s.e2e)):
        n_need = max(min_samples, min_samples_bounded(99, d.confidence))
        if 0 < d.n < n_need:
            few.append(f"{d.n} {name}")
            need, conf = max(need, n_need), d.confidence
    if not few:
        return []
    return [
        Caveat(
            "few_samples",
            f"only {', '.join(few)} samples: a p99 with a bounded {conf:.0%} interval needs at least {need}",
        )
    ]


# --------------------------------------------------------------------------- from run.json


def client_caveats(client: Mapping[str, Any], lag_limit_ms: float = 10.0) -> list[Caveat]:
    """Where loadgen itself may have distorted a point (its run.json "client" block, read by
    ``analysis.client_health``; ``lag_limit_ms``: the run's, which ``client_loop_lag`` uses too)."""
    return [Caveat(code, message) for code, message in client_notes(client, lag_limit_ms)] + _workers_lost(client)


def _workers_lost(client: Mapping[str, Any]) -> list[Caveat]:
    """worker_lost for each worker a distributed point lost (run.json client ``workers_lost``)."""
    return [
        Caveat(
            "worker_lost",
            f"worker {w.get('shard')} ({w.get('host') or 'unknown host'}) was lost mid-point ({w.get('reason')}): "
            f"{w.get('not_sent', 0)} of its shard's requests have no record and are recorded not_sent",
        )
        for w in client.get("workers_lost") or ()
        if isinstance(w, Mapping)
    ]


SIM_LATE_SHARE = 0.05  # of the simulator's steps late: above it, its answers were slower than modelled
SIM_STALL_MS = 20.0  # one step this late stalls every running stream by a whole decode step or more


def simulator_caveats(meta: Mapping[str, Any]) -> list[Caveat]:
    """sim_late when the built-in simulator fell behind its own model (run.json "simulator")."""
    sim = meta.get("simulator") or {}
    late, steps = sim.get("late_steps", 0), sim.get("steps", 0)
    # A few steps some ms late are the host's scheduling noise (a decode step is 10-30 ms; one
    # 9 ms late on 3% of steps moves no percentile a verdict uses); many late steps, or one long
    # stall, make the answers slower than the model: what was measured is not the modelled engine.
    worst = sim.get("max_lateness_ms")  # None: a sweep point's own maximum is not known
    if late and (late > SIM_LATE_SHARE * max(steps, 1) or (worst or 0.0) > SIM_STALL_MS):
        how = (
            f"up to {worst:.1f} ms"
            if worst is not None
            else f"each at most {sim.get('max_lateness_ms_at_most', 0):.1f} ms"
        )
        return [
            Caveat(
                "sim_late",
                f"the simulator fell behind its own model on {late} of {steps} steps ({how} late): "
                "its answers were slower than modelled",
            )
        ]
    return []


# --------------------------------------------------------------------------- run state


def run_state(meta: Mapping[str, Any]) -> tuple[str, str | None]:
    """(state, reason) of a run (or of one sweep point's entry) as ``run_folder.run_state_of`` reads
    it: a ``running`` one whose process is gone is interrupted; one from before states were
    written is complete unless its client says it was stopped."""
    s = run_state_of(meta)
    return s.state, s.reason


def point_state(entry: Mapping[str, Any]) -> tuple[str, str | None]:
    """(state, reason) of one sweep point from its run.json entry."""
    return run_state(entry)


def state_caveats(state: str, reason: str | None, what: str = "run") -> list[Caveat]:
    """``interrupted`` for a run (or point) that was stopped, or is still running (its figures so far)."""
    if state == "running":
        return [Caveat("interrupted", f"the {what} is still running: its figures cover only what was sent so far")]
    if state != "interrupted":
        return []
    return [
        Caveat(
            "interrupted",
            f"the {what} was interrupted ({reason or 'no reason recorded'}): "
            "its figures cover only what was sent before the stop",
        )
    ]


def interruption(meta: Mapping[str, Any]) -> str | None:
    """The first line ``report``, ``gate`` and ``compare`` print for an interrupted run or sweep, else None."""
    state, reason = run_state(meta)
    points = meta.get("points") or []
    cut = [
        f"point {p.get('index', i)}" + (f" ({p['arrival']['label']})" if (p.get("arrival") or {}).get("label") else "")
        for i, (p, ps) in enumerate(zip(points, point_states(meta), strict=True))
        if ps.state == "interrupted"
    ]
    kind = "sweep" if "points" in meta else "run"
    if state == "running":
        return f"RUNNING: this {kind} is still running: its figures cover only what was sent so far"
    if state != "interrupted" and not cut:
        return None
    line = f"INTERRUPTED: this {kind} was interrupted ({reason or 'a point was stopped'})"
    if cut:
        line += f"; {', '.join(cut)} {'was' if len(cut) == 1 else 'were'} cut short (shown, marked suspect)"
    return line + "; its figures cover only what was sent before the stop"


# --------------------------------------------------------------------------- a run, a point


def run_caveats(meta: Mapping[str, Any]) -> list[Caveat]:
    """What may have distorted a whole run: its state, the simulator, prefix caches carried
    between points (a point's own caveats, its client's included, are ``point_caveats``)."""
    state, reason = run_state(meta)
    caveats = state_caveats(state, reason, "sweep" if "points" in meta else "run")
    points = meta.get("points") or []
    if not (points and all("simulator" in p for p in points)):  # else each point judges its own (point_caveats)
        caveats += simulator_caveats(meta)
    sw = meta.get("sweep") or {}
    if sw and not sw.get("point_salt", True):
        caveats.append(
            Caveat(
                "point_salt_off",
                "per-point prompt salt was off (--no-point-salt): prefix-cache state carried "
                "from one load point into the next, which flatters later points",
            )
        )
    return caveats


def cache_caveats(table: Any, part: Mapping[str, Any]) -> list[Caveat]:
    """``cache_warm`` when the records (a run's or a sweep point's) show more prompt caching
    than the workload's own reuse allows (analysis.prompt_cache); ``part``: run.json or its
    point entry (its ``prefix_reuse`` and ``salt``)."""
    w = cache_warmth(table, part.get("prefix_reuse"), salt=part.get("salt"), salt_source=part.get("salt_source"))
    return [Caveat(w.code, w.message)] if w.warm and w.message else []


def point_caveats(
    entry: Mapping[str, Any], summary: Summary, lag_limit_ms: float, *, more: Iterable[Caveat] = ()
) -> list[Caveat]:
    """A point's caveats: its state (a sweep point's own; a single run's is its run's), its
    window's figures, its client (``entry``: its run.json point entry, or a single run's
    ``{"phase": "run", "client": ...}``). ``more``: caveats found elsewhere, e.g. ``cache_warm``."""
    state, reason = point_state(entry) if entry.get("phase") != "run" else ("complete", None)
    return first_codes_first(
        state_caveats(state, reason, "point")
        + summary_caveats(summary, lag_p99_limit_ms=lag_limit_ms)
        + client_caveats(entry.get("client") or {}, lag_limit_ms)
        + (simulator_caveats(entry) if entry.get("phase") != "run" else [])  # a sweep point's own
        + list(more)
    )
