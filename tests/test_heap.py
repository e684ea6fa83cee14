"""The C heap keeps the analysis's freed temporaries: a block's next temporaries reuse their pages.

Each case runs in a process of its own (malloc's settings are the process's for its life): it
allocates and frees the temporaries of a block a few times (numpy arrays of 12-16 MB, written
whole) and counts the page faults of each round. Without ``keep_freed_memory`` glibc gives such
memory back to the kernel on every free, so every round faults its pages in again; with it, a
round after the first faults none.
"""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

_ROUNDS = """
import resource, sys
import numpy as np
from loadgen.heap import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a, b = np.ones(1 << 21), np.ones(3 << 19)
    c = np.ones(1 << 21)
    del b
    del a, c
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(__import__("json").dumps({"kept": kept, "faults": faults}))
"""


def _rounds(mode: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, check=True, timeout=60)
    got: dict[str, object] = orjson.loads(out.stdout)
    return got


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux")
def test_freed_temporaries_are_reused_without_new_page_faults() -> None:
    plain, kept = _rounds("plain"), _rounds("keep")
    assert kept["kept"] is True
    plain_faults, kept_faults = plain["faults"], kept["faults"]
    assert isinstance(plain_faults, list) and isinstance(kept_faults, list)
    assert min(plain_faults[1:]) > 500, plain_faults  # the control: glibc alone faults every round in again
    assert max(kept_faults[1:]) < 50, kept_faults  # kept: the first round's pages serve the others
