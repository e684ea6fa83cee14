"""Which event loop loadgen runs on: uvloop where it is installed, else asyncio's own.

Why: both the client and the simulator spend most of their time in the loop's
socket handling (one read per streamed chunk; one write per emitted token).
uvloop does that part in C on libuv; on the 2-core development VM a bare
per-read callback costs 14 us under uvloop against 21 us under asyncio's
selector loop (benchmarks/client_capacity.py has the figures in context).

``LOADGEN_LOOP=asyncio`` (or ``uvloop``) forces the choice, for comparing the two
or when a platform's uvloop misbehaves; run.json records which loop a run used.
uvloop's timers have millisecond resolution like asyncio's, so
``timing.sleep_until`` serves both the same way. ``quiet_gc`` keeps the garbage
collector's pauses out of a run.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["LOOP_ENV", "LoopError", "loop_name", "new_loop", "quiet_gc", "run"]

LOOP_ENV = "LOADGEN_LOOP"
T = TypeVar("T")


class LoopError(ValueError):
    """LOADGEN_LOOP names a loop that is unknown or not installed."""


def _uvloop() -> Any | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def loop_name() -> str:
    """'uvloop' or 'asyncio': the loop ``new_loop`` makes, from LOADGEN_LOOP or what is installed."""
    want = os.environ.get(LOOP_ENV, "").strip().lower()
    if want not in ("", "auto", "uvloop", "asyncio"):
        raise LoopError(f"{LOOP_ENV}={want!r}: use 'uvloop', 'asyncio' or leave it unset")
    if want == "asyncio":
        return "asyncio"
    if _uvloop() is not None:
        return "uvloop"
    if want == "uvloop":
        raise LoopError(f"{LOOP_ENV}=uvloop but uvloop is not installed (pip install uvloop)")
    return "asyncio"


def new_loop() -> asyncio.AbstractEventLoop:
    if loop_name() == "uvloop":
        return _uvloop().new_event_loop()  # type: ignore[union-attr]
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=new_loop) as runner:
            return runner.run(coro)
    loop = new_loop()  # pragma: no cover - Python 3.10
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


# Measured on the 2-core VM at 300 streams: the default (700, 10, 10) ran a full collection
# (66-70 ms, the whole heap) mid-run; (20000, 10, 10) gave 15-38 ms young collections;
# these give pauses under 5 ms and no full collection for ~40M allocations.
_RUN_GC_THRESHOLDS = (2000, 20, 1000)
_GC_HOLDERS: list[tuple[int, int, int]] = []  # runs going on in this process; the first one's thresholds


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep the cyclic garbage collector from pausing the loop mid-run.

    Everything alive at the start (imports, the workload, sessions built so far) is
    frozen out of collection, and the older generations are collected far less often:
    a full collection walks every live object (records and streams in flight
    included) and stalled the loop for tens of milliseconds, which shows up as
    schedule lag. Young cycles are still collected every 2,000 allocations; the
    settings are put back when the last run in the process ends.
    """
    if not _GC_HOLDERS:
        gc.freeze()
        old = gc.get_threshold()
        gc.set_threshold(*_RUN_GC_THRESHOLDS)
    else:
        old = _GC_HOLDERS[0]
    _GC_HOLDERS.append(old)
    try:
        yield
    finally:
        _GC_HOLDERS.pop()
        if not _GC_HOLDERS:
            gc.set_threshold(*old)
            gc.unfreeze()
