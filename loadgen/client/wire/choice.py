"""Which transport carries a run's requests to one endpoint, and why when it is not the one asked for.

``--transport lean`` (the default) is loadgen's own HTTP/1.1 (wire/transport.py);
``--transport aiohttp`` is aiohttp's client (client/aiohttp_transport.py). The lean wire does
not speak HTTP proxies: where the environment names one for the endpoint (``HTTPS_PROXY`` /
``HTTP_PROXY``, unless ``NO_PROXY`` exempts it: ``EndpointOptions.proxy_for``), the run falls
back to aiohttp, which does, and run.json says so (``transport``, ``transport_fallback``).
Why fall back rather than refuse: the proxy is the environment's, not a flag of the run, and
the measurement is still sound through aiohttp (its fast path stamps reads the same way); a
refusal would break every run in a proxied CI for no gain in truth.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

from loadgen.client.aiohttp_transport import AiohttpTransport
from loadgen.client.config import EngineConfig
from loadgen.client.transport import Transport
from loadgen.client.wire.transport import LeanTransport

__all__ = ["WireChoice", "transport_for", "wire_json"]


class WireChoice(NamedTuple):
    """The transport a run sends through, its name, and why it is not the one asked for."""

    transport: Transport
    name: str  # "lean" | "aiohttp" (or the class name of one given by the caller)
    fallback: str = ""  # why not the asked one ("": as asked)


def transport_for(config: EngineConfig, url: str | None = None) -> WireChoice:
    """The transport for ``url`` (default: the config's request URL) as ``config.transport`` asks,
    or aiohttp where a proxy applies (module doc)."""
    target = url if url is not None else config.request_url
    fallback = ""
    if config.transport == "lean" and config.http.proxy_for(target) is not None:
        var = "HTTPS_PROXY" if urlsplit(target).scheme == "https" else "HTTP_PROXY"
        fallback = f"the environment's {var} applies to the endpoint, and the lean wire does not speak proxies"
    if config.transport == "lean" and not fallback:
        return WireChoice(LeanTransport(target, connect_timeout_s=config.timeouts.connect, http=config.http), "lean")
    aio = AiohttpTransport(
        target, connect_timeout_s=config.timeouts.connect, read_bufsize=config.read_bufsize, http=config.http
    )
    return WireChoice(aio, "aiohttp", fallback)


def wire_json(choice: WireChoice | None, transport: Transport) -> dict[str, str]:
    """What run.json's client section says of the wire: the transport that ran, and why it is
    not the one asked for (``""``: as asked). A transport the caller gave is named by its class."""
    if choice is None:
        return {"transport": type(transport).__name__, "transport_fallback": ""}
    return {"transport": choice.name, "transport_fallback": choice.fallback}
