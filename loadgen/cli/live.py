"""The live view while a run goes on: counters from the engine, refreshed twice a second.

It only reads what the engine counts; every figure it shows is provisional and
the records decide the final ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..engine import Engine


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
        for col in ("scheduled", "sent", "in flight", "done", "errors", "TTFT p50 ms", "ITL p50 ms",
                    "lag p99 ms"):
            t.add_column(col, justify="right")
        if self.engines:
            live = self.engines[0].live
            t.add_row(str(live.scheduled), str(live.sent), str(live.inflight), str(live.done),
                      str(live.errors), _p50(list(live.recent_ttft_ms)), _p50(list(live.recent_itl_ms)),
                      _p99(list(live.recent_lag_ms)))
        return t

    def __enter__(self) -> LiveView:
        if self.enabled:
            self._live = Live(self, console=self.console, refresh_per_second=2, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
