"""Which event loop runs, and the garbage-collector settings around a run."""

from __future__ import annotations

import asyncio

import pytest

from loadgen import clock
from loadgen.clock import VirtualClock, run_virtual, sleep_until
from loadgen.errors import LoadgenError


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
    with pytest.raises(clock.LoopError, match="'uvloop', 'asyncio'") as e:
        clock.loop_name()
    assert isinstance(e.value, LoadgenError)  # so the command line prints it as one line, exit code 2


def test_on_virtual_time_a_sleep_jumps_to_its_timer() -> None:
    clock = VirtualClock(start_ns=5_000, tick_ns=1_000)

    async def go() -> int:
        await asyncio.sleep(1.5)
        return clock()

    woke = run_virtual(go(), clock)
    assert 5_000 + 1_500_000_000 <= woke <= 5_000 + 1_500_000_000 + 3 * 1_000  # a few busy turns of the loop


def test_sleep_until_reaches_its_instant_on_virtual_time_though_it_yields_its_last_stretch() -> None:
    clock = VirtualClock(tick_ns=1_000)
    due = clock() + 3_000_000

    async def go() -> int:
        assert await sleep_until(due, clock)
        return clock()

    assert due <= run_virtual(go(), clock) <= due + 1_000


def test_a_timer_due_while_the_code_is_busy_runs_when_it_yields() -> None:
    clock = VirtualClock()
    t0 = clock()
    fired: list[int] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.010, lambda: fired.append(clock()))
        clock.advance(50_000_000)  # 50 ms of work without yielding
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    run_virtual(go(), clock)
    assert len(fired) == 1 and t0 + 50_000_000 <= fired[0] < t0 + 50_000_000 + 10_000
    with pytest.raises(ValueError, match="back"):
        clock.advance(-1)


def test_a_virtual_loop_left_waiting_on_nothing_raises_instead_of_hanging() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    with pytest.raises(RuntimeError, match="deadlock"):
        run_virtual(forever())
