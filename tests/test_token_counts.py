"""Reconciling observed per-chunk token counts with the usage a server reports.

The recorded counts decide ITL and TPOT, so each rule of ``reconcile`` is pinned
here: first on the function's own inputs, then end to end through a tally.
"""

from __future__ import annotations

import pytest
from chunks import sse, tally_of, usage_chunk

from loadgen.client.protocol.token_counts import reconcile, spread


@pytest.mark.parametrize(
    "observed, per_chunk, carry, reported, expected",
    [
        ([1, 2, 3], True, 0, 6, ([1, 2, 3], 6, "usage_per_chunk")),  # running usage: kept as observed
        ([1, 1], True, 1, 3, ([1, 2], 3, "usage_per_chunk")),  # a rise after the last output chunk joins it
        ([1, 1, 1], False, 0, 7, ([2, 2, 3], 7, "usage")),  # the surplus spread over the chunks
        ([2, 1], False, 0, 3, ([2, 1], 3, "usage")),  # usage equal to what was seen
        ([1, 1, 1, 1], False, 0, 2, ([1, 1, 1, 1], 4, "chunks")),  # under-reported: the chunks win
        ([1, 1], False, 0, None, ([1, 1], 2, "chunks")),  # no usage
        ([], False, 0, 5, ([], 0, "usage")),
        ([], False, 0, None, ([], 0, "none")),
    ],
)
def test_reconcile_rules(
    observed: list[int], per_chunk: bool, carry: int, reported: int | None, expected: tuple[list[int], int, str]
) -> None:
    given = list(observed)
    result = reconcile(observed, per_chunk, carry, reported)
    assert result == expected
    assert (result.counts, result.total, result.source) == expected  # the fields are named
    assert observed == given  # the tally's own list is not changed


def content(n: int, usage: int | None = None) -> list[bytes]:
    reads = sse(*[{"choices": [{"index": 0, "delta": {"content": "w"}}], "usage": None} for _ in range(n)])
    if usage is not None:
        reads += sse(usage_chunk(usage))
    return reads + sse(b"[DONE]")


@pytest.mark.parametrize(
    "n, usage, expected",
    [
        (3, 3, ([1, 1, 1], 3, "usage")),
        (3, 7, ([2, 2, 3], 7, "usage")),  # usage spread over multi-token chunks
        (4, 10, ([2, 3, 2, 3], 10, "usage")),
        (4, 2, ([1, 1, 1, 1], 4, "chunks")),  # under-reporting server: keep the chunks
        (3, None, ([1, 1, 1], 3, "chunks")),  # no usage
        (0, 5, ([], 0, "usage")),
        (0, None, ([], 0, "none")),
        (0, 0, ([], 0, "usage")),
    ],
)
def test_reconcile(n: int, usage: int | None, expected: tuple[list[int], int, str]) -> None:
    t = tally_of("chat", content(n, usage))
    assert t.reconcile() == expected
    assert t.completion_tokens == usage  # the reported value stays visible


@pytest.mark.parametrize("total, n", [(5, 5), (7, 3), (10, 4), (100, 7), (129, 128), (1, 1), (1000, 3)])
def test_spread_is_even_and_sums_to_total(total: int, n: int) -> None:
    counts = spread(total, n)
    assert len(counts) == n and sum(counts) == total
    assert max(counts) - min(counts) <= 1
