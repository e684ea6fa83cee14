"""The endpoint as loadgen writes it down and asks it things: never with credentials, never unbounded.

``endpoint_label`` is the URL as every file and terminal line shows it (no user info,
query or fragment: they can carry secrets). ``discover_model`` asks ``/v1/models``
which model to send to, reading at most ``MODELS_CAP_BYTES`` within a total timeout
(an endless or huge body is refused, not buffered), and cleans the id it keeps;
``fetch_models`` is that request (with the run's ``EndpointOptions``: headers, TLS, proxy),
which the preflight also asks, and ``model_ids`` every id its answer lists.

Importing this module imports nothing heavy (client.settings uses the label).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from loadgen.client.endpoint_options import EndpointOptions
from loadgen.errors import EndpointError
from loadgen.redaction import Secrets
from loadgen.untrusted import clean_text

__all__ = [
    "endpoint_label",
    "endpoint_path",
    "discover_model",
    "fetch_models",
    "model_ids",
    "parse_models",
    "MODELS_CAP_BYTES",
    "MODELS_TIMEOUT_S",
]

MODELS_CAP_BYTES = 1 << 20  # a list of models is kilobytes; 1 MiB is already absurd
MODELS_TIMEOUT_S = 10.0  # the whole request, body included


def endpoint_label(url: str) -> str:
    """The URL without user info, query or fragment (they can carry secrets)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # not a port: left out rather than shown raw
        port = None
    netloc = host + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def endpoint_path(url: str, path: str) -> str:
    """``url`` with ``path`` appended to its path, its query kept (``?api-version=...`` endpoints)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + path, parts.query, ""))


def model_ids(body: bytes) -> list[str]:
    """The model ids a ``/v1/models`` body lists, cleaned, in its order (none usable: empty)."""
    import orjson

    try:
        data: Any = orjson.loads(body)
        listed = data["data"]
    except (KeyError, TypeError, orjson.JSONDecodeError):
        return []
    if not isinstance(listed, list):
        return []
    ids = [m.get("id") for m in listed if isinstance(m, dict)]
    return [m for m in (clean_text(i) for i in ids if isinstance(i, str)) if m.strip()]


def parse_models(body: bytes, where: str) -> str:
    """The first model id a ``/v1/models`` body lists, cleaned; else an EndpointError naming ``where``."""
    import orjson

    try:
        data: Any = orjson.loads(body)
        first = data["data"][0]["id"]
    except (KeyError, IndexError, TypeError, orjson.JSONDecodeError):
        raise EndpointError(f"{where} listed no model; pass --model") from None
    model = clean_text(first) if isinstance(first, str) else ""
    if not model.strip():
        raise EndpointError(f"{where} listed a model with no usable name; pass --model")
    return model


async def fetch_models(
    url: str,
    api_key: str | None,
    timeout_s: float = MODELS_TIMEOUT_S,
    *,
    http: EndpointOptions | None = None,
    secrets: Secrets | None = None,
    cap_bytes: int = MODELS_CAP_BYTES,
) -> tuple[int, bytes]:
    """``GET /models`` (the endpoint's query kept) with the run's headers, TLS and proxy: its
    status and body (at most ``cap_bytes``, within ``timeout_s``); an EndpointError when the
    endpoint cannot be reached, or sends too much."""
    import asyncio

    import aiohttp

    http = http if http is not None else EndpointOptions()
    secrets = secrets if secrets is not None else Secrets.of(api_key=api_key, headers=http.secret_values(), url=url)
    where = f"{endpoint_label(url)}/models"
    target = endpoint_path(url, "/models")
    headers = {**http.request_headers(api_key), "Accept-Encoding": "identity"}
    try:
        async with http.session(timeout_s) as session:
            async with session.get(target, headers=headers, **http.request_kwargs(target)) as resp:
                body = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > cap_bytes:
                        raise EndpointError(f"{where} sent more than {cap_bytes:,} bytes; pass --model")
                return resp.status, bytes(body)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        detail = clean_text(secrets.redact(f"{type(e).__name__}: {e}"))
        raise EndpointError(f"cannot reach {endpoint_label(url)}: {detail}") from None


async def discover_model(
    url: str,
    api_key: str | None,
    timeout_s: float = MODELS_TIMEOUT_S,
    *,
    http: EndpointOptions | None = None,
    secrets: Secrets | None = None,
    cap_bytes: int = MODELS_CAP_BYTES,
) -> str:
    """The first model ``/v1/models`` lists, for runs not told which model to ask for."""
    status, body = await fetch_models(url, api_key, timeout_s, http=http, secrets=secrets, cap_bytes=cap_bytes)
    where = f"{endpoint_label(url)}/models"
    if status != 200:
        raise EndpointError(f"{where} answered HTTP {status}; pass --model")
    return parse_models(body, where)
