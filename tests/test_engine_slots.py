"""The ``--max-inflight`` slots (client.slots): taken at once while free, else first come first served."""

from __future__ import annotations

import asyncio

from loadgen.client.slots import Slots


def test_a_free_slot_is_taken_at_once_and_a_full_set_makes_requests_wait_in_order() -> None:
    async def go() -> list[str]:
        slots, order = Slots(1), []
        assert slots.take() and not slots.take()

        async def waiter(name: str) -> None:
            await slots.wait()
            order.append(name)

        tasks = [asyncio.ensure_future(waiter(n)) for n in "abc"]
        await asyncio.sleep(0)
        for _ in "abc":
            slots.give()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        slots.give()
        assert slots.free == 1 and slots.take()
        return order

    assert asyncio.run(go()) == ["a", "b", "c"]


def test_a_waiter_cancelled_takes_no_slot_even_when_one_was_handed_to_it_just_then() -> None:
    async def go() -> None:
        slots = Slots(1)
        assert slots.take()
        first = asyncio.ensure_future(slots.wait())
        second = asyncio.ensure_future(slots.wait())
        await asyncio.sleep(0)
        slots.give()  # handed to the first...
        first.cancel()  # ...which is cancelled before it runs: the slot goes on to the second
        await asyncio.sleep(0)
        await second
        assert first.cancelled() and slots.free == 0
        gone = asyncio.ensure_future(slots.wait())
        await asyncio.sleep(0)
        gone.cancel()  # cancelled while waiting: it leaves the queue
        await asyncio.sleep(0)
        slots.give()
        assert slots.free == 1

    asyncio.run(go())
