"""The simulator served from a background thread with its own event loop.

For tests and notebooks that want a loopback endpoint without a subprocess
(starting a Python process costs seconds on a small machine); the server's
event loop never shares a thread with the caller's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from loadgen import clock
from loadgen.sim.process import SimStartError
from loadgen.sim.server import SimServer

__all__ = ["serve_in_thread"]


@contextmanager
def serve_in_thread(server: SimServer, host: str = "127.0.0.1", timeout_s: float = 10.0) -> Iterator[str]:
    """Start ``server`` on ``host`` in a daemon thread; yields its base URL; stops it on exit."""
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
        loop.close()

    thread = threading.Thread(target=serve, name="loadgen-sim", daemon=True)
    thread.start()
    if not ready.wait(timeout_s) or failed:
        raise SimStartError(f"the simulator did not start: {failed[0] if failed else 'timed out'}")
    try:
        yield server.url
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
