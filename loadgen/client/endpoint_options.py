"""How every request reaches the endpoint: extra headers, the key's header, TLS and the proxy.

One ``EndpointOptions`` is shared by everything that sends (the engine's transport, the
model discovery and preflight, the usage probe, ``loadgen check``, the calibration), so
they all reach the endpoint the same way:

- ``headers``: each ``-H 'Name: value'`` (its value read once, at the start, from
  ``env:NAME`` or ``file:PATH`` when given so); every value is a secret (``secret_values``).
- ``api_key_header``: the key is sent as ``NAME: key`` (Azure OpenAI's ``api-key``) instead of
  ``Authorization: Bearer key``. An ``-H`` header of the same name wins over the key's.
- TLS: ``ca_bundle`` (a private CA, trusted besides the system's), ``client_cert`` /
  ``client_key`` (mutual TLS), ``insecure`` (no verification at all: a lab endpoint).
- the proxy: from the standard environment variables (``HTTPS_PROXY``, ``HTTP_PROXY``,
  ``NO_PROXY``, lowercase too), resolved once per sender (``proxy_for``) and given to each
  request, not looked up per request (aiohttp's ``trust_env`` asks a thread for it, and
  for ``~/.netrc``, on every request). ``proxies=False`` ignores them (the built-in simulator).

Plain data that pickles (the SSL context is built where it is used, ``ssl_context``), so a
worker process is given the same options; importing it imports nothing heavy (ssl, urllib.request
and aiohttp come when used). ``repr`` and ``json`` never show a header's value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from loadgen.errors import ConfigError
from loadgen.redaction import Secrets, url_secrets

if TYPE_CHECKING:
    import ssl

    import aiohttp

__all__ = ["EndpointOptions", "parse_header", "MAX_TOKENS_FIELDS", "HEADER_FILE_CAP_BYTES"]

MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens", "both")  # --max-tokens-field
HEADER_FILE_CAP_BYTES = 64 * 1024  # a token file is bytes to kilobytes
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP field name (RFC 9110 token)
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # CR, LF, NUL and other controls (tab is fine)


def _check_name(flag: str, name: str) -> str:
    if not _TOKEN.fullmatch(name):
        raise ConfigError(f"{flag} {name!r}: a header name is letters, digits and !#$%&'*+-.^_`|~ only")
    return name


def _check_value(flag: str, name: str, value: str) -> str:
    if _BAD_VALUE.search(value):
        raise ConfigError(f"{flag} {name}: its value holds a line break or another control character")
    return value


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` as given to ``-H``, the value read from ``env:NAME`` / ``file:PATH`` when
    it says so (a file's trailing newline dropped); a ConfigError naming the header, never its value."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not name:
        raise ConfigError("-H/--header: give 'Name: value' (value may be env:VAR or file:PATH)")
    _check_name("-H", name)
    if value.startswith("env:"):
        var = value[4:]
        got = os.environ.get(var)
        if not got:
            raise ConfigError(f"-H {name}: environment variable {var} is not set")
        value = got.strip()
    elif value.startswith("file:"):
        path = Path(value[5:]).expanduser()
        try:
            with path.open("rb") as f:
                data = f.read(HEADER_FILE_CAP_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"-H {name}: cannot read {path}: {e.strerror or type(e).__name__}") from None
        if len(data) > HEADER_FILE_CAP_BYTES:
            raise ConfigError(f"-H {name}: {path} is more than {HEADER_FILE_CAP_BYTES:,} bytes")
        try:
            value = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError(f"-H {name}: {path} is not UTF-8 text") from None
    return name, _check_value("-H", name, value)


def _readable(flag: str, path: str | None) -> None:
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"{flag} {path}: no such file")


@dataclass(frozen=True)
class EndpointOptions:
    """Headers, key header, TLS and proxy use of every request to one endpoint (module doc)."""

    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    api_key_header: str | None = None  # None: Authorization: Bearer KEY
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    insecure: bool = False
    proxies: bool = True  # from the environment; False: never (the built-in simulator)

    def __post_init__(self) -> None:
        for name, value in self.headers:
            _check_value("-H", _check_name("-H", name), value)
        if self.api_key_header is not None:
            _check_name("--api-key-header", self.api_key_header)
        if self.client_key is not None and self.client_cert is None:
            raise ConfigError("--client-key needs --client-cert")
        _readable("--ca-bundle", self.ca_bundle)
        _readable("--client-cert", self.client_cert)
        _readable("--client-key", self.client_key)
        if self.ca_bundle or self.client_cert:
            self.ssl_context()  # a file that is no certificate is refused now, not at the first request

    def __repr__(self) -> str:
        return f"EndpointOptions({', '.join(f'{k}={v!r}' for k, v in self.json().items())})"

    def secret_values(self) -> tuple[str, ...]:
        """Every header value (each a secret, redacted everywhere: ``Secrets.of(headers=...)``)."""
        return tuple(v for _, v in self.headers if v)

    def request_headers(self, api_key: str | None) -> dict[str, str]:
        """The key's header (when there is a key) and every ``-H`` header, which win on a clash."""
        out: dict[str, str] = {}
        if api_key:
            if self.api_key_header:
                out[self.api_key_header] = api_key
            else:
                out["Authorization"] = f"Bearer {api_key}"
        given = {name.lower() for name, _ in self.headers}
        out = {k: v for k, v in out.items() if k.lower() not in given}
        out.update(self.headers)
        return out

    def ssl_context(self) -> ssl.SSLContext | bool:
        """What aiohttp's ``ssl=`` is given: True (verify against the system's CAs) unless a CA
        bundle, a client certificate or ``insecure`` asks for a context of their own."""
        if not (self.ca_bundle or self.client_cert or self.insecure):
            return True
        import ssl

        try:
            ctx = ssl.create_default_context()
            if self.ca_bundle:
                ctx.load_verify_locations(cafile=self.ca_bundle)
            if self.client_cert:
                ctx.load_cert_chain(self.client_cert, self.client_key)
        except (ssl.SSLError, OSError) as e:
            which = "--client-cert/--client-key" if self.client_cert else "--ca-bundle"
            raise ConfigError(f"{which}: not a usable certificate file ({e})") from None
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def proxy_for(self, url: str) -> str | None:
        """The proxy the environment names for ``url`` (None: go direct), ``NO_PROXY`` honoured."""
        if not self.proxies:
            return None
        from urllib.request import getproxies, proxy_bypass  # not at import time: http.client, email...

        parts = urlsplit(url)
        host = parts.hostname or ""
        proxy = getproxies().get(parts.scheme)
        if not proxy or (host and proxy_bypass(host)):
            return None
        return proxy

    def request_kwargs(self, url: str) -> dict[str, Any]:
        """aiohttp's per-request ``proxy`` for ``url``, credentials and all.

        A proxy's credentials stay in its URL's user info: aiohttp sends them from there as
        ``Proxy-Authorization`` (Basic, latin-1), on the request itself to a plain-HTTP
        endpoint and on the ``CONNECT`` to an HTTPS one, and never to the endpoint. Not as
        ``proxy_auth``: its ``BasicAuth`` is deprecated in aiohttp 3.14 (a warning, an error
        under the tests' filter); nor as ``proxy_headers``, which aiohttp sends on a
        ``CONNECT`` only, so a plain-HTTP endpoint's proxy would never see them."""
        return {} if (proxy := self.proxy_for(url)) is None else {"proxy": proxy}

    def session(self, timeout_s: float, *, connect_s: float | None = None, **kwargs: Any) -> aiohttp.ClientSession:
        """A short-lived aiohttp session (discovery, preflight, the usage probe, ``check``) that
        verifies TLS as these options say; each request also takes ``request_kwargs(url)``."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_s)
        connector = aiohttp.TCPConnector(ssl=self.ssl_context())
        return aiohttp.ClientSession(timeout=timeout, connector=connector, **kwargs)

    def proxy_secrets(self) -> tuple[str, ...]:
        """The credentials in the environment's proxy URLs (redacted like the key)."""
        if not self.proxies:
            return ()
        from urllib.request import getproxies

        return tuple(s for u in getproxies().values() for s in url_secrets(u))

    def secrets(self, api_key: str | None, url: str | None, stage_urls: Iterable[str] = ()) -> Secrets:
        """A run's secrets: its key, every header value, the proxy's and the URLs' credentials
        (``url``'s and a pipeline's ``stage_urls``')."""
        headers = (*self.secret_values(), *self.proxy_secrets())
        return Secrets.of(api_key=api_key, headers=headers, url=url, urls=stage_urls)

    def json(self) -> dict[str, Any]:
        """What run.json's settings keep: header names (never values), the TLS files, ``insecure``."""
        return {
            "headers": [name for name, _ in self.headers],
            "api_key_header": self.api_key_header,
            "ca_bundle": self.ca_bundle,
            "client_cert": self.client_cert,
            "client_key": self.client_key,
            "insecure": self.insecure,
        }
