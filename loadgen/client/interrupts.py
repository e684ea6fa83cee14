"""How a run is stopped: SIGINT or SIGTERM to the parent, a parent's order to a worker, a second interrupt.

One ``Stopper`` per process takes every stop order, from wherever it comes (a signal
handler, a lifeline's watchdog thread, a test), and applies it to what is sending now:
the engine of this process (in its event loop's thread), or the worker processes, over
their lifelines. A first order stops sending and starts the drain (``engine.stop``);
a ``cut`` order, the second interrupt, ends the drain at once (``engine.stop`` a second
time: what is in flight is recorded as cancelled). An order that arrives before there is
an engine is kept and applied when one is attached, so a run stopped early sends nothing.

``catching_signals`` routes SIGINT and SIGTERM of the whole command (target start-up,
every point of a sweep, the drain, the writing) to the stopper: the first is a stop,
the second a cut, and a third gives up (SIGINT raises KeyboardInterrupt again). A run
stopped this way exits ``128 + signal`` (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

from loadgen.lifeline import CUT, STOP, Lifelines

if TYPE_CHECKING:
    from loadgen.client.engine import Engine

__all__ = ["Stopper", "catching_signals", "exit_code", "CUT_NOTE"]

CUT_NOTE = "drain cut short"


def exit_code(signal_name: str | None) -> int | None:
    """The exit status of a command stopped by ``signal_name`` (128 + its number), if any."""
    if not signal_name:
        return None
    try:
        return 128 + int(signal.Signals[signal_name])
    except KeyError:
        return None


class Stopper:
    """Stop orders for one process, applied to its engine or forwarded to its workers."""

    def __init__(self) -> None:
        self.reason: str | None = None  # the first order's reason ("SIGINT", "SIGTERM", ...)
        self.cut_reason: str | None = None  # the cut's, e.g. "second SIGINT: drain cut short"
        self.cut_inflight = 0  # requests in flight at the cut (recorded as cancelled)
        self._engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._applied_stop = self._applied_cut = False
        self._lifelines: Lifelines | None = None

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    @property
    def cut(self) -> bool:
        return self.cut_reason is not None

    def order(self, kind: str, reason: str) -> None:
        """Stop (STOP) or cut the drain (CUT); safe from a signal handler or another thread."""
        if self.reason is None:
            self.reason = reason
        if kind == CUT and self.cut_reason is None:
            self.cut_reason = reason
        lifelines, loop = self._lifelines, self._loop
        if lifelines is not None:
            lifelines.send(STOP, self.reason)
            if self.cut_reason is not None:
                lifelines.send(CUT, self.cut_reason)
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._apply)
            except RuntimeError:  # the loop closed meanwhile: the engine is done
                pass

    # -- where orders go --------------------------------------------------------
    def attach(self, engine: Engine) -> None:
        """Apply orders to ``engine`` from now on (call from its running event loop)."""
        self._engine, self._loop = engine, asyncio.get_running_loop()
        self._applied_stop = self._applied_cut = False
        self._apply()

    def detach(self) -> None:
        self._engine = self._loop = None

    def forward(self, lifelines: Lifelines | None) -> None:
        """Send orders to the workers holding ``lifelines`` (None: stop forwarding); earlier ones at once."""
        self._lifelines = lifelines
        if lifelines is not None and self.reason is not None:
            lifelines.send(STOP, self.reason)
            if self.cut_reason is not None:
                lifelines.send(CUT, self.cut_reason)

    def _apply(self) -> None:
        """In the engine's loop: the orders it has not had yet."""
        engine = self._engine
        if engine is None:
            return
        if self.reason is not None and not self._applied_stop:
            self._applied_stop = True
            engine.stop(self.reason)
        if self.cut_reason is not None and not self._applied_cut:
            self._applied_cut = True
            self.cut_inflight += engine.live.inflight
            engine.stop(self.cut_reason)


@contextmanager
def catching_signals(stopper: Stopper) -> Iterator[Stopper]:
    """Route SIGINT and SIGTERM to ``stopper`` while the body runs (main thread only; elsewhere
    signals keep their handlers). The previous handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield stopper
        return
    count = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal count
        count += 1
        name = signal.Signals(signum).name
        if count == 1:
            stopper.order(STOP, name)
        elif count == 2:
            stopper.order(CUT, f"second {name}: {CUT_NOTE}")
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopper
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
