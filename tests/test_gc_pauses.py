"""The run's garbage-collector settings (client.gc_pauses): in force while a run goes on, put back after."""

from __future__ import annotations

import gc

from loadgen.client.gc_pauses import RUN_GC_THRESHOLDS, short_gc_pauses


def test_a_run_collects_the_middle_generation_with_every_other_young_one_and_puts_the_settings_back() -> None:
    before = gc.get_threshold()
    with short_gc_pauses():
        assert gc.get_threshold() == RUN_GC_THRESHOLDS
        assert RUN_GC_THRESHOLDS[1] == 0  # the middle generation never fills: no long pause
        assert gc.get_freeze_count() > 0  # what was alive at the start is out of every collection
        with short_gc_pauses():  # a nested run (a sweep's point, a test)
            assert gc.get_threshold() == RUN_GC_THRESHOLDS
        assert gc.get_threshold() == RUN_GC_THRESHOLDS  # the outer run is still going
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_settings_come_back_when_the_run_raises() -> None:
    before = gc.get_threshold()
    try:
        with short_gc_pauses():
            raise RuntimeError("the run failed")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
