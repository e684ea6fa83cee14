"""How a run is stopped, without processes: the Stopper's orders, the signals it catches, the exit codes."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field

import pytest

from loadgen.client.interrupts import Stopper, catching_signals, exit_code
from loadgen.lifeline import CUT, STOP, Lifelines


@dataclass
class FakeLive:
    inflight: int = 0


@dataclass
class FakeEngine:
    """What the stopper touches of an engine: ``stop(reason)`` (twice = cut) and ``live.inflight``."""

    live: FakeLive = field(default_factory=FakeLive)
    stops: list[str] = field(default_factory=list)

    def stop(self, reason: str = "interrupted") -> None:
        self.stops.append(reason)


async def attached(stopper: Stopper, engine: FakeEngine) -> None:
    stopper.attach(engine)  # type: ignore[arg-type]  # the fake has what the stopper uses
    await asyncio.sleep(0.01)  # orders given from "another thread" arrive through the loop


def test_an_order_given_before_the_engine_exists_is_applied_when_it_is_attached() -> None:
    stopper, engine = Stopper(), FakeEngine()
    stopper.order(STOP, "SIGTERM")
    asyncio.run(attached(stopper, engine))
    assert engine.stops == ["SIGTERM"] and stopper.stopped and not stopper.cut


def test_a_cut_stops_the_engine_a_second_time_and_counts_what_was_in_flight() -> None:
    stopper, engine = Stopper(), FakeEngine(FakeLive(inflight=7))

    async def main() -> None:
        await attached(stopper, engine)
        stopper.order(STOP, "SIGINT")
        stopper.order(STOP, "SIGINT")  # the same stop again (a worker's own SIGTERM, say) is no cut
        await asyncio.sleep(0.01)
        assert engine.stops == ["SIGINT"]
        stopper.order(CUT, "second SIGINT: drain cut short")
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert engine.stops == ["SIGINT", "second SIGINT: drain cut short"]
    assert stopper.reason == "SIGINT" and stopper.cut_reason == "second SIGINT: drain cut short"
    assert stopper.cut_inflight == 7


def test_a_cut_alone_stops_then_cuts() -> None:
    stopper, engine = Stopper(), FakeEngine()
    stopper.order(CUT, "second SIGTERM: drain cut short")
    asyncio.run(attached(stopper, engine))
    assert engine.stops == ["second SIGTERM: drain cut short"] * 2


def test_orders_are_forwarded_to_workers_earlier_ones_at_once() -> None:
    stopper, lines = Stopper(), Lifelines()
    read = lines.open()
    stopper.order(STOP, "SIGINT")
    stopper.forward(lines)
    stopper.order(CUT, "second SIGINT: drain cut short")
    stopper.forward(None)
    stopper.order(CUT, "after")  # no longer forwarded
    lines.close()
    with os.fdopen(read, "rb") as f:
        got = f.read().decode().splitlines()
    assert got == ["stop SIGINT", "stop SIGINT", "cut second SIGINT: drain cut short"]


def test_signals_of_the_command_go_to_the_stopper_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with catching_signals(Stopper()) as stopper:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stopper.reason == "SIGTERM" and not stopper.cut
        os.kill(os.getpid(), signal.SIGINT)
        assert stopper.cut_reason == "second SIGINT: drain cut short"
        with pytest.raises(KeyboardInterrupt):  # a third Ctrl-C gives up
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("name, code", [("SIGINT", 130), ("SIGTERM", 143), (None, None), ("eof", None)])
def test_a_stopped_command_exits_128_plus_its_signal(name: str | None, code: int | None) -> None:
    assert exit_code(name) == code
