"""What the records say of the server's prompt (prefix) cache: how much it served, and whether
it was warm before the run began.

``cache_warmth`` answers for a run or sweep point with a small frozen value whose ``code``
and ``message`` the validity rules turn into a caveat (analysis.validity: ``cache_warm``),
a pure function of a records table (and run.json). The cached share of prompt tokens and
TTFT of cache hits vs misses, over the measurement window, are analysis.tokens' (``Summary``).

**Warmth.** A run's prompts carry a fresh salt by default (workload.salt), so a prefix
cache holds nothing of them when the run starts; what it serves then is bounded by the
workload's own reuse (workload.reuse: run.json's ``prefix_reuse``, computed from the
sessions the run sent). The observed cached fraction is the sum of ``cached_tokens`` over
the sum of reported prompt tokens, over the requests whose usage reported cached tokens.
A chat template adds tokens the workload did not ask for (and that a cache may serve to
every request): the reported tokens beyond the requested ones are allowed on top of the
bound. Observed above that allowance by more than ``WARM_MARGIN`` is ``cache_warm``.

Whether two runs sent the same traffic (the other half of a fair bake-off) is
analysis.traffic's, from the fingerprints client.fingerprint records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.analysis.columns import int_column
from loadgen.workload.reuse import Reuse

__all__ = ["WARM_MARGIN", "HIT_SHARE", "Warmth", "cache_warmth"]

WARM_MARGIN = 0.10  # cached share of prompt tokens above the bound that is not noise
HIT_SHARE = 0.5  # a request counts as a cache hit when at least this share of its prompt was cached


@dataclass(frozen=True)
class Warmth:
    """The cache-warmth check of one run or sweep point."""

    observed: float | None  # cached share of prompt tokens; None: no request reported cached tokens
    predicted: float | None  # the workload's own reuse bound; None: run.json has none
    allowance: float  # share of reported prompt tokens beyond those requested (a chat template's)
    requests: int  # requests that reported cached tokens
    prompt_tokens: int  # their reported prompt tokens
    cached_tokens: int
    warm: bool
    message: str | None  # why ``warm`` (None when not)
    code: str = "cache_warm"

    @property
    def bound(self) -> float | None:
        """The most this workload's own reuse (and a template) lets a cache serve."""
        return None if self.predicted is None else min(1.0, self.predicted + self.allowance)

    def json(self) -> dict[str, Any]:
        return {
            "cached_fraction": self.observed,
            "predicted_max_fraction": self.bound,
            "requests_reporting": self.requests,
            "prompt_tokens_reported": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "warm": self.warm,
        }


def _reported(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per request that reported both: prompt tokens, cached tokens, requested (0 if unknown)."""
    prompt, p_ok = int_column(table, "prompt_tokens_reported")
    cached, c_ok = int_column(table, "cached_tokens")
    requested, r_ok = int_column(table, "prompt_tokens_requested")
    sel = p_ok & c_ok & (prompt > 0)
    return sel, prompt[sel], np.minimum(cached[sel], prompt[sel]), np.where(r_ok[sel], requested[sel], prompt[sel])


def cache_warmth(
    table: pa.Table,
    reuse: Reuse | Mapping[str, Any] | None,
    *,
    salt: str | None = None,
    salt_source: str | None = None,
    margin: float = WARM_MARGIN,
) -> Warmth:
    """Whether the run's (or point's) records show more prompt caching than its own reuse allows.

    ``reuse``: run.json's ``prefix_reuse`` (or a sweep point's); ``salt`` and
    ``salt_source``: run.json's, for the message."""
    bound = reuse if isinstance(reuse, Reuse) or reuse is None else Reuse.from_json(reuse)
    _, prompt, cached, requested = _reported(table)
    n, p, c = len(prompt), int(prompt.sum()), int(cached.sum())
    observed = c / p if p else None
    allowance = float(np.maximum(prompt - requested, 0).sum()) / p if p else 0.0
    predicted = None if bound is None else bound.fraction
    warm = observed is not None and predicted is not None and c > 0 and observed > predicted + allowance + margin
    w = Warmth(observed, predicted, allowance, n, p, c, warm, None)
    if warm:
        w = Warmth(observed, predicted, allowance, n, p, c, True, _message(w, salt, salt_source))
    return w


def _message(w: Warmth, salt: str | None, source: str | None) -> str:
    head = (
        f"{w.observed or 0:.0%} of prompt tokens were served from cache; "
        f"this workload's own reuse predicts at most {w.bound or 0:.0%}"
    )
    if source == "fresh":
        return (
            f"{head}, although the run's prompts carried a fresh salt ({salt}): the server serves from "
            "cache what no earlier run could have sent it (check how it counts cached tokens)"
        )
    if source == "off":
        return f"{head}: an earlier run warmed the server's prefix cache (prompts were sent unsalted: --salt none)"
    if source == "given":
        return (
            f"{head}: an earlier run warmed the server's prefix cache (this run replayed salt {salt}; "
            "leave --salt out for a fresh one)"
        )
    return f"{head}: an earlier run warmed the server's prefix cache"
