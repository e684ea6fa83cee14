"""How the streams were shaped, said where figures are read: buffered delivery (``buffered_stream``),
streams without [DONE] (``no_done_marker``), and where ITL's per-chunk token counts came from."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console

from loadgen.analysis.metrics import Summary, summarize, summary_to_json
from loadgen.analysis.run_summary import RunReport, single_run_caveats
from loadgen.analysis.stream_shape import itl_approximate, token_source_text
from loadgen.analysis.validity import SUSPECT_CODES, Caveat, Validity, first_codes_first, summary_caveats
from loadgen.records import Record, to_batch
from loadgen.report.terminal import print_run

MS = 1_000_000
T0 = 10**12


def rec(
    i: int,
    chunks: Sequence[tuple[float, int]],
    *,
    done: float | None = None,
    source: str = "usage",
    stream_end: str = "done",
    status: str = "ok",
) -> Record:
    """Request i, scheduled and sent at i * 1000 ms; chunks as (ms after the send, tokens)."""
    sent = T0 + i * 1000 * MS
    at = [sent + round(t * MS) for t, _ in chunks]
    end = sent + round((done if done is not None else chunks[-1][0] + 1) * MS)
    return Record(
        request=i,
        session=i,
        t_sched=sent,
        t_sent=sent,
        t_first=at[0],
        t_last=at[-1],
        t_done=end,
        chunk_ns=at,
        chunk_tokens=[k for _, k in chunks],
        output_tokens=sum(k for _, k in chunks),
        output_tokens_source=source,
        finish_reason="length",
        stream_end=stream_end,
        status=status,
    )


def summary(*records: Record) -> Summary:
    return summarize(pa.Table.from_batches([to_batch(list(records))]))


STREAMED = [(50 + 10 * k, 1) for k in range(8)]  # one token per read, every 10 ms
BUFFERED = [(199, 1), (200, 7)]  # nothing for 199 ms, then 7 of 8 tokens in one read, 1 ms before the end


def codes(s: Summary) -> list[str]:
    return [c.code for c in summary_caveats(s, min_samples=1)]


def test_most_tokens_in_one_late_read_is_flagged_buffered_and_said_first() -> None:
    """Two of three ok requests look buffered: the run is flagged, before any other caveat, and not
    suspect (what was measured is the endpoint's behaviour, not a client fault)."""
    s = summary(rec(0, BUFFERED, done=201), rec(1, BUFFERED, done=201), rec(2, STREAMED), rec(3, [(40, 1)]))
    assert (s.buffered, s.buffered_of) == (2, 3)  # the one-token answer cannot tell
    caveats = summary_caveats(s, min_samples=1)
    assert caveats[0].code == "buffered_stream"
    assert caveats[0].message.startswith("2 of 3 ok requests (with >= 4 tokens) got most of their output in one read")
    assert "TTFT is close to E2E and ITL near 0" in caveats[0].message
    assert "buffered_stream" not in SUSPECT_CODES and not Validity.of(caveats).withholding.suspect


@pytest.mark.parametrize(
    ("chunks", "done", "why"),
    [
        (STREAMED, None, "one token per read"),
        ([(10, 7), (190, 1)], 200, "the big read came early: a fast first burst, then streaming"),
        ([(150, 4), (160, 4)], 200, "half and half: no read holds 80% of the tokens"),
        ([(100, 8)], 300, "the one read came a third of the way in (the rest was a slow close)"),
    ],
)
def test_what_is_not_buffered(chunks: Sequence[tuple[float, int]], done: float | None, why: str) -> None:
    s = summary(*(rec(i, chunks, done=done) for i in range(4)))
    assert s.buffered == 0 and "buffered_stream" not in codes(s), why


def test_chunks_stamped_at_one_instant_count_as_one_read() -> None:
    """Seven one-token chunks parsed from one read share its stamp: that is one read of 7 tokens."""
    one_read = [(199, 1)] + [(200, 1)] * 7
    s = summary(*(rec(i, one_read, done=201) for i in range(2)))
    assert (s.buffered, s.buffered_of) == (2, 2) and codes(s)[0] == "buffered_stream"
    assert "single_burst" not in codes(s)  # the stronger statement stands alone


def test_a_minority_of_buffered_requests_is_not_a_buffered_run() -> None:
    s = summary(rec(0, BUFFERED, done=201), rec(1, STREAMED), rec(2, STREAMED))
    assert (s.buffered, s.buffered_of) == (1, 3) and "buffered_stream" not in codes(s)


def test_ok_streams_without_done_are_counted_and_named() -> None:
    s = summary(
        rec(0, STREAMED, stream_end="finish"),
        rec(1, STREAMED, stream_end="finish"),
        rec(2, STREAMED),
        rec(3, STREAMED[:3], stream_end="eof", status="disconnected"),
    )
    assert s.no_done_marker == 2 and s.ok == 3  # "finish" is ok; "eof" is a disconnect, not counted here
    (c,) = [c for c in summary_caveats(s, min_samples=1) if c.code == "no_done_marker"]
    assert c.message.startswith("2 ok streams ended with a finish_reason but without data: [DONE]: counted ok")
    assert not Validity.of([c]).suspect
    assert summary_to_json(s)["no_done_marker"] == 2


def test_records_from_before_stream_end_read_as_unknown() -> None:
    old = pa.Table.from_batches([to_batch([rec(0, STREAMED)])]).drop_columns(["stream_end"])
    s = summarize(old)
    assert s.no_done_marker == 0 and s.ok == 1


def test_the_qualifying_codes_come_first_among_a_runs_caveats() -> None:
    s = summary(*(rec(i, BUFFERED, done=201, stream_end="finish") for i in range(3)))
    meta = {"client": {"loop_lag_max_ms": 80.0}, "state": "complete"}
    got = [c.code for c in single_run_caveats(meta, s, 10.0)]
    assert got[:2] == ["buffered_stream", "no_done_marker"] and "client_loop_stall" in got
    mixed = [Caveat("failed", "f"), Caveat("no_done_marker", "n"), Caveat("client_lag", "l")]
    assert [c.code for c in first_codes_first(mixed)] == ["no_done_marker", "failed", "client_lag"]


# --------------------------------------------------------------------------- per-chunk token sources


def test_token_sources_are_shown_as_shares_with_itl() -> None:
    s = summary(*(rec(i, STREAMED, source="usage_per_chunk") for i in range(3)), rec(3, STREAMED, source="tokenizer"))
    assert s.token_sources == {"tokenizer": 1, "usage_per_chunk": 3}
    assert token_source_text(s) == "per-chunk tokens: usage per chunk 75%, tokenizer 25%"
    assert not itl_approximate(s)


def test_usage_spread_over_multi_token_chunks_makes_itl_approximate() -> None:
    """The final usage spread evenly over chunks of ~3 tokens: ITL's percentiles are approximate."""
    three = [(50 + 10 * k, 3) for k in range(6)]
    s = summary(*(rec(i, three) for i in range(2)))
    assert s.spread_tokens_per_chunk == pytest.approx(3.0) and itl_approximate(s)
    assert token_source_text(s).startswith(
        "per-chunk tokens: usage spread over chunks 100%; usage spread over chunks of 3.0 tokens on average: "
        "ITL percentiles are approximate"
    )
    one = summary(*(rec(i, STREAMED) for i in range(2)))  # spread over one-token chunks: exact
    assert one.spread_tokens_per_chunk == pytest.approx(1.0) and not itl_approximate(one)


def test_the_terminal_shows_the_source_with_itl_and_the_qualifiers_first(tmp_path: Path) -> None:
    s = summary(*(rec(i, BUFFERED, done=201) for i in range(3)))
    caveats = single_run_caveats({"state": "complete"}, s, 10.0)
    meta = {"endpoint": "http://127.0.0.1:1/v1", "model": "m", "client": {"read_lateness_p99_ms": 2.5}}
    buf = io.StringIO()
    print_run(RunReport(tmp_path, meta, s, caveats, Validity.of(caveats)), Console(file=buf, width=300))
    lines = buf.getvalue().splitlines()
    (itl,) = [ln for ln in lines if ln.startswith("ITL p50")]
    assert "(per-chunk tokens: usage spread over chunks 100%; usage spread over chunks of 4.0 tokens" in itl
    assert "ITL percentiles are approximate" in itl
    warnings = [ln for ln in lines if ln.startswith("warning: ")]
    assert warnings[0].startswith("warning: 3 of 3 ok requests (with >= 4 tokens) got most of their output")
    assert "client: reads stamped ~2.5 ms late at p99 (estimate)" in lines
