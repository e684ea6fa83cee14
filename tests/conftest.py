"""Shared fixtures: a simulator process on loopback, run folders, small engine runs."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.sim.process import SimProcess, start_sim


def _cache_bytecode_outside_the_tree() -> None:
    """With PYTHONDONTWRITEBYTECODE set (as on the project's boxes), every ``python -m loadgen``,
    simulator and worker process the suite starts compiled loadgen's modules from source again
    (~0.4 s of CPU each). The variable asks that no ``__pycache__`` be written into the tree; a
    cache prefix in the user's cache folder honours that and still compiles each module once.
    Set here, before the xdist workers start, every process of the suite inherits it; an
    explicit PYTHONPYCACHEPREFIX is left as it is."""
    if not sys.flags.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    prefix = str(Path(cache) / "loadgen-tests" / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.dont_write_bytecode = False
    sys.pycache_prefix = prefix


_cache_bytecode_outside_the_tree()


@pytest.fixture(scope="module")
def fixed_sim() -> Iterator[SimProcess]:
    """The simulator with the fixed-latency model: TTFT 50 ms, ITL 10 ms."""
    with start_sim(["--ttft-ms", "50", "--itl-ms", "10"]) as sim:
        yield sim


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def run_async(coro):  # noqa: ANN001, ANN201 - small test helper
    return asyncio.run(coro)
