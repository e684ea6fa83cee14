"""Per-chunk usage: does the endpoint put running usage on every chunk? One tiny request asks.

A chunk of a stream may carry several tokens (speculative decoding, a server that batches
its writes), and the final ``usage`` says only how many there were in all. vLLM's
``stream_options.continuous_usage_stats`` puts the running usage on every chunk, which gives
each chunk its exact count; a server that does not know the field refuses the request (an
HTTP 4xx) or ignores it. So before the schedule starts, ``detect`` sends one request that
asks for it: streaming, ``max_tokens`` 3, with the run's headers, key and extra body, bounded
in time (``PROBE_TIMEOUT_S``, and never longer than the run's own connect and first-byte
timeouts) and in the bytes it reads (``PROBE_CAP_BYTES``), and never a record of the run.
The first output chunk decides: usage on it, supported; none, not supported (the probe
reads the rest of the short answer, within the same bounds, so the server sees it end rather
than an abort). An HTTP 400-class answer refusing the body is not supported too;
one that says nothing of the field (401, 403, 404, 408, 429), a 5xx, a timeout or a broken
stream leaves it unknown, and the run does not ask.

What a probe found is remembered per endpoint (its URL without credentials, the model, the
API) for the process, so a sweep's points, or a script's runs, probe once. Not in a file:
the same URL may be a different server tomorrow (restarted with other flags, another
engine behind a proxy), a probe costs one short request, and a cache would be one more
file outside the run folder that a run's answer depends on.

``--per-chunk-usage on`` asks without probing, ``off`` never asks (``how: "flag"``, and
``supported`` unknown). run.json's ``per_chunk_usage`` holds ``PerChunkUsage.json()``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import orjson

from loadgen.client.config import api_path
from loadgen.client.endpoint import endpoint_label, endpoint_path
from loadgen.client.endpoint_options import EndpointOptions
from loadgen.client.protocol.sse import BadStream, SSEParser
from loadgen.client.settings import RunSettings
from loadgen.redaction import Secrets
from loadgen.untrusted import clean_text
from loadgen.workload.request_body import request_body
from loadgen.workload.session import Conversation, Turn

__all__ = [
    "PerChunkUsage",
    "detect",
    "probe_continuous_usage",
    "probe_body",
    "probe_headers",
    "resolved",
    "endpoint_key",
    "forget",
    "PROBE_MAX_TOKENS",
    "PROBE_TIMEOUT_S",
    "PROBE_CAP_BYTES",
    "PROBE_HEADER",
    "send_probe",
]

STREAMED_CHUNK_APIS = ("chat", "completions")  # the APIs whose chunks can carry running usage
PROBE_MAX_TOKENS = 3  # two output chunks at least, so running usage shows on one before the end
PROBE_TIMEOUT_S = 5.0  # the whole probe; an idle server answers a 3-token request in well under it
PROBE_CAP_BYTES = 64 * 1024  # a 3-token stream is a few hundred bytes
PROBE_PROMPT = "Say hello."
PROBE_HEADER = "X-Loadgen-Probe"  # on the probe's request only
# 4xx answers that are about the caller (key, model, rate), not about the body's fields
_NOT_ABOUT_THE_BODY = frozenset({401, 403, 404, 408, 429})
_DETAIL_BYTES = 2048  # of an answer that is not 200, this much is kept to say why (the preflight's line)

Key = tuple[str, str, str]
_REMEMBERED: dict[Key, bool] = {}


@dataclass(frozen=True)
class PerChunkUsage:
    """What a run decided about per-chunk usage: whether it asks (``asked``), how it decided
    (``how``: "probe", "flag", "remembered", "api" for an API without it, or "sim" for the
    built-in simulator's one-token chunks) and whether the
    endpoint offers it (``supported``; None when unknown: not probed, or the probe could not
    tell). ``why`` says what the probe saw."""

    asked: bool
    how: str
    supported: bool | None
    why: str = ""
    # the probe's HTTP status (None: not sent, or no answer) and, when not 200, its body's start
    # (cleaned, redacted): what the preflight's route check reads; not part of the decision
    status: int | None = field(default=None, compare=False)
    detail: str = field(default="", compare=False)

    def json(self) -> dict[str, Any]:
        """run.json's ``per_chunk_usage``."""
        return {"asked": self.asked, "how": self.how, "supported": self.supported}


def endpoint_key(url: str, model: str, api: str) -> Key:
    """What a probe's answer is remembered by: the URL without credentials, the model, the API."""
    return endpoint_label(url), model, api


def forget() -> None:
    """Forget every endpoint's answer (the next run probes again)."""
    _REMEMBERED.clear()


def resolved(settings: RunSettings, decision: PerChunkUsage) -> RunSettings:
    """``settings`` with ``per_chunk_usage`` resolved to "on" or "off" as ``decision`` says: what
    the engines (and worker processes) are configured from (``settings.engine_config``)."""
    return replace(settings, per_chunk_usage="on" if decision.asked else "off")


def detect(
    settings: RunSettings,
    url: str,
    model: str,
    *,
    api_key: str | None,
    run_id: str = "",
    secrets: Secrets | None = None,
) -> PerChunkUsage:
    """Decide whether a run asks for per-chunk usage: by its flag, by what this process
    remembers of the endpoint, else by a probe (``probe_continuous_usage``)."""
    mode = settings.per_chunk_usage
    if settings.api not in STREAMED_CHUNK_APIS:  # the Responses API, embeddings, rerank: nothing to ask for
        return PerChunkUsage(False, "api", None, f"the {settings.api} API has no per-chunk usage")
    if mode != "auto":
        return PerChunkUsage(mode == "on", "flag", None)
    key = endpoint_key(url, model, settings.api)
    if key in _REMEMBERED:
        known = _REMEMBERED[key]
        return PerChunkUsage(known, "remembered", known)
    answer = send_probe(settings, url, model, api_key=api_key, run_id=run_id, secrets=secrets)
    if answer.supported is not None:
        _REMEMBERED[key] = answer.supported
    return answer


def send_probe(
    settings: RunSettings,
    url: str,
    model: str,
    *,
    api_key: str | None,
    run_id: str = "",
    secrets: Secrets | None = None,
    continuous_usage: bool = True,
) -> PerChunkUsage:
    """Send the probe (asking for running usage unless told not to) with the run's endpoint
    options; what it found, its HTTP status and, when that is not 200, what the body said."""
    t = settings.timeouts
    http = settings.http
    secrets = secrets if secrets is not None else Secrets.of(api_key=api_key, headers=http.secret_values(), url=url)
    supported, why, status, detail = asyncio.run(
        _probe(
            endpoint_path(url, api_path(settings.api)),
            probe_body(settings, model, continuous_usage=continuous_usage),
            settings.api,
            headers=probe_headers(api_key, run_id, http),
            timeout_s=min(PROBE_TIMEOUT_S, t.connect + t.first_byte, t.total),
            connect_s=t.connect,
            cap_bytes=PROBE_CAP_BYTES,
            secrets=secrets,
            http=http,
        )
    )
    return PerChunkUsage(supported is True, "probe", supported, why, status, detail)


def probe_body(settings: RunSettings, model: str, *, continuous_usage: bool = True) -> bytes:
    """The probe's request: a one-line prompt, ``max_tokens`` 3, the run's extra body and
    ignore_eos (so it is a request the endpoint takes as it takes the run's), running usage asked."""
    conv = Conversation(None)
    conv.add_turn(Turn(text=PROBE_PROMPT, max_tokens=PROBE_MAX_TOKENS))
    return request_body(
        settings.api,
        model,
        conv,
        PROBE_MAX_TOKENS,
        ignore_eos=settings.ignore_eos,
        extra=settings.extra_body,
        continuous_usage=continuous_usage,
        max_tokens_field=settings.max_tokens_field,
    )


def probe_headers(api_key: str | None, run_id: str = "", http: EndpointOptions | None = None) -> dict[str, str]:
    """The engine's request headers, and a request id and ``X-Loadgen-Probe`` by which a server's
    log (or the simulator's ground truth) tells the probe from the run's requests. No
    ``X-Loadgen-Run`` / ``X-Loadgen-Seq``: the probe is no request of the schedule."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}
    headers[PROBE_HEADER] = "per-chunk-usage"
    headers.update((http if http is not None else EndpointOptions()).request_headers(api_key))
    if run_id:
        headers["X-Request-Id"] = f"{run_id}-usage-probe"
    return headers


async def probe_continuous_usage(
    url: str,
    body: bytes,
    api: str,
    *,
    headers: dict[str, str],
    timeout_s: float = PROBE_TIMEOUT_S,
    connect_s: float | None = None,
    cap_bytes: int = PROBE_CAP_BYTES,
    secrets: Secrets | None = None,
    http: EndpointOptions | None = None,
) -> tuple[bool | None, str]:
    """POST ``body`` to ``url`` (the full request URL) and read until the first output chunk:
    (True, why) when it carries usage, (False, why) when it does not or the body was refused
    (a 400-class answer), (None, why) when the answer cannot tell."""
    supported, why, _, _ = await _probe(
        url,
        body,
        api,
        headers=headers,
        timeout_s=timeout_s,
        connect_s=connect_s,
        cap_bytes=cap_bytes,
        secrets=secrets if secrets is not None else Secrets(),
        http=http if http is not None else EndpointOptions(),
    )
    return supported, why


async def _probe(
    url: str,
    body: bytes,
    api: str,
    *,
    headers: dict[str, str],
    timeout_s: float,
    connect_s: float | None,
    cap_bytes: int,
    secrets: Secrets,
    http: EndpointOptions,
) -> tuple[bool | None, str, int | None, str]:
    """``probe_continuous_usage``'s answer, the HTTP status and (not 200) the body's start."""
    connect = min(connect_s, timeout_s) if connect_s is not None else None
    try:
        async with http.session(timeout_s, connect_s=connect, skip_auto_headers=("User-Agent",)) as session:
            async with session.post(url, data=body, headers=headers, **http.request_kwargs(url)) as resp:
                if resp.status != 200:
                    refused = 400 <= resp.status < 500 and resp.status not in _NOT_ABOUT_THE_BODY
                    said = await resp.content.read(_DETAIL_BYTES)
                    detail = clean_text(secrets.redact(said.decode("utf-8", "replace")), 200)
                    return (False if refused else None), f"HTTP {resp.status}", resp.status, detail
                return (*await _first_output(resp.content, api, cap_bytes), 200, "")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, BadStream) as e:
        what = "timed out" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__}: {e}"
        return None, clean_text(secrets.redact(what), 200), None, ""


async def _first_output(content: aiohttp.StreamReader, api: str, cap_bytes: int) -> tuple[bool | None, str]:
    """Read events until one carries output; its usage decides."""
    parser = SSEParser(max_event_bytes=cap_bytes)
    read = 0
    async for data in content.iter_any():
        read += len(data)
        for payload in parser.feed(data):
            if (verdict := _judge(payload, api)) is not None:
                await _drain(content, cap_bytes - read)
                return verdict
        if read > cap_bytes:
            return None, f"no output chunk in the first {cap_bytes:,} bytes"
    for payload in parser.close():
        if (verdict := _judge(payload, api)) is not None:
            return verdict
    return None, "the stream ended without an output chunk"


async def _drain(content: aiohttp.StreamReader, cap_bytes: int) -> None:
    """Read the rest of the answer (a few more events), within the probe's bounds, so the server
    sees a request that ended rather than one the client left (an abort in its logs and metrics);
    whatever goes wrong now changes nothing that was decided."""
    try:
        async for data in content.iter_any():
            cap_bytes -= len(data)
            if cap_bytes < 0:
                return
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return


def _judge(payload: bytes, api: str) -> tuple[bool, str] | None:
    """None for an event without output (a role chunk, [DONE], a comment's neighbour); else
    whether this first output chunk carries running usage."""
    try:
        event: Any = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    choices = event.get("choices") if type(event) is dict else None
    if type(choices) is not list or not choices or type(choices[0]) is not dict:
        return None
    choice = choices[0]
    if api == "chat":
        delta = choice.get("delta")
        if type(delta) is not dict:
            return None
        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    else:
        text = choice.get("text")
    if not isinstance(text, str) or not text:
        return None
    usage = event.get("usage")
    if type(usage) is dict and type(usage.get("completion_tokens")) is int:
        return True, "the first output chunk carried usage"
    return False, "the first output chunk carried no usage"
