"""A loopback server run from a background thread with its own event loop.

For tests and notebooks that want a loopback endpoint without a subprocess
(starting a Python process costs seconds on a small machine); the server's
event loop never shares a thread with the caller's. ``run_in_thread`` takes any
server with async ``start(host, port)`` and ``stop()`` (the test suite's hostile
endpoint too); ``serve_in_thread`` is the simulator's case, yielding its URL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from loadgen import clock
from loadgen.sim.process import SimStartError
from loadgen.sim.server import SimServer

__all__ = ["Served", "run_in_thread", "serve_in_thread"]


class Served(Protocol):
    async def start(self, host: str, port: int) -> Any: ...

    async def stop(self) -> None: ...


@contextmanager
def run_in_thread(
    server: Served, host: str = "127.0.0.1", timeout_s: float = 10.0, name: str = "server"
) -> Iterator[None]:
    """Start ``server`` on ``host`` (a free port) in a daemon thread; stop it, and cancel what it left, on exit."""
    loop = clock.new_loop()  # the loop `loadgen sim` runs on (uvloop where installed)
    ready = threading.Event()
    failed: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start(host, 0))
        except BaseException as e:  # noqa: BLE001 - reported to the caller's thread
            failed.append(e)
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.close()

    thread = threading.Thread(target=serve, name=name, daemon=True)
    thread.start()
    if not ready.wait(timeout_s) or failed:
        raise SimStartError(f"the {name} did not start: {failed[0] if failed else 'timed out'}")
    try:
        yield
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)


@contextmanager
def serve_in_thread(server: SimServer, host: str = "127.0.0.1", timeout_s: float = 10.0) -> Iterator[str]:
    """The simulator on ``host`` in a daemon thread; yields its base URL; stops it on exit."""
    with run_in_thread(server, host, timeout_s, name="simulator"):
        yield server.url
