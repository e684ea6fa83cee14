"""The live views while a run or a sweep goes on: counters from the engine, refreshed twice a second.

They only read what the engine counts; every figure they show is provisional and
the records decide the final ones. ``run`` shows a ``LiveView``; ``sweep`` a
``SweepView``, a row per finished point above the counters of the one running.
Imported by the commands when they run, not to build their parsers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from loadgen.client.engine import Engine
    from loadgen.sweep.run import PointResult, SweepSettings


def _p50(values: Any) -> str:
    arr = np.fromiter(values, dtype=float)
    return f"{np.median(arr):.1f}" if arr.size else "-"


def _p99(values: Any) -> str:
    arr = np.fromiter(values, dtype=float)
    return f"{np.percentile(arr, 99):.1f}" if arr.size else "-"


class LiveView:
    def __init__(self, enabled: bool = True, title: str = "loadgen", console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.title = title
        self.engines: list[Engine] = []
        self._live: Live | None = None

    def attach(self, engine: Engine) -> None:
        self.engines = [engine]

    def __rich__(self) -> Table:
        t = Table(title=self.title, show_edge=False)
        for col in ("scheduled", "sent", "in flight", "done", "errors", "TTFT p50 ms", "ITL p50 ms", "lag p99 ms"):
            t.add_column(col, justify="right")
        if self.engines:
            live = self.engines[0].live
            t.add_row(
                str(live.scheduled),
                str(live.sent),
                str(live.inflight),
                str(live.done),
                str(live.errors),
                _p50(list(live.recent_ttft_ms)),
                _p50(list(live.recent_itl_ms)),
                _p99(list(live.recent_lag_ms)),
            )
        return t

    def __enter__(self) -> LiveView:
        if self.enabled:
            self._live = Live(self, console=self.console, refresh_per_second=2, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)


class SweepView:
    """A table that grows a row per finished point, above the live counters of the point running."""

    def __init__(self, settings: SweepSettings, enabled: bool, console: Console | None = None) -> None:
        from loadgen.report.sweep_view import point_columns

        self.console = console or Console(stderr=True)
        self.settings = settings
        self.columns = point_columns(settings.gpus, settings.prices, settings.slo)
        self.rows: list[list[str]] = []
        self.live_view = LiveView(enabled=False, console=self.console, title="current point")
        self.enabled = enabled and self.console.is_terminal
        self.counters = settings.base.workers == 1  # worker processes keep their counters to themselves
        self._live: Live | None = None

    def table(self) -> Table:
        t = Table(title="load points (latencies in ms)", show_edge=False)
        for c in self.columns:
            t.add_column(c, justify="left" if c == "load" else "right")
        for r in self.rows:
            t.add_row(*r)
        return t

    def __rich__(self) -> Group:
        if self.counters and self.live_view.engines:
            return Group(self.table(), self.live_view)
        return Group(self.table())

    def attach(self, engine: Engine) -> None:
        self.live_view.attach(engine)

    def on_point(self, point: PointResult) -> None:
        from loadgen.report.sweep_view import point_cells

        s = self.settings
        a = point.step.arrival
        label = f"{a.rate:g} req/s" if a.rate is not None else f"{a.concurrency} users"
        row = point_cells(point.index, label, point.summary, s.gpus, s.prices, s.slo)
        self.rows.append(row)
        self.live_view.engines = []
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
