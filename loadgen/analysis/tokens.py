"""The figures about tokens beside the latency ones: token goodput, cached prompt tokens,
reasoning tokens, and TTFT to the first visible content.

Split from ``metrics`` (which folds them into its ``Summary``) because each reads a
column the core figures do not: ``cached_tokens`` (prompt tokens the endpoint served
from its prefix cache), ``reasoning_tokens`` and ``t_first_content`` (the first chunk
carrying visible content, not reasoning). All three are null where the endpoint did not
report them; a figure over them counts only the requests that did (docs/metrics.md).

- **token goodput**: output tokens of the requests counted in request goodput (ok, done
  in the window, every SLO bound met) per second of the window;
- **cached prompt fraction**: sum of ``cached_tokens`` (each at most its prompt) / sum of
  ``prompt_tokens_reported`` over the window's requests that reported both; TTFT is split
  into cache hits (at least ``prompt_cache.HIT_SHARE``, half, of the prompt cached: a chat
  template's shared prefix alone is no hit) and misses, where both occur, over the
  measurement window like every other figure;
- **reasoning tokens**: their sum over the requests that reported them, and their share
  of those requests' output tokens;
- **TTFT to first content**: ``t_first_content - t_sched``, censored like TTFT: a request
  loadgen stopped waiting for before its first visible content is censored at its elapsed time; an
  ok one with none (an answer of reasoning or tool calls only) has no sample. Records in
  which no request has ``t_first_content`` (a run from before the column, say) give none.
  ``content_after_first`` counts the requests whose first output chunk was not visible
  content (reasoning or a tool call came first): where it is 0 the two TTFTs are the same.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.analysis.columns import Cols, Ints, Mask, int_column, ms
from loadgen.analysis.latencies import Latencies
from loadgen.analysis.prompt_cache import HIT_SHARE
from loadgen.analysis.stats import Dist, describe
from loadgen.analysis.window import Window

__all__ = ["token_fields", "TOKEN_FIELDS"]

# The Summary fields ``token_fields`` fills, in order (``metrics.Summary`` declares them).
TOKEN_FIELDS = (
    "goodput_tps",
    "ttft_content",
    "content_after_first",
    "reasoning_reported",
    "reasoning_tokens",
    "reasoning_output_pct",
    "cached_reported",
    "cached_prompt_tokens",
    "cached_prompt_fraction",
    "ttft_ms_cached",
    "ttft_ms_uncached",
)


def _nullable(table: pa.Table, name: str) -> tuple[Ints, Mask]:
    """An integer column as (values, reported); a table from before the column existed has none reported."""
    if name in table.column_names:
        return int_column(table, name)
    return np.zeros(table.num_rows, dtype=np.int64), np.zeros(table.num_rows, dtype=bool)


def token_fields(table: pa.Table, c: Cols, lat: Latencies, w: Window, inwin: Mask, met: Mask | None) -> dict[str, Any]:
    """The fields of ``TOKEN_FIELDS`` over the requests scheduled in the window ``w``
    (``met``: per row, ok and every SLO bound met; None without an SLO)."""
    out: dict[str, Any] = {"goodput_tps": _goodput_tps(c, w, met)}
    out.update(_content(table, c, lat, inwin))
    out.update(_reasoning(table, c, inwin))
    out.update(_cached(table, c, lat, inwin))
    return out


def _goodput_tps(c: Cols, w: Window, met: Mask | None) -> float | None:
    if met is None:
        return None
    done, has_done = c.t["t_done"]
    good = met & has_done & w.contains(done)
    return float(c.out[good].sum()) / w.length_s if w.length_s > 0 else math.nan


def _content(table: pa.Table, c: Cols, lat: Latencies, inwin: Mask) -> dict[str, Any]:
    content, has_content = _nullable(table, "t_first_content")
    if not has_content.any():  # not recorded (an older run, or no request showed content): no figure
        return {"ttft_content": describe([]), "content_after_first": 0}
    first, has_first = c.t["t_first"]
    exact = np.where(has_content, ms(content, c.t_sched), np.nan)
    # e2e_c: the elapsed time of every request loadgen stopped waiting for: censored until content came
    censored = np.where(~has_content, lat.e2e_c, np.nan)
    # the first output chunk was not visible content (reasoning, a tool call): the two TTFTs differ
    later = inwin & has_first & (~has_content | (content > first))
    return {
        "ttft_content": describe(exact[inwin], censored=censored[inwin]),
        "content_after_first": int(later.sum()),
    }


def _reasoning(table: pa.Table, c: Cols, inwin: Mask) -> dict[str, Any]:
    reasoning, reported = _nullable(table, "reasoning_tokens")
    rows = inwin & reported
    total = int(reasoning[rows].sum())
    output = int(c.out[rows].sum())
    return {
        "reasoning_reported": int(rows.sum()),
        "reasoning_tokens": total,
        "reasoning_output_pct": 100.0 * total / output if output else math.nan,
    }


def _cached(table: pa.Table, c: Cols, lat: Latencies, inwin: Mask) -> dict[str, Any]:
    cached, has_cached = _nullable(table, "cached_tokens")
    prompt, has_prompt = c.ints["prompt_tokens_reported"]
    both = inwin & has_cached & has_prompt
    cached = np.minimum(cached, prompt)  # a cache cannot serve more than the prompt
    prompt_sum, cached_sum = int(prompt[both].sum()), int(cached[both].sum())
    hit = both & (cached >= HIT_SHARE * prompt)
    miss = both & ~hit
    split = bool(hit.any() and miss.any())
    return {
        "cached_reported": int((inwin & has_cached).sum()),
        "cached_prompt_tokens": cached_sum,
        "cached_prompt_fraction": cached_sum / prompt_sum if prompt_sum else None,
        "ttft_ms_cached": _ttft(lat, hit) if split else None,
        "ttft_ms_uncached": _ttft(lat, miss) if split else None,
    }


def _ttft(lat: Latencies, rows: Mask) -> Dist:
    return describe(lat.ttft[rows], censored=lat.ttft_c[rows])
