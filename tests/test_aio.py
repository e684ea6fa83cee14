"""Which event loop runs, and the garbage-collector settings around a run."""

from __future__ import annotations

import asyncio
import gc

import pytest

from loadgen import aio


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_is_used_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv(aio.LOOP_ENV, raising=False)
    assert aio.loop_name() == "uvloop"
    assert aio.run(_loop_module()).startswith("uvloop")


def test_the_environment_can_force_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(aio.LOOP_ENV, "asyncio")
    assert aio.loop_name() == "asyncio"
    assert aio.run(_loop_module()).startswith("asyncio")


def test_an_unknown_loop_name_is_an_error_that_says_what_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(aio.LOOP_ENV, "trio")
    with pytest.raises(aio.LoopError, match="'uvloop', 'asyncio'"):
        aio.loop_name()


def test_gc_settings_come_back_after_nested_runs() -> None:
    before = gc.get_threshold()
    with aio.quiet_gc():
        assert gc.get_threshold() == aio._RUN_GC_THRESHOLDS
        with aio.quiet_gc():
            assert gc.get_threshold() == aio._RUN_GC_THRESHOLDS
        assert gc.get_threshold() == aio._RUN_GC_THRESHOLDS  # the outer run is still going
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
