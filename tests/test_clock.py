"""Which event loop runs, and the garbage-collector settings around a run."""

from __future__ import annotations

import asyncio
import gc

import pytest

from loadgen import clock


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_is_used_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv(clock.LOOP_ENV, raising=False)
    assert clock.loop_name() == "uvloop"
    assert clock.run(_loop_module()).startswith("uvloop")


def test_the_environment_can_force_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clock.LOOP_ENV, "asyncio")
    assert clock.loop_name() == "asyncio"
    assert clock.run(_loop_module()).startswith("asyncio")


def test_an_unknown_loop_name_is_an_error_that_says_what_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(clock.LOOP_ENV, "trio")
    with pytest.raises(clock.LoopError, match="'uvloop', 'asyncio'"):
        clock.loop_name()


def test_gc_settings_come_back_after_nested_runs() -> None:
    before = gc.get_threshold()
    with clock.quiet_gc():
        assert gc.get_threshold() == clock._RUN_GC_THRESHOLDS
        with clock.quiet_gc():
            assert gc.get_threshold() == clock._RUN_GC_THRESHOLDS
        assert gc.get_threshold() == clock._RUN_GC_THRESHOLDS  # the outer run is still going
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
