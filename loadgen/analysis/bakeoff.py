"""Fair bake-offs: did a prefix cache warmed before the run serve it, and did two runs send the same traffic?

Both are pure functions of what a run folder holds (its records and run.json) and both
answer with a small frozen value whose ``code`` and ``message`` the validity rules turn
into a caveat (analysis.validity): ``cache_warm`` for a run or sweep point, and
``traffic_differs`` for a pair of runs that ``compare`` puts side by side.

**Warmth.** A run's prompts carry a fresh salt by default (workload.salt), so a prefix
cache holds nothing of them when the run starts; what it serves then is bounded by the
workload's own reuse (workload.reuse: run.json's ``prefix_reuse``, computed from the
sessions the run sent). The observed cached fraction is the sum of ``cached_tokens`` over
the sum of reported prompt tokens, over the requests whose usage reported cached tokens.
A chat template adds tokens the workload did not ask for (and that a cache may serve to
every request): the reported tokens beyond the requested ones are allowed on top of the
bound. Observed above that allowance by more than ``WARM_MARGIN`` is ``cache_warm``.

**Traffic.** run.json's client block has two fingerprints of the requests written to
the wire (client.fingerprint): the bytes exactly as sent, and the traffic the client
chose (the salt cut out, a later turn's echoed answers left out). Two runs saw the same
traffic when their salt-free fingerprints and request counts agree; byte-identical when
the exact ones agree too. The schedule (when each request was sent) is not in them:
settings say that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.analysis.columns import int_column
from loadgen.workload.reuse import Reuse

__all__ = [
    "WARM_MARGIN",
    "HIT_SHARE",
    "Warmth",
    "cache_warmth",
    "prompt_cache",
    "TrafficMatch",
    "traffic_match",
    "traffic_of",
]

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


def prompt_cache(table: pa.Table) -> dict[str, Any]:
    """Cached prompt tokens for summary.json: the fraction, and TTFT (median, from the intended
    send) of cache hits (at least ``HIT_SHARE`` of the prompt cached) and misses where both occur.
    Over the requests whose usage reported cached tokens (they all ended with an answer)."""
    sel, prompt, cached, _ = _reported(table)
    p = int(prompt.sum())
    out: dict[str, Any] = {
        "requests_reporting": int(sel.sum()),
        "prompt_tokens_reported": p,
        "cached_tokens": int(cached.sum()),
        "cached_fraction": int(cached.sum()) / p if p else None,
        "hit_rule": f"cached_tokens >= {HIT_SHARE:.0%} of the prompt",
        "hits": 0,
        "misses": 0,
        "ttft_p50_ms_hits": None,
        "ttft_p50_ms_misses": None,
    }
    if not p:
        return out
    t_first, f_ok = int_column(table, "t_first")
    t_sched = int_column(table, "t_sched")[0]
    ttft = (t_first[sel] - t_sched[sel]) / 1e6
    has = f_ok[sel]
    hit = cached >= HIT_SHARE * prompt
    out["hits"], out["misses"] = int(hit.sum()), int((~hit).sum())
    if hit.any() and (~hit).any():
        for key, m in (("ttft_p50_ms_hits", hit & has), ("ttft_p50_ms_misses", ~hit & has)):
            out[key] = float(np.median(ttft[m])) if m.any() else None
    return out


# --------------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class TrafficMatch:
    """Whether two runs sent the same traffic."""

    same: bool | None  # None: a run did not record its traffic
    exact: bool  # byte-identical (the same salt too)
    message: str
    code: str = "traffic_differs"

    @property
    def differs(self) -> bool:
        """What makes a comparison suspect: traffic known to differ."""
        return self.same is False


_Print = tuple[str | None, str | None, int]  # (exact, salt-free, requests) of one point


def traffic_of(meta: Mapping[str, Any]) -> list[_Print] | None:
    """A run.json's fingerprints: one per point (a single run: one), None when any is missing."""
    points = meta.get("points")
    clients: Sequence[Any] = [p.get("client") for p in points] if isinstance(points, list) else [meta.get("client")]
    prints: list[_Print] = []
    for c in clients:
        if not isinstance(c, Mapping) or not c.get("traffic_fingerprint_unsalted"):
            return None
        prints.append(
            (c.get("traffic_fingerprint"), c.get("traffic_fingerprint_unsalted"), int(c.get("traffic_requests") or 0))
        )
    return prints


def traffic_match(a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str] = ("A", "B")) -> TrafficMatch:
    """From two run.json dicts (runs or sweeps): did they send the same traffic?"""
    fa, fb = traffic_of(a), traffic_of(b)
    na, nb = names
    if fa is None or fb is None:
        which = " and ".join(n for n, f in ((na, fa), (nb, fb)) if f is None)
        return TrafficMatch(None, False, f"{which} recorded no traffic fingerprint: whether it was the same is unknown")
    ra, rb = sum(f[2] for f in fa), sum(f[2] for f in fb)
    differs = f"{na} and {nb} sent different traffic"
    if len(fa) != len(fb):
        return TrafficMatch(False, False, f"{differs}: {len(fa)} vs {len(fb)} load points ({ra:,} vs {rb:,} requests)")
    if any(x[1:] != y[1:] for x, y in zip(fa, fb, strict=True)):
        if ra != rb:
            return TrafficMatch(False, False, f"{differs}: {ra:,} vs {rb:,} requests")
        why = "workload, seed, lengths or settings differ"
        return TrafficMatch(False, False, f"{differs}: {ra:,} requests each, not the same ones ({why})")
    if all(x[0] == y[0] for x, y in zip(fa, fb, strict=True)):
        return TrafficMatch(True, True, f"{na} and {nb} sent byte-identical traffic ({ra:,} requests, the same salt)")
    why = "only the salt, or the answers echoed back, differ"
    return TrafficMatch(True, False, f"{na} and {nb} sent the same traffic ({ra:,} requests; {why})")
