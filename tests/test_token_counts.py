"""Reconciling observed per-chunk token counts with the usage a server reports.

The recorded counts decide ITL and TPOT, so each rule of ``reconcile`` is pinned
here: first on the function's own inputs, then end to end through a tally.
"""

from __future__ import annotations

import pytest
from chunks import sse, tally_of, usage_chunk
from hypothesis import given
from hypothesis import strategies as st

from loadgen.client.protocol.token_counts import reconcile, spread
from loadgen.untrusted import MAX_TOKEN_COUNT


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
        # running usage that leapt to the bound: its counts add up to more, so they are not believed
        ([1, MAX_TOKEN_COUNT - 1, 1], True, 0, MAX_TOKEN_COUNT, ([1, 1, 1], 3, "chunks")),
        (
            [1, MAX_TOKEN_COUNT - 1],
            True,
            0,
            MAX_TOKEN_COUNT,
            ([1, MAX_TOKEN_COUNT - 1], MAX_TOKEN_COUNT, "usage_per_chunk"),
        ),
        ([1, 1], False, 0, MAX_TOKEN_COUNT, ([MAX_TOKEN_COUNT // 2] * 2, MAX_TOKEN_COUNT, "usage")),
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


@given(
    observed=st.lists(st.integers(1, MAX_TOKEN_COUNT), max_size=6),
    per_chunk=st.booleans(),
    carry=st.integers(0, MAX_TOKEN_COUNT),
    reported=st.one_of(st.none(), st.integers(0, MAX_TOKEN_COUNT)),
)
def test_reconciled_counts_stay_within_their_columns(
    observed: list[int], per_chunk: bool, carry: int, reported: int | None
) -> None:
    # whatever the tally hands over: its counts at least 1 (exactly 1 without running
    # usage, as only the first choice counts), carry and usage already bounded
    if not per_chunk:
        observed = [1] * len(observed)
    counts, total, _ = reconcile(observed, per_chunk, carry, reported)
    assert len(counts) == len(observed) and sum(counts) == total
    assert all(0 <= c <= MAX_TOKEN_COUNT for c in counts) and 0 <= total <= MAX_TOKEN_COUNT
