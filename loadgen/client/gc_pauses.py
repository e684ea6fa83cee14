"""Keeping the cyclic garbage collector's pauses short while a run sends.

A collection stops the event loop for as long as it walks its generations, and every read
and send due meanwhile waits: schedule lag the records cannot tell from the endpoint's. What
a collection walks is the young objects (those allocated since the last one: during a ramp,
every request's session, tally, record, task and timer, which all survive) plus, for an older
generation, everything that generation holds. So for the length of a run (``short_gc_pauses``):

- everything alive at the start (imports, the workload, the sessions built so far) is frozen
  out of collection (``gc.freeze``): no collection walks it again;
- the youngest generation is collected every ``_THRESHOLDS[0]`` net allocations, and every
  other of those collections takes the middle generation with it (threshold 0): neither ever
  holds more than about twice that many objects, so no pause is longer than ~1-2 ms, where
  the middle generation's usual threshold (10-20 young collections) let it fill with 20-40
  thousand objects and stall the loop for 23-30 ms (measured at 800 streams x 20 ms on the
  2-core VM, ``benchmarks/client_capacity.py`` part (b), with ``gc.callbacks`` timing each
  collection);
- a full collection (the whole heap: 60-90 ms) waits for 20,000 middle ones, about 40 million
  net allocations: as rare as before. A cycle that outlives two young collections is kept
  until then, or until the run ends (the settings come back, and the next collection takes it).

The settings are put back when the last run in the process ends (runs may nest: a sweep's
points, tests).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["short_gc_pauses", "RUN_GC_THRESHOLDS"]

RUN_GC_THRESHOLDS = (1000, 0, 20_000)
_HOLDERS: list[tuple[int, int, int]] = []  # runs going on in this process; the first one's thresholds


@contextmanager
def short_gc_pauses() -> Iterator[None]:
    """For the length of a run: the live heap frozen, young collections small (module doc)."""
    if not _HOLDERS:
        gc.freeze()
        old = gc.get_threshold()
        gc.set_threshold(*RUN_GC_THRESHOLDS)
    else:
        old = _HOLDERS[0]
    _HOLDERS.append(old)
    try:
        yield
    finally:
        _HOLDERS.pop()
        if not _HOLDERS:
            gc.set_threshold(*old)
            gc.unfreeze()
