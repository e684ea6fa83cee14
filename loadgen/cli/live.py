"""The live views while a run or a sweep goes on: the engines' counters, refreshed twice a second.

They only read what the engines count; every figure they show is provisional and
the records decide the final ones. ``run`` shows a ``LiveView``: elapsed and
remaining time, the requests scheduled, sent, in flight, done, failed and never
sent, output tok/s so far, recent TTFT and ITL (p50 / p99) and the schedule lag
(red above ``--lag-limit-ms``). ``sweep`` shows a ``SweepView``: a row per finished
point, then "point i of n", its load and time left, the sweep's time left, and the
running point's ``LiveView``.

A view reads one engine in this process (``attach``) or, with ``--workers``, the
snapshots each worker process sends its parent (``on_shard``), merged
(``progress.merge_live``). Imported by the commands when they run, not to build
their parsers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from loadgen.cli.progress import (
    Horizon,
    LiveSnapshot,
    Progress,
    duration_text,
    horizon_of,
    merge_live,
    pct,
    pcts,
    progress,
)
from loadgen.cli.sweep_progress import step_label, step_now, sweep_eta

if TYPE_CHECKING:
    from loadgen.client.config import LiveCounters
    from loadgen.client.engine import Engine
    from loadgen.client.settings import RunSettings
    from loadgen.sweep.run import PointResult, SweepSettings
    from loadgen.sweep.search import Step

__all__ = ["LiveView", "SweepView", "phase_text"]


def phase_text(p: Progress, drain_s: float) -> str:
    """ "elapsed 12.3 s, 17.7 s left", or what the point is doing past its sending."""
    left = duration_text(p.left_s)
    if p.phase == "starting":
        return "starting"
    if p.phase == "stopping":
        return f"stopping: sending stopped; answers in flight get at most {left} more (Ctrl-C again ends that now)"
    elapsed = f"elapsed {duration_text(p.elapsed_s)}"
    if p.phase == "draining":
        return f"{elapsed}; all sent, waiting for answers in flight: at most {left} more (--drain {drain_s:g} s)"
    if p.left_s is None:
        return elapsed
    return f"{elapsed}, {'about ' if p.about else ''}{left} left"


class LiveView:
    """The counters of one load point, with where it stands in time."""

    def __init__(
        self,
        enabled: bool = True,
        title: str = "loadgen",
        console: Console | None = None,
        *,
        horizon: Horizon | None = None,
        lag_limit_ms: float | None = None,
        workers: int = 1,
        now_ns: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.title = title
        self.horizon = horizon or Horizon(None, 0.0)
        self.lag_limit_ms = lag_limit_ms
        self.workers = workers
        self.now_ns = now_ns
        self._engine: Engine | None = None
        self._shards: dict[int, LiveCounters] = {}
        self._live: Live | None = None

    @classmethod
    def for_run(
        cls, settings: RunSettings, enabled: bool, console: Console | None = None, title: str | None = None
    ) -> LiveView:
        """The view of ``loadgen run`` with these settings (``title``: the load in its own unit)."""
        return cls(
            enabled,
            title or f"loadgen run: {settings.arrival}",
            console,
            horizon=horizon_of(settings),
            lag_limit_ms=settings.lag_limit_ms,
            workers=settings.workers,
        )

    # -- sources ----------------------------------------------------------------------
    def attach(self, engine: Engine) -> None:
        """Read this engine (the run's, in this process)."""
        self._engine, self._shards = engine, {}

    def on_shard(self, shard: int, counters: LiveCounters) -> None:
        """The latest counters worker ``shard`` sent (``LiveCounters.snapshot``)."""
        self._shards[shard] = counters

    def reset(self) -> None:
        self._engine, self._shards = None, {}

    @property
    def has_source(self) -> bool:
        return self._engine is not None or bool(self._shards)

    def snapshot(self) -> LiveSnapshot | None:
        if self._engine is not None:
            return merge_live([self._engine.live])
        if self._shards:
            return merge_live(list(self._shards.values()))
        return None

    # -- rendering --------------------------------------------------------------------
    def __rich__(self) -> RenderableType:
        snap = self.snapshot()
        if snap is None:
            return Text(f"{self.title}: starting", style="dim")
        p = progress(snap, self.horizon, self.now_ns())
        head = Table.grid(padding=(0, 2))
        cells: list[RenderableType] = [Text(self.title, style="bold"), Text(phase_text(p, self.horizon.drain_s))]
        if p.fraction is not None:
            cells.append(ProgressBar(total=1.0, completed=p.fraction, width=30))
        head.add_row(*cells)
        return Group(head, self.figures(snap, p), *self.notes(snap))

    def figures(self, snap: LiveSnapshot, p: Progress) -> Table:
        """Three labelled lines: requests, output, latency (narrow enough for an 80-column terminal)."""
        t = Table.grid(padding=(0, 2))
        t.add_column(style="dim")
        t.add_column()
        requests = Text.assemble(
            f"scheduled {snap.scheduled if snap.scheduled else '-'} · sent {snap.sent} · "
            f"in flight {snap.inflight} · done {snap.done} · ",
            (f"errors {snap.errors}", "red" if snap.errors else ""),
            " · ",
            (f"not sent {snap.not_sent}", "yellow" if snap.not_sent else ""),
        )
        tps = f"{snap.output_tokens / p.elapsed_s:,.1f}" if p.elapsed_s > 0 else "-"
        latency = Text.assemble(
            f"TTFT p50/p99 {pcts(snap.ttft_ms, 50, 99)} ms · ITL p50/p99 {pcts(snap.itl_ms, 50, 99)} ms · ",
            (f"schedule lag p99 {pcts(snap.lag_ms, 99)} ms", "bold red" if self._lag_over(snap) else ""),
        )
        t.add_row("requests", requests)
        t.add_row("output", f"{tps} tok/s so far ({snap.output_tokens:,} tokens)")
        t.add_row("recent", latency)
        return t

    def _lag_over(self, snap: LiveSnapshot) -> float | None:
        """The recent schedule lag p99 when it is above the limit (the client is late)."""
        if self.lag_limit_ms is None or not snap.lag_ms:
            return None
        worst = pct(snap.lag_ms, 99)
        return worst if worst is not None and worst > self.lag_limit_ms else None

    def notes(self, snap: LiveSnapshot) -> list[Text]:
        out: list[Text] = []
        over = self._lag_over(snap)
        if over is not None:
            out.append(
                Text(
                    f"schedule lag p99 {over:.1f} ms is above --lag-limit-ms {self.lag_limit_ms:g}: the client is "
                    "sending late, so the result will be marked suspect",
                    style="bold red",
                )
            )
        if snap.capped:
            out.append(Text(f"{snap.capped} sends waited for a --max-inflight slot (a distortion)", style="yellow"))
        if snap.troubles:
            out.append(Text(f"{snap.troubles} engine errors; latest: {snap.last_error}", style="red"))
        if self.workers > 1:
            out.append(Text(f"{snap.engines} of {self.workers} worker processes reporting", style="dim"))
        return out

    def __enter__(self) -> LiveView:
        if self.enabled:
            self._live = Live(self, console=self.console, refresh_per_second=2, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)


class SweepView:
    """A table that grows a row per finished point, above where the sweep stands and the live
    counters of the point running."""

    def __init__(
        self,
        settings: SweepSettings,
        enabled: bool,
        console: Console | None = None,
        *,
        now_ns: Callable[[], int] = time.perf_counter_ns,
        unit: str = "req/s",  # the load's (run_settings.load_unit_of): sessions/s for multi-turn sessions
    ) -> None:
        from loadgen.report.sweep_view import point_columns

        self.console = console or Console(stderr=True)
        self.settings = settings
        self.unit = unit
        self.columns = point_columns(settings.gpus, settings.prices, settings.slo)
        self.rows: list[list[str]] = []
        self.points: list[PointResult] = []
        self.walls_s: list[float] = []  # how long each finished point took, drain and summary included
        self.now_ns = now_ns
        base = settings.base
        self.live_view = LiveView(
            enabled=False,
            console=self.console,
            title="this point",
            lag_limit_ms=base.lag_limit_ms,
            workers=base.workers,
            now_ns=now_ns,
        )
        self.enabled = enabled and self.console.is_terminal
        self.step: Step | None = None  # the point running
        self._began_ns = 0
        self._live: Live | None = None

    def table(self) -> Table:
        t = Table(title="load points (latencies in ms)", show_edge=False)
        for c in self.columns:
            t.add_column(c, justify="left" if c == "load" else "right")
        for r in self.rows:
            t.add_row(*r)
        return t

    def __rich__(self) -> Group:
        if self.step is None or not self.live_view.has_source:
            return Group(self.table())
        return Group(self.table(), Text(self.position(), style="bold"), self.live_view)

    # -- where the sweep stands ---------------------------------------------------------
    def position(self) -> str:
        """ "point 3 of 6: 8 req/s; sweep: 1 min 05 s left (at most 1 min 50 s with every drain)"."""
        step = self.step
        if step is None:
            return ""
        plan = self.settings.plan
        history = [(p.step, p.observation) for p in self.points]
        snap = self.live_view.snapshot()
        p = progress(snap, self.live_view.horizon, self.now_ns()) if snap is not None else None
        sending_left = self.live_view.horizon.send_s or 0.0
        drain_left = plan.drain_s
        if p is not None and p.phase == "sending":
            sending_left = p.left_s or 0.0
        elif p is not None and p.phase != "starting":
            sending_left, drain_left = 0.0, p.left_s or 0.0
        eta = sweep_eta(plan, history, step, sending_left, drain_left, self.walls_s)
        k = len(self.points) + 1
        of = f"{k} of {k + eta.more}" if not eta.about else f"{k} (of at most {k + eta.more})"
        of += f" (#{k - 1})"  # the points table's index
        if eta.about:
            whole = f"about {duration_text(eta.left_s)} left, from the {len(self.walls_s)} points so far"
            if not self.walls_s:
                whole = f"about {duration_text(eta.left_s)} left"
        else:
            whole = f"{duration_text(eta.left_s)} left (at most {duration_text(eta.bound_s)} with every drain)"
        return f"point {of}: {step_label(step, self.unit)}; sweep: {whole}"

    def _begin_point(self) -> None:
        """The first counters of a new point: find its step (the search's own choice) and horizon."""
        plan = self.settings.plan
        self.step = step_now(plan, [(p.step, p.observation) for p in self.points])
        self._began_ns = self.now_ns()
        send = plan.warmup_s + self.step.duration_s if self.step is not None else None
        self.live_view.horizon = Horizon(send, plan.drain_s)
        if not self.enabled and self.step is not None:
            self.console.print(self.position(), highlight=False)

    # -- sources (the sweep's callbacks) -----------------------------------------------
    def attach(self, engine: Engine) -> None:
        self.live_view.attach(engine)
        self._begin_point()

    def on_shard(self, shard: int, counters: LiveCounters) -> None:
        first = not self.live_view.has_source
        self.live_view.on_shard(shard, counters)
        if first:
            self._begin_point()

    def on_point(self, point: PointResult) -> None:
        from loadgen.report.sweep_view import point_cells

        s = self.settings
        a = point.step.arrival
        label = f"{a.rate:g} {self.unit}" if a.rate is not None else f"{a.concurrency} users"
        row = point_cells(point.index, label, point.summary, s.gpus, s.prices, s.slo)
        self.rows.append(row)
        self.points.append(point)
        if self._began_ns:
            self.walls_s.append((self.now_ns() - self._began_ns) / 1e9)
        self.live_view.reset()
        self.step, self._began_ns = None, 0
        if not self.enabled:
            self.console.print(
                "point " + "  ".join(f"{c}={v}" for c, v in zip(self.columns, row, strict=True) if c != "#"),
                highlight=False,
            )

    def __enter__(self) -> SweepView:
        if self.enabled:
            self._live = Live(self, console=self.console, refresh_per_second=2)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
