"""A run folder as the gate sees it: load points whose samples a criterion is judged on.

``load_points`` splits a run (one point) or a sweep (several) into ``Point``s,
each with its window and a per-metric sample cache; every sample follows the
definitions of ``metrics.summarize`` (through ``columns``), so the gate judges
the same numbers the reports show. ``select`` picks the points a criterion's
``at`` names. Kept apart from the statistics (``gate_bounds``) and the verdicts
(``gate``) because this is the only part that reads records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.analysis.columns import Cols, itl_icl, ms
from loadgen.analysis.metrics import SLO, Summary, summarize
from loadgen.analysis.points import point_window
from loadgen.analysis.window import Window
from loadgen.errors import ConfigError
from loadgen.records import read_records, read_run_meta

if TYPE_CHECKING:
    from loadgen.conformance.slo import Criterion

__all__ = ["Point", "load_points", "select"]


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
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- samples, each by the definitions of metrics.summarize ------------------------
    def _base(self) -> dict[str, Any]:
        if "base" not in self._cache:
            c = Cols.of(self.table)
            w = self.window
            inwin = w.contains(c.t_sched)
            (sent, has_sent), (first, has_first), (last, has_last), (done, has_done) = (
                c.t[k] for k in ("t_sent", "t_first", "t_last", "t_done")
            )
            nan = np.full(c.n, np.nan)
            ttft, tpot, e2e = nan.copy(), nan.copy(), nan.copy()
            a = c.ok & has_first & (c.out >= 1)
            ttft[a] = ms(first[a], c.t_sched[a])
            a = c.ok & has_first & has_last & (c.out >= 2)
            tpot[a] = ms(last[a], first[a]) / (c.out[a] - 1)
            a = c.ok & has_done
            e2e[a] = ms(done[a], c.t_sched[a])
            self._cache["base"] = dict(
                c=c,
                inwin=inwin,
                sent=sent,
                has_sent=has_sent,
                first=first,
                has_first=has_first,
                done=done,
                has_done=has_done,
                ttft=ttft,
                tpot=tpot,
                e2e=e2e,
            )
        return self._cache["base"]

    def samples(self, metric: str) -> np.ndarray:
        """The per-request (per-token, per-session) samples of a "dist" metric, in its unit."""
        key = f"s:{metric}"
        if key not in self._cache:
            self._cache[key] = self._samples(metric)
        return self._cache[key]

    def _samples(self, metric: str) -> np.ndarray:
        b = self._base()
        c, inwin = b["c"], b["inwin"]
        if metric in ("ttft", "tpot", "e2e"):
            x = b[metric][inwin]
            return x[~np.isnan(x)]
        if metric == "ttft_sent":
            m = inwin & ~np.isnan(b["ttft"]) & b["has_sent"]
            return ms(b["first"][m], b["sent"][m])
        if metric == "per_user_tps":
            x = b["tpot"][inwin]
            x = x[~np.isnan(x)]
            return 1000.0 / x[x > 0]
        if metric == "schedule_lag":
            m = inwin & b["has_sent"]
            return ms(b["sent"][m], c.t_sched[m])
        if metric in ("itl", "icl"):
            itl, icl = itl_icl(c, inwin & c.ok)
            return itl if metric == "itl" else icl
        if metric == "session_duration":
            return self._sessions()
        raise ValueError(f"{metric} has no per-sample values")

    def _sessions(self) -> np.ndarray:
        """Seconds from a session's first intended send to its last turn's end, for
        sessions whose first turn is in the window and whose every turn succeeded."""
        b = self._base()
        c = b["c"]
        if c.n == 0:
            return np.empty(0)
        sess = np.asarray(pc.fill_null(self.table.column("session"), -1).to_numpy(), dtype=np.int64)
        u, inv = np.unique(sess, return_inverse=True)
        start = np.full(u.size, np.iinfo(np.int64).max)
        np.minimum.at(start, inv, c.t_sched)
        end = np.zeros(u.size, dtype=np.int64)
        np.maximum.at(end, inv, np.where(b["has_done"], b["done"], 0))
        bad = np.zeros(u.size, dtype=bool)
        np.logical_or.at(bad, inv, ~(c.ok & b["has_done"]))
        keep = ~bad & self.window.contains(start)
        return (end[keep] - start[keep]).astype(np.float64) / 1e9

    def clusters(self, metric: str) -> int:
        """Requests that contributed per-token samples (the effective sample size)."""
        b = self._base()
        c = b["c"]
        return int((b["inwin"] & c.ok & (c.c_len >= 2)).sum())

    def proportion(self, metric: str) -> tuple[int, int]:
        """(requests that count as a success, requests in the window)."""
        b = self._base()
        c, inwin = b["c"], b["inwin"]
        good = c.ok
        if metric == "attainment":
            good = good & self._met()
        return int((good & inwin).sum()), int(inwin.sum())

    def _met(self) -> np.ndarray:
        b = self._base()
        if self.slo is None:
            raise ConfigError("this criterion needs the profile's `slo:` bounds")
        return b["c"].ok & self.slo.met(b["ttft"], b["tpot"], b["e2e"])

    def events(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(time ns, weight) of what a rate counts: output tokens, completions, good completions."""
        b = self._base()
        c = b["c"]
        if metric == "output_tps":
            return c.c_ns, c.c_tok.astype(np.float64)
        good = c.ok & b["has_done"]
        if metric == "goodput":
            good = good & self._met()
        return b["done"][good], np.ones(int(good.sum()))

    def summary(self) -> Summary:
        if "summary" not in self._cache:
            self._cache["summary"] = summarize(self.table, self.window, self.slo)
        return self._cache["summary"]


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
    ``point`` (else its position). Records are split by their ``point`` column.
    """
    meta = read_run_meta(run_dir)
    try:
        table = read_records(run_dir)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    entries = _point_entries(meta)
    multi = len(entries) > 1
    points = []
    for i, entry in enumerate(entries):
        settings = entry.get("settings") if isinstance(entry.get("settings"), dict) else entry
        index = int(entry.get("index", entry.get("point", settings.get("point", i))))
        arrival = settings.get("arrival") or {}
        closed = arrival.get("kind") == "closed"
        rate = entry.get("rate", None if closed else arrival.get("rate"))
        conc = entry.get("concurrency", arrival.get("concurrency"))
        part = table.filter(pc.equal(table.column("point"), index)) if multi else table
        window, warning = point_window(
            part,
            float(settings.get("warmup_s") or 0.0),  # as the reports do
            float(settings.get("cooldown_s") or 0.0),
            verb="judged",
        )
        label = ""
        if multi:
            label = f"rate {rate:g}" if rate is not None else f"concurrency {conc}" if conc else f"point {index}"
        points.append(
            Point(
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
        )
    return meta, points


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
