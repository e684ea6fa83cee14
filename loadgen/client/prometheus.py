"""Reading a server's Prometheus ``/metrics`` text: untrusted input, bounded, parsed by prometheus_client.

The text format is parsed by ``prometheus_client.parser.text_string_to_metric_families``.
What is ours is what an untrusted body needs around it:

- the body is read a chunk at a time and refused once it passes ``MAX_BYTES``, so a
  server that never stops sending costs at most that much memory;
- only sample lines reach the parser: ``#`` lines never do (a ``# TYPE x counter``
  would make it rename the samples ``x_total``; we key on the names as exported), nor
  do histogram buckets and ``_created`` stamps, which nothing here reads and which
  make up most of a vLLM body;
- the parser is pure Python (~2 us a byte) and on some label text its cost grows
  with the square of the line's length, so a line over ``MAX_LINE`` is skipped
  unparsed, and more than ``MAX_SAMPLE_BYTES`` of sample lines is refused whole;
- a value that is NaN, infinite or larger in magnitude than ``MAX_ABS`` is dropped
  (so every sum, delta and mean made of them stays finite), and at most ``MAX_NAMES``
  distinct names are kept;
- an error message quotes the server's text only ASCII-escaped and cut short.

A body that is too large or that the parser refuses raises ``PrometheusTextError``:
the scraper records it as an error row, ``fetch_metrics`` answers None; neither stops
a run. prometheus_client is imported on the first parse, not with this module, so
``loadgen --help`` never pays for it.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp

__all__ = [
    "MAX_BYTES",
    "MAX_LINE",
    "MAX_NAMES",
    "MAX_ABS",
    "MAX_SAMPLE_BYTES",
    "PrometheusTextError",
    "parse_samples",
    "read_body",
    "fetch_metrics",
    "metrics_url",
]

MAX_BYTES = 4 * 1024 * 1024  # a /metrics body; vLLM with many models/LoRAs stays far below this
MAX_LINE = 4096  # a sample line; vLLM's longest (cache_config_info) is ~500 characters
MAX_SAMPLE_BYTES = 256 * 1024  # sample lines parsed per body: ~0.5 s of parsing at worst; a vLLM's are ~10 KiB
MAX_NAMES = 512  # distinct names kept per body; bounds a row whatever the server exports
MAX_ABS = 2.0**53  # past this a float no longer counts by ones: no count, gauge or time we read gets there
_CHUNK = 64 * 1024  # read size

_SKIPPED = re.compile(r"[^{\s]*_(?:bucket|created)(?:[{\s]|$)")  # a name (up to labels or value) with these ends


class PrometheusTextError(ValueError):
    """A ``/metrics`` body that is too large, or that is not Prometheus text."""


def parse_samples(text: str, prefixes: tuple[str, ...] = ("",), limit: int = MAX_NAMES) -> dict[str, float]:
    """The samples whose names start with one of ``prefixes``, summed over label sets
    (``name -> value``), at most ``limit`` names; histogram buckets, ``_created`` stamps,
    lines over ``MAX_LINE`` and values not finite or over ``MAX_ABS`` are left out.
    ``PrometheusTextError`` for text the parser refuses (one bad line refuses the whole
    text: no partial sums) or more than ``MAX_SAMPLE_BYTES`` of sample lines."""
    lines = _sample_lines(text, prefixes)
    if not lines:
        return {}
    from prometheus_client.parser import text_string_to_metric_families  # 0.1-0.4 s to import: only here

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families("\n".join(lines)):
            for sample in family.samples:
                _add(out, sample.name, sample.value, limit)
    except (ValueError, OverflowError) as e:  # OverflowError: a timestamp past float range
        raise PrometheusTextError(f"not Prometheus text: {ascii(str(e) or type(e).__name__)[:120]}") from e
    return out


def _sample_lines(text: str, prefixes: tuple[str, ...]) -> list[str]:
    """The sample lines worth parsing, stripped; ``PrometheusTextError`` past ``MAX_SAMPLE_BYTES``."""
    lines: list[str] = []
    size = 0
    for raw in text.split("\n"):  # the format's line end; str.splitlines would also cut at \x1c, \u2028...
        if len(raw) > MAX_LINE:
            continue
        line = raw.strip()
        if not line or line[0] == "#" or not line.startswith(prefixes):
            continue
        if _SKIPPED.match(line):
            continue
        size += len(line) + 1
        if size > MAX_SAMPLE_BYTES:
            raise PrometheusTextError(f"over {MAX_SAMPLE_BYTES // 1024} KiB of sample lines: refused unparsed")
        lines.append(line)
    return lines


def _add(out: dict[str, float], name: str, raw: float, limit: int) -> None:
    try:
        value = float(raw)  # the parser gives an int for an integer literal, however long
    except OverflowError:
        return
    if not abs(value) <= MAX_ABS:  # NaN compares false too
        return
    if name in out:
        out[name] += value
    elif len(out) < limit:
        out[name] = value


async def read_body(resp: aiohttp.ClientResponse, max_bytes: int = MAX_BYTES) -> bytes:
    """The response body, read a chunk at a time; ``PrometheusTextError`` as soon as it
    passes ``max_bytes`` (by its Content-Length, or while reading), the rest unread."""
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise PrometheusTextError(f"body of {declared} bytes is over the {max_bytes}-byte cap")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        body += chunk
        if len(body) > max_bytes:
            raise PrometheusTextError(f"body over the {max_bytes}-byte cap: not read further")
    return bytes(body)


def metrics_url(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port/metrics`` (where vLLM, SGLang and llama.cpp serve it)."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/metrics"


async def fetch_metrics(url: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """The samples at ``url`` (as ``parse_samples`` gives them), or None when it does not answer with them."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
            async with http.get(url) as resp:
                if resp.status != 200:
                    return None
                body = await read_body(resp)
        return parse_samples(body.decode("utf-8", "replace"))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):  # PrometheusTextError is a ValueError
        return None
