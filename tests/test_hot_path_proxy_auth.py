"""A proxy URL with credentials: they reach the proxy as ``Proxy-Authorization``, with no use of
aiohttp's deprecated ``BasicAuth`` (a DeprecationWarning, an error under the tests' filter).

The proxy is a loopback server that notes the head of what it is sent and answers it itself.
"""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest

from loadgen.client.endpoint_options import EndpointOptions


async def _through_proxy(
    monkeypatch: pytest.MonkeyPatch, userinfo: str, scheme: str = "http"
) -> tuple[bytes, bytes | None]:
    """The head the proxy got for a GET of an endpoint URL of ``scheme``, and the body the
    client read (None for HTTPS: the proxy refuses the tunnel, the CONNECT is what counts)."""
    heads: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        status = b"200 OK" if scheme == "http" else b"403 Forbidden"
        writer.write(b"HTTP/1.1 %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok" % status)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    for name in (f"{scheme.upper()}_PROXY", f"{scheme}_proxy"):
        monkeypatch.setenv(name, f"http://{userinfo}127.0.0.1:{port}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    url = f"{scheme}://endpoint.invalid/v1/models"
    options = EndpointOptions()
    body = None
    try:
        async with options.session(5.0) as session:
            if scheme == "http":
                async with session.get(url, headers={"X-A": "1"}, **options.request_kwargs(url)) as resp:
                    body = await resp.read()
            else:
                with pytest.raises(aiohttp.ClientHttpProxyError):
                    await session.get(url, headers={"X-A": "1"}, **options.request_kwargs(url))
    finally:
        server.close()
        await server.wait_closed()
    return heads[0], body


def test_a_proxys_credentials_go_as_proxy_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    head, body = asyncio.run(_through_proxy(monkeypatch, "agent:s%40cret@"))
    assert body == b"ok"
    expected = base64.b64encode(b"agent:s@cret").decode()  # the password unquoted, as sent
    lines = head.decode().split("\r\n")
    assert lines[0] == "GET http://endpoint.invalid/v1/models HTTP/1.1"
    assert f"Proxy-Authorization: Basic {expected}" in lines
    assert not any(line.lower().startswith("authorization:") for line in lines)  # the endpoint gets none
    assert aiohttp.encode_basic_auth("agent", "s@cret") == f"Basic {expected}"


def test_a_proxy_without_credentials_gets_no_proxy_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    head, body = asyncio.run(_through_proxy(monkeypatch, ""))
    assert body == b"ok" and b"proxy-authorization" not in head.lower()


def test_an_https_endpoints_tunnel_is_asked_for_with_the_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    head, _ = asyncio.run(_through_proxy(monkeypatch, "agent:s%40cret@", "https"))
    lines = head.decode().split("\r\n")
    assert lines[0] == "CONNECT endpoint.invalid:443 HTTP/1.1"
    assert f"Proxy-Authorization: Basic {base64.b64encode(b'agent:s@cret').decode()}" in lines
