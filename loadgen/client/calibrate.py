"""Calibrate the workload tokenizer against an endpoint's own token counts.

The built-in tokenizer is an approximation: a prompt built for N of its tokens is
some other number of the endpoint's. Calibration sends a few probe texts of known
length and fits reported = ratio x expected + overhead. Two sources, best first:

- ``POST {root}/tokenize`` (vLLM, SGLang, llama.cpp, the built-in simulator):
  exact counts, no generation, no chat template (``overhead`` ~ 0);
- ``usage.prompt_tokens`` of non-streaming ``/completions`` (else
  ``/chat/completions``) probes with ``max_tokens: 1``; ``overhead`` then holds
  the template and special tokens.

Apply the ratio with ``load_workload(..., overrides=cal.overrides())`` (spec field
``tokens.ratio``): targets are then built as round(n / ratio) tokenizer tokens, so
the endpoint sees about n. The requested-vs-reported gap is still recorded per
request; calibration narrows it, never hides it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import numpy as np
import orjson

from loadgen.client.endpoint import endpoint_label, endpoint_path
from loadgen.client.endpoint_options import EndpointOptions
from loadgen.errors import EndpointError
from loadgen.workload.text import rng
from loadgen.workload.tokenizer import Tokenizer, get_tokenizer

__all__ = ["Calibration", "calibrate", "fit"]

_TAG_PROBE = 0xCA1
DEFAULT_LENGTHS = (64, 256, 1024)


@dataclass(frozen=True)
class Calibration:
    method: str  # "tokenize", "usage:completions" or "usage:chat"
    ratio: float  # endpoint tokens per tokenizer token
    overhead: float  # endpoint tokens per request independent of the text
    samples: tuple[tuple[int, int], ...]  # (expected, reported) per probe
    tokenizer: str

    def overrides(self) -> dict[str, Any]:
        return {"tokens.ratio": self.ratio}

    def describe(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "ratio": self.ratio,
            "overhead": self.overhead,
            "samples": [list(s) for s in self.samples],
            "tokenizer": self.tokenizer,
        }


def fit(samples: list[tuple[int, int]]) -> tuple[float, float]:
    """(ratio, overhead) by least squares; one sample gives a plain ratio."""
    x = np.asarray([s[0] for s in samples], dtype=np.float64)
    y = np.asarray([s[1] for s in samples], dtype=np.float64)
    if len(samples) < 2 or np.ptp(x) == 0:
        return float(y.sum() / x.sum()), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def _root(base_url: str) -> str:
    """The server's root (``/tokenize`` lives there, not under ``/v1``), its query kept."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    return urlunsplit(parts._replace(path=path[: -len("/v1")] if path.endswith("/v1") else path))


class _Conn(NamedTuple):
    """One calibration's session, with the headers and endpoint options of each request."""

    http: aiohttp.ClientSession
    headers: dict[str, str]
    options: EndpointOptions


async def _post(conn: _Conn, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    try:
        kwargs = conn.options.request_kwargs(url)
        async with conn.http.post(url, data=orjson.dumps(body), headers=conn.headers, **kwargs) as resp:
            raw = await resp.read()
            if resp.status != 200:
                return resp.status, None
            return 200, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return 200, None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise EndpointError(f"calibration: cannot reach {url}: {type(e).__name__}: {e}") from None


def _tokenize_count(data: Any) -> int | None:
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("count"), int):
        return int(data["count"])
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


def _usage_count(data: Any) -> int | None:
    try:
        n = data["usage"]["prompt_tokens"]
    except (KeyError, TypeError):
        return None
    return int(n) if isinstance(n, int) else None


async def _discover(conn: _Conn, base: str) -> str | None:
    try:
        url = endpoint_path(base, "/models")
        async with conn.http.get(url, headers=conn.headers, **conn.options.request_kwargs(url)) as resp:
            if resp.status == 200:
                return str(orjson.loads(await resp.read())["data"][0]["id"])
    except (
        aiohttp.ClientError,
        asyncio.TimeoutError,
        OSError,
        orjson.JSONDecodeError,
        KeyError,
        IndexError,
        TypeError,
    ):
        pass
    return None


async def calibrate(
    base_url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    tokenizer: Tokenizer | str | None = None,
    lengths: tuple[int, ...] = DEFAULT_LENGTHS,
    seed: int = 0,
    timeout_s: float = 60.0,
    http_options: EndpointOptions | None = None,
) -> Calibration:
    """Probe ``base_url`` (an OpenAI base URL, ``http://host:port/v1``); see module doc. The
    endpoint options (headers, the key's header, TLS, proxies) are the run's, as for its traffic."""
    options = http_options if http_options is not None else EndpointOptions()
    tok = get_tokenizer(tokenizer)
    headers = {"Content-Type": "application/json", **options.request_headers(api_key)}
    probes = [(n, tok.words(n, rng(seed, _TAG_PROBE, n))) for n in lengths]
    expected = [tok.count(text) for _, text in probes]
    async with options.session(timeout_s) as http:
        conn = _Conn(http, headers, options)
        if model is None:
            model = await _discover(conn, base_url)
        with_model = {"model": model} if model else {}
        counts = await _tokenize_probes(conn, base_url, with_model, probes)
        method = "tokenize"
        if counts is None:
            counts, method = await _usage_probes(conn, base_url, with_model, probes)
    samples = list(zip(expected, counts, strict=True))
    ratio, overhead = fit(samples)
    return Calibration(
        method=method, ratio=ratio, overhead=overhead, samples=tuple(samples), tokenizer=getattr(tok, "name", "custom")
    )


async def _tokenize_probes(
    conn: _Conn, base_url: str, with_model: dict[str, Any], probes: list[tuple[int, str]]
) -> list[int] | None:
    """Exact counts from ``/tokenize``, or None when the server has none (or one probe fails)."""
    counts: list[int] = []
    for _, text in probes:
        # vLLM reads "prompt", llama.cpp "content"; both ignore the other.
        status, data = await _post(
            conn,
            endpoint_path(_root(base_url), "/tokenize"),
            {**with_model, "prompt": text, "content": text, "add_special_tokens": False},
        )
        n = _tokenize_count(data) if status == 200 else None
        if n is None:
            return None
        counts.append(n)
    return counts


async def _usage_probes(
    conn: _Conn, base_url: str, with_model: dict[str, Any], probes: list[tuple[int, str]]
) -> tuple[list[int], str]:
    base = endpoint_label(base_url)  # for the message: never the query (it may hold a key)
    last = 0
    for api, path in (("completions", "/completions"), ("chat", "/chat/completions")):
        counts: list[int] = []
        for _, text in probes:
            body: dict[str, Any] = {**with_model, "max_tokens": 1, "stream": False}
            if api == "chat":
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
            last, data = await _post(conn, endpoint_path(base_url, path), body)
            n = _usage_count(data) if last == 200 else None
            if n is None:
                break
            counts.append(n)
        if len(counts) == len(probes):
            return counts, f"usage:{api}"
    raise EndpointError(
        f"calibration: {base} has no /tokenize and reported no usage.prompt_tokens (last HTTP status {last})"
    )
