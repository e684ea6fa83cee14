"""Reasons to distrust or qualify a point's figures, in plain words (DESIGN.md, "validity is data").

``validity_warnings`` reads a Summary and says where the client fell behind, the sample
is too small for a bounded p99, the endpoint miscounted or buffered tokens, or requests
failed; ``compact_warnings`` folds its per-metric "only N samples" lines into one. Every
view of a point (the sweep's live lines, the reports, the gate) words them the same.
"""

from __future__ import annotations

import re

from loadgen.analysis.metrics import Summary
from loadgen.analysis.stats import min_samples_bounded

__all__ = ["validity_warnings", "compact_warnings"]

_FEW = re.compile(r"^only (\d+) (\S+) samples: a p99 with a bounded (\S+) interval needs at least (\d+)$")


def validity_warnings(summary: Summary, *, lag_p99_limit_ms: float = 10.0, min_samples: int = 100) -> list[str]:
    """Reasons a reader should distrust or qualify this result, in plain words."""
    s, out = summary, []
    lag99 = s.schedule_lag.pct(99)[0]
    if lag99 > lag_p99_limit_ms:
        out.append(
            f"schedule lag p99 is {lag99:.1f} ms (limit {lag_p99_limit_ms:g} ms): "
            "the client fell behind its schedule; result suspect"
        )
    if s.ok == 0 and s.requests:
        out.append(f"no request succeeded out of {s.requests} in the window")
    for name, d in (("TTFT", s.ttft), ("TPOT", s.tpot), ("E2E", s.e2e)):
        need = max(min_samples, min_samples_bounded(99, d.confidence))
        if 0 < d.n < need:
            out.append(
                f"only {d.n} {name} samples: a p99 with a bounded {d.confidence:.0%} interval needs at least {need}"
            )
    if s.token_mismatch:
        out.append(f"{s.token_mismatch} requests: reported output tokens differ from the streamed count")
    if s.prompt_compared and abs(s.prompt_gap_pct) > 10:
        out.append(
            f"prompt tokens reported differ from requested by {s.prompt_gap_pct:+.1f} % "
            "(tokenizer mismatch? prompts are not the size intended)"
        )
    if s.output_short:
        out.append(
            f"{s.output_short} of {s.ok} ok requests ended before max_tokens "
            "(is ignore_eos honoured?); shorter outputs flatter latency"
        )
    if s.single_burst:
        out.append(f"{s.single_burst} responses arrived in one chunk (buffered, not streamed?)")
    if s.failed:
        detail = ", ".join(f"{k} {v}" for k, v in s.errors_by_status.items() if k != "cancelled")
        out.append(f"{s.failed} of {s.requests} requests failed ({detail})")
    if s.cancelled:
        out.append(f"{s.cancelled} requests were cancelled (still in flight at stop)")
    return out


def compact_warnings(warnings: list[str]) -> list[str]:
    """Fold the per-metric "only N samples" lines of one point into one line; others pass unchanged."""
    few = [m for w in warnings if (m := _FEW.match(w))]
    if len(few) < 2:
        return list(warnings)
    rest = [w for w in warnings if not _FEW.match(w)]
    counts = ", ".join(f"{m.group(1)} {m.group(2)}" for m in few)
    need = max(int(m.group(4)) for m in few)
    return [f"only {counts} samples: a p99 with a bounded {few[0].group(3)} interval needs at least {need}", *rest]
