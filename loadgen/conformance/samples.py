"""A run folder as the gate sees it: load points whose samples a criterion is judged on.

``load_points`` splits a run (one point) or a sweep (several) into ``Point``s,
each with its window and a per-metric sample cache; every sample follows the
definitions of ``metrics.summarize`` (through ``columns``), so the gate judges
the same numbers the reports show. ``select`` picks the points a criterion's
``at`` names. Kept apart from the statistics (``bounds``) and the verdicts
(``gate``) because this is the only part that reads records.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.analysis.chunk_walk import itl_icl
from loadgen.analysis.columns import Cols, Floats, Ints, Mask, int_column
from loadgen.analysis.latencies import Latencies
from loadgen.analysis.metrics import SLO, Summary, summarize
from loadgen.analysis.pipeline import pipeline_view
from loadgen.analysis.points import point_window
from loadgen.analysis.window import Window
from loadgen.errors import ConfigError
from loadgen.records import read_records
from loadgen.run_folder import read_run_meta

if TYPE_CHECKING:
    from loadgen.conformance.slo import Criterion

__all__ = ["Point", "load_points", "select"]


@dataclass(frozen=True)
class _Base:
    """Per row of a point's records: what every sample is derived from (ms where a latency)."""

    c: Cols
    lat: Latencies  # exact and censored latencies, as ``metrics.summarize`` folds them
    inwin: Mask
    done: Ints
    has_done: Mask

    @classmethod
    def of(cls, table: pa.Table, window: Window) -> _Base:
        c = Cols.of(table)
        done, has_done = c.t["t_done"]
        return cls(c, Latencies.of(c), window.contains(c.t_sched), done, has_done)


_CENSORED = ("ttft", "ttft_sent", "e2e", "schedule_lag")  # the metrics with censored samples


def _pair(lat: Latencies, metric: str) -> tuple[Floats, Floats]:
    """(exact, censored) per-row arrays of a metric in ``_CENSORED``."""
    pairs = {
        "ttft": (lat.ttft, lat.ttft_c),
        "ttft_sent": (lat.ttft_sent, lat.ttft_sent_c),
        "e2e": (lat.e2e, lat.e2e_c),
        "schedule_lag": (lat.lag, lat.lag_c),
    }
    return pairs[metric]


@dataclass
class Point:
    """One load point of a run folder: its records, window and what was offered."""

    index: int
    label: str
    rate: float | None
    concurrency: int | None
    table: pa.Table
    window: Window
    slo: SLO | None = None
    lag_limit_ms: float = 10.0
    warning: str | None = None  # the configured window could not be used
    _samples: dict[str, Floats] = field(default_factory=dict, repr=False)
    _censored: dict[str, Floats] = field(default_factory=dict, repr=False)
    _summary: Summary | None = field(default=None, repr=False)

    # -- samples, each by the definitions of metrics.summarize ------------------------
    @functools.cached_property
    def _base(self) -> _Base:
        return _Base.of(self.table, self.window)

    def samples(self, metric: str) -> Floats:
        """The per-request (per-token, per-session) samples of a "dist" metric, in its unit."""
        if metric not in self._samples:
            self._samples[metric] = self._compute(metric)
        return self._samples[metric]

    def censored(self, metric: str) -> Floats:
        """The right-censored samples of a "dist" metric (each true value is at least the one
        given: a request still waiting, cut or failed before what the metric times); empty for
        metrics that have none."""
        if metric not in self._censored:
            b = self._base
            x = _pair(b.lat, metric)[1][b.inwin] if metric in _CENSORED else np.empty(0)
            self._censored[metric] = x[~np.isnan(x)]
        return self._censored[metric]

    def _compute(self, metric: str) -> Floats:
        b = self._base
        c, inwin = b.c, b.inwin
        if metric in _CENSORED:
            x = _pair(b.lat, metric)[0][inwin]
            return x[~np.isnan(x)]
        if metric in ("tpot", "per_user_tps"):
            x = b.lat.tpot[inwin]
            x = x[~np.isnan(x)]
            return x if metric == "tpot" else 1000.0 / x[x > 0]
        if metric in ("itl", "icl"):
            itl, icl = itl_icl(c, inwin)
            return itl if metric == "itl" else icl
        if metric == "session_duration":
            return self._sessions()
        raise ValueError(f"{metric} has no per-sample values")

    def _sessions(self) -> Floats:
        """Seconds from a session's first intended send to its last turn's end, for
        sessions whose first turn is in the window and whose every turn succeeded."""
        b = self._base
        c = b.c
        if c.n == 0:
            return np.empty(0)
        ids, has_id = int_column(self.table, "session")
        sess = np.where(has_id, ids, -1)
        u, inv = np.unique(sess, return_inverse=True)
        start = np.full(u.size, np.iinfo(np.int64).max)
        np.minimum.at(start, inv, c.t_sched)
        end = np.zeros(u.size, dtype=np.int64)
        np.maximum.at(end, inv, np.where(b.has_done, b.done, 0))
        bad = np.zeros(u.size, dtype=bool)
        np.logical_or.at(bad, inv, ~(c.ok & b.has_done))
        keep = ~bad & self.window.contains(start)
        seconds: Floats = (end[keep] - start[keep]).astype(np.float64) / 1e9
        return seconds

    def clusters(self, metric: str) -> int:
        """Requests that contributed per-token samples (the effective sample size)."""
        b = self._base
        return int((b.inwin & (b.c.c_len >= 2)).sum())

    def proportion(self, metric: str) -> tuple[int, int]:
        """(requests that count as a success, requests in the window: a failed, cancelled or
        not_sent one is a miss)."""
        b = self._base
        good = b.c.ok
        if metric == "attainment":
            good = good & self._met()
        return int((good & b.inwin).sum()), int(b.inwin.sum())

    def _met(self) -> Mask:
        b = self._base
        if self.slo is None:
            raise ConfigError("this criterion needs the profile's `slo:` bounds")
        met: Mask = b.c.ok & self.slo.met(b.lat.ttft, b.lat.tpot, b.lat.e2e)
        return met

    def events(self, metric: str) -> tuple[Ints, Floats]:
        """(time ns, weight) of what a rate counts: output tokens, completions, good completions."""
        b = self._base
        c = b.c
        if metric == "output_tps":
            return c.c_ns, c.c_tok.astype(np.float64)
        good = c.ok & b.has_done
        if metric == "goodput":
            good = good & self._met()
        return b.done[good], np.ones(int(good.sum()))

    def summary(self) -> Summary:
        if self._summary is None:
            self._summary = summarize(self.table, self.window, self.slo)
        return self._summary


def _point_entries(meta: dict[str, Any]) -> list[dict[str, Any]]:
    pts = meta.get("points")
    if isinstance(pts, list) and pts:
        return [p if isinstance(p, dict) else {} for p in pts]
    settings = meta.get("settings") or {}
    return [{"index": settings.get("point", 0), "settings": settings, "single": True}]


def load_points(run_dir: Path, slo: SLO | None = None) -> tuple[dict[str, Any], list[Point]]:
    """The run's metadata and its load points (one for a run, several for a sweep).

    A sweep's ``run.json`` lists ``points``; each may give its settings (arrival,
    warm-up, cool-down) under ``settings`` or flat, and its index as ``index`` or
    ``point`` (else its position). Records are split by their ``point`` column. A pipeline
    run's requests are its user requests (``analysis.pipeline.pipeline_view``), as the reports
    count them.
    """
    meta = read_run_meta(run_dir)
    table = pipeline_view(read_records(run_dir))  # a missing or corrupt file: a SpecError/ConfigError already
    entries = _point_entries(meta)
    multi = len(entries) > 1
    return meta, [_point(entry, i, table, multi, slo) for i, entry in enumerate(entries)]


def _point(entry: dict[str, Any], i: int, table: pa.Table, multi: bool, slo: SLO | None) -> Point:
    """The ``i``-th point of a run folder from its ``run.json`` entry (its records, when ``multi``, by index)."""
    given = entry.get("settings")
    settings: dict[str, Any] = given if isinstance(given, dict) else entry
    index = int(entry.get("index", entry.get("point", settings.get("point", i))))
    arrival: dict[str, Any] = settings.get("arrival") or {}
    closed = arrival.get("kind") == "closed"
    rate = entry.get("rate", None if closed else arrival.get("rate"))
    conc = entry.get("concurrency", arrival.get("concurrency"))
    part = table.filter(pc.equal(table.column("point"), pa.scalar(index))) if multi else table
    window, warning = point_window(
        part,
        float(settings.get("warmup_s") or 0.0),  # as the reports do
        float(settings.get("cooldown_s") or 0.0),
        verb="judged",
    )
    label = ""
    if multi:
        label = f"rate {rate:g}" if rate is not None else f"concurrency {conc}" if conc else f"point {index}"
    return Point(
        index,
        label,
        None if rate is None else float(rate),
        None if conc is None else int(conc),
        part,
        window,
        slo,
        float(settings.get("lag_limit_ms") or 10.0),
        warning,
    )


def select(points: list[Point], criterion: Criterion, run_dir: Path) -> list[Point]:
    """The points a criterion applies to: the one its ``at`` names, else every point."""
    at = criterion.at
    if at is None:
        return points
    for p in points:
        if at.point is not None and p.index == at.point:
            return [p]
        if at.rate is not None and p.rate is not None and math.isclose(p.rate, at.rate, rel_tol=1e-3):
            return [p]
        if at.concurrency is not None and p.concurrency == at.concurrency:
            return [p]
    have = ", ".join(p.label or _offered(p) for p in points)
    raise ConfigError(f"criterion {criterion.name!r} is for {at}, but {run_dir} has no such load point ({have})")


def _offered(p: Point) -> str:
    if p.rate is not None:
        return f"rate {p.rate:g}"
    if p.concurrency is not None:
        return f"concurrency {p.concurrency}"
    return f"point {p.index}"
