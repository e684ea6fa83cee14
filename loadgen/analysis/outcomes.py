"""What the requests of a window did, as counts beside the latencies: statuses, failures and
example errors, prompt and output token accounting, and the stream's shape (single bursts,
answers buffered rather than streamed, streams without ``[DONE]``).

``metrics.summarize`` folds these fields into its ``Summary`` (their meanings are its
fields'); split from it because none of them is a latency. ``buffered_rows`` walks the chunks
twice: once to find the few requests that could be buffered at all (``BUFFERED_SHARE`` of
their tokens late), then the exact test over those only.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loadgen.analysis.chunk_walk import chunk_blocks, chunk_tokens
from loadgen.analysis.columns import Cols, Mask, Objects
from loadgen.records import STATUSES

BUFFERED_SHARE = 0.8  # of a request's tokens in one read, and of its time before that read
BUFFERED_MIN_TOKENS = 4  # fewer tokens cannot tell a buffered answer from a short one

__all__ = [
    "token_count_fields",
    "error_fields",
    "status_counts",
    "value_counts",
    "buffered_rows",
    "BUFFERED_SHARE",
    "BUFFERED_MIN_TOKENS",
]

_EXAMPLES = 5
_ERROR_CHARS = 160
_EXAMPLE_SCAN = 10_000  # failed rows searched for distinct example errors


_STRINGS = {"status": "status", "output_tokens_source": "source", "finish_reason": "finish"}  # -> Cols


def value_counts(c: Cols, name: str, rows: Mask, none: str) -> dict[str, int]:
    """How many of ``rows`` hold each value of the string column ``name`` (``status``,
    ``output_tokens_source``, ``finish_reason``), a null counted as ``none``; by value."""
    codes, values = c.once(("codes", name), lambda: _codes(getattr(c, _STRINGS[name])))
    found = np.bincount(codes[rows] + 1, minlength=len(values) + 1)
    out: dict[str, int] = {}
    for label, k in zip([none, *values], found.tolist(), strict=True):
        if k:
            out[label] = out.get(label, 0) + k
    return dict(sorted(out.items()))


def _codes(values: Objects) -> tuple[NDArray[np.int64], list[str]]:
    """A string column as (per row: the index of its value in the list, -1 where null; the
    distinct values as str), by hashing (no sort of a million strings)."""
    index: dict[object, int] = {}
    codes = np.fromiter((-1 if v is None else index.setdefault(v, len(index)) for v in values), np.int64, values.size)
    return codes, [str(v) for v in index]


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else math.nan


def _mean(x: NDArray[np.int64]) -> float:
    return float(np.mean(x)) if x.size else math.nan


def token_count_fields(c: Cols, inwin: Mask, okw: Mask) -> dict[str, Any]:
    req, has_req = c.ints["prompt_tokens_requested"]
    rep, has_rep = c.ints["prompt_tokens_reported"]
    both = inwin & has_req & has_rep
    req_sum = int(req[both].sum())
    oreq, has_oreq = c.ints["output_tokens_requested"]
    orep, has_orep = c.ints["output_tokens_reported"]
    chunk_sum = chunk_tokens(c)
    asked = okw & has_oreq
    spread = inwin & (c.source == "usage") & (c.c_len > 0)
    return dict(
        prompt_compared=int(both.sum()),
        prompt_requested_mean=_mean(req[both]),
        prompt_reported_mean=_mean(rep[both]),
        prompt_gap_mean=_mean(rep[both] - req[both]),
        prompt_gap_pct=_pct(int(rep[both].sum()) - req_sum, req_sum),
        output_requested_mean=_mean(oreq[asked]),
        output_counted_mean=_mean(c.out[okw]),
        output_short=int((asked & (c.out < oreq)).sum()),
        finish_reasons=value_counts(c, "finish_reason", okw, none="none"),
        token_sources=value_counts(c, "output_tokens_source", inwin, none="none"),
        spread_tokens_per_chunk=float(chunk_sum[spread].sum() / c.c_len[spread].sum()) if spread.any() else math.nan,
        token_mismatch=int((inwin & has_orep & (orep != chunk_sum)).sum()),
        single_burst=int((okw & (c.out >= 2) & (c.c_len == 1)).sum()),
        buffered=int(buffered_rows(c, okw).sum()),
        buffered_of=int((okw & (chunk_sum >= BUFFERED_MIN_TOKENS)).sum()),
        no_done_marker=int((okw & (c.stream_end == "finish")).sum()),
    )


def error_fields(c: Cols, inwin: Mask) -> dict[str, Any]:
    bad = inwin & ~c.ok
    http, has_http = c.ints["http_status"]
    http_keys = np.where(has_http[bad], http[bad].astype(str), "none")
    examples: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    for i in np.flatnonzero(bad)[:_EXAMPLE_SCAN]:  # counts above are complete
        key = (c.status[i], int(http[i]) if has_http[i] else None, c.error[i])
        if key in seen:
            continue
        seen.add(key)
        code = f" {key[1]}" if key[1] is not None else ""
        text = (key[2] or "")[:_ERROR_CHARS]
        examples.append(f"{key[0]}{code}: {text}" if text else f"{key[0]}{code}")
        if len(examples) >= _EXAMPLES:
            break
    return dict(
        errors_by_status=value_counts(c, "status", bad, none="none"),
        errors_by_http=_counts(http_keys, none="none"),
        error_examples=examples,
    )


def _counts(values: Objects, none: str) -> dict[str, int]:
    return dict(sorted(Counter(none if v is None else str(v) for v in values).items()))


def status_counts(found: dict[str, int]) -> dict[str, int]:
    """Every status of ``STATUSES`` (0 where none), in its order, then any other found."""
    found = dict(found)
    out = {s: found.pop(s, 0) for s in STATUSES}
    out.update(found)  # unknown statuses are kept, not dropped
    return out


_LATE_BLOCK = 1 << 18  # chunks per block of buffered_rows' first walk (per-row sums: any blocks give the same)


def buffered_rows(c: Cols, rows: Mask) -> Mask:
    """Per row: one of ``rows`` that looks buffered, not streamed. It has at least
    ``BUFFERED_MIN_TOKENS`` output tokens, at least ``BUFFERED_SHARE`` of them arrived at one
    instant (chunks with the same ``chunk_ns``: one read), and that read came after at least
    ``BUFFERED_SHARE`` of the request's time from send to its last byte (``t_done - t_sent``)
    had passed in silence. A streamed answer spreads its tokens over many reads; a server or
    proxy that buffers the stream sends (nearly) all of them at the end."""
    out: Mask = np.zeros(c.n, dtype=bool)
    (sent, has_sent), (done, has_done) = c.t["t_sent"], c.t["t_done"]
    span_all = done - sent
    total_all = chunk_tokens(c)
    rows = rows & has_sent & has_done & (span_all > 0) & (total_all >= BUFFERED_MIN_TOKENS)
    # a buffered row has >= BUFFERED_SHARE of its tokens at one late instant, so at least that many
    # late: the rows short of it (every streamed one) are left out before the exact test below
    # (every row's chunks walked, in blocks that stay in cache: nearly every row is one of ``rows``,
    # and picking their chunks out would cost more than the others' few; theirs are masked below)
    late_tok = np.zeros(c.n)
    threshold = BUFFERED_SHARE * span_all
    for b in chunk_blocks(c, size=_LATE_BLOCK):
        at = slice(b.row0, b.row0 + b.lens.size)
        late = (b.ns - np.repeat(sent[at], b.lens)) >= np.repeat(threshold[at], b.lens)
        has, sums = b.request_sums(np.where(late, b.tok, 0))  # each request's late tokens, summed
        late_tok[b.row0 + has] = sums
    rows &= late_tok >= BUFFERED_SHARE * total_all
    for b in chunk_blocks(c, rows):
        owner, ns, tok = b.owner, b.ns, b.tok
        new = np.ones(owner.size, dtype=bool)  # the first chunk of each (request, instant)
        new[1:] = (owner[1:] != owner[:-1]) | (ns[1:] != ns[:-1])
        group = np.cumsum(new) - 1
        g_tok = np.bincount(group, weights=tok).astype(np.int64)
        g_owner, g_ns = owner[new], ns[new]
        total = np.bincount(owner, weights=tok).astype(np.int64)
        row = b.row0 + g_owner
        big = (total[g_owner] >= BUFFERED_MIN_TOKENS) & (g_tok >= BUFFERED_SHARE * total[g_owner])
        timed = has_sent[row] & has_done[row]
        span = (done - sent)[row]
        late = (g_ns - sent[row]) >= BUFFERED_SHARE * span
        out[row[big & timed & late & (span > 0)]] = True
    return out
