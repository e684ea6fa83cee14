"""The HTTP client of ``loadgen check``: its options, its session, and one exchange.

Each exchange reads its body up to a cap, under the check's timeout, and a request that a
server dropped unanswered on a reused keep-alive connection is sent again, as the engine does
(``Checker.request``); every text made of what the endpoint sent has the check's secrets
removed and is cleaned before it becomes evidence (``CheckClient.text``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import aiohttp

from loadgen.client.endpoint_options import EndpointOptions
from loadgen.conformance.exchange import Wire
from loadgen.redaction import Secrets
from loadgen.untrusted import clean_text
from loadgen.workload.tokenizer import Tokenizer

__all__ = ["CheckOptions", "CheckClient", "check_session", "MAX_STREAM", "MAX_BODY"]

MAX_STREAM = 16 << 20  # a streamed answer of a few dozen tokens is a few KiB
MAX_BODY = 4 << 20  # a non-streamed answer, an error, /v1/models (hundreds of models fit)
_STALE_RETRIES = 8  # each failed try drops one dead pooled connection; a fresh one ends it


@dataclass(frozen=True)
class CheckOptions:
    """What to check and how long to wait; ``url`` is the OpenAI base URL (…/v1)."""

    url: str
    model: str | None = None
    api_key: str | None = None
    tokenizer: Tokenizer | None = None
    timeout_s: float = 60.0
    streams: int = 8
    max_tokens: int = 64
    context_len: int | None = None  # for the over-long prompt; else asked of the endpoint
    strict: bool = False  # a WARN fails the check too
    api: str = "chat"  # "chat": the chat and completions battery; "responses": check_responses's
    http: EndpointOptions = field(default_factory=EndpointOptions)  # headers, key header, TLS, proxy

    @property
    def secrets(self) -> Secrets:
        """The check's secrets: its API key, its header values and the credentials in its URL."""
        return self.http.secrets(self.api_key, self.url)


class CheckClient:
    """One endpoint's exchanges for the check: requests with the check's headers, read under a cap."""

    def __init__(self, opts: CheckOptions, http: aiohttp.ClientSession) -> None:
        self.o = opts
        self.http = http
        self.secrets = opts.secrets

    def text(self, value: object, limit: int = 160) -> str:
        """Endpoint text as evidence: the check's secrets removed, then one clean line."""
        return clean_text(self.secrets.redact(str(value)), limit)

    # -- wire ---------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        h.update(self.o.http.request_headers(self.o.api_key))
        return h

    async def request(self, method: str, url: str, body: bytes | None = None, *, cap: int = MAX_BODY) -> Wire:
        """One exchange, its body read up to ``cap`` bytes. The stale keep-alive race is handled
        as the engine handles it: a server that closed an idle pooled connection as the request
        went out on it answered nothing, so the request is sent again (on a fresh connection
        once the dead pooled ones are used up)."""
        for _ in range(_STALE_RETRIES):
            w, stale = await self._exchange(method, url, body, cap)
            if not stale:
                break
        return w

    async def _exchange(self, method: str, url: str, body: bytes | None, cap: int) -> tuple[Wire, bool]:
        """The exchange, and whether it failed unanswered on a reused connection (worth resending)."""
        w = Wire(t_sent=time.perf_counter_ns(), secrets=self.secrets)
        ctx = SimpleNamespace(reused=False)
        stale = False
        try:
            async with self.http.request(
                method,
                url,
                data=body,
                headers=self._headers(),
                trace_request_ctx=ctx,
                **self.o.http.request_kwargs(url),
            ) as resp:
                w.status, w.content_type = resp.status, resp.headers.get("Content-Type", "")
                w.content_encoding = resp.headers.get("Content-Encoding", "")
                size = 0
                async for data in resp.content.iter_any():
                    w.reads.append((time.perf_counter_ns(), data))
                    size += len(data)
                    if size > cap:
                        w.error = f"answer longer than {cap >> 20} MiB; stopped reading"
                        break
        except asyncio.TimeoutError:
            w.error = f"no complete answer within {self.o.timeout_s:g} s"
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
            stale = ctx.reused and w.status is None
            w.error = f"{type(e).__name__}: {self.text(e)}"
        except (aiohttp.ClientError, OSError, ValueError) as e:  # ValueError: a key and URL credentials both
            w.error = f"{type(e).__name__}: {self.text(e)}"
        w.t_done = time.perf_counter_ns()
        return w, stale


def check_session(opts: CheckOptions) -> aiohttp.ClientSession:
    """The check's HTTP session: a request's timeout, a pool for the concurrent streams, and
    the tracing that tells ``Checker.request`` a request went out on a reused connection."""

    async def reused(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
        if isinstance(ctx.trace_request_ctx, SimpleNamespace):
            ctx.trace_request_ctx.reused = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(reused)
    timeout = aiohttp.ClientTimeout(total=opts.timeout_s, sock_connect=min(10.0, opts.timeout_s))
    connector = aiohttp.TCPConnector(limit=4 * opts.streams + 16, ssl=opts.http.ssl_context())
    return aiohttp.ClientSession(timeout=timeout, connector=connector, read_bufsize=1 << 20, trace_configs=[trace])
