"""Reading a server's Prometheus ``/metrics`` text: untrusted input, parsed defensively."""

from __future__ import annotations

import math
import re

import aiohttp

__all__ = ["parse_prometheus", "fetch_metrics", "metrics_url"]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_MAX_BYTES = 4 * 1024 * 1024


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric name over its label sets (``name -> value``); bad lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def metrics_url(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port/metrics`` (where vLLM, SGLang and llama.cpp serve it)."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/metrics"


async def fetch_metrics(url: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """The parsed metrics at ``url``, or None when it does not answer with them."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
            async with http.get(url) as resp:
                if resp.status != 200:
                    return None
                raw = await resp.content.read(_MAX_BYTES)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    return parse_prometheus(raw.decode("utf-8", "replace"))
