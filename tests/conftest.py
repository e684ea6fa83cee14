"""Shared fixtures: a simulator process on loopback, run folders, small engine runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.sim.process import SimProcess, start_sim


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
