"""The flags of how requests reach an endpoint, shared by ``run``, ``sweep`` and ``check``.

``-H/--header 'Name: value'`` (repeatable; a value ``env:NAME`` or ``file:PATH`` is read
once, here), ``--api-key-header NAME``, ``--ca-bundle``, ``--client-cert`` / ``--client-key``
and ``--insecure`` become one ``EndpointOptions`` (client.endpoint_options), which every
sender of the command uses. A missing variable or file, a bad header name, a value with a
line break: one line and exit code 2, before anything is started or sent. ``--insecure``
prints a warning (and run.json's settings say ``"insecure": true``).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadgen.client.endpoint_options import EndpointOptions

__all__ = ["add_endpoint_options", "add_transport_option", "endpoint_options_of", "warn_insecure", "INSECURE_WARNING"]

INSECURE_WARNING = (
    "loadgen: warning: --insecure: the endpoint's TLS certificate is not verified "
    "(anyone on the path can read and change the traffic)"
)


def add_endpoint_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("endpoint access (headers, TLS; proxies from HTTPS_PROXY, HTTP_PROXY, NO_PROXY)")
    g.add_argument(
        "-H",
        "--header",
        dest="headers",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="send this header with every request (repeatable); VALUE may be env:VAR or file:PATH, "
        "read once at the start; every value is treated as a secret and never written",
    )
    g.add_argument(
        "--api-key-header",
        default=None,
        metavar="NAME",
        help="send the API key as 'NAME: key' (e.g. api-key for Azure OpenAI) (default: 'Authorization: Bearer key')",
    )
    g.add_argument(
        "--ca-bundle",
        default=None,
        metavar="PATH",
        help="trust this CA file (PEM) besides the system's (default: the system's CAs only)",
    )
    g.add_argument(
        "--client-cert",
        default=None,
        metavar="PATH",
        help="client certificate (PEM) for mutual TLS (default: none sent)",
    )
    g.add_argument(
        "--client-key", default=None, metavar="PATH", help="the client certificate's key (default: in --client-cert)"
    )
    g.add_argument(
        "--insecure", action="store_true", help="do not verify the endpoint's TLS certificate (a lab endpoint only)"
    )


def add_transport_option(p: argparse.ArgumentParser) -> None:
    """``--transport``: the wire a run's measured requests go through (run and sweep; not ``check``)."""
    p.add_argument(
        "--transport",
        choices=("lean", "aiohttp"),
        default="lean",
        help="the HTTP client of the measured requests: loadgen's own HTTP/1.1 (lean) or aiohttp's; "
        "where an HTTP(S) proxy applies, lean falls back to aiohttp and run.json says why (default: %(default)s)",
    )


def endpoint_options_of(args: argparse.Namespace) -> EndpointOptions:
    """The command's ``EndpointOptions`` (header values read from their variables and files now)."""
    from loadgen.client.endpoint_options import EndpointOptions, parse_header

    return EndpointOptions(
        headers=tuple(parse_header(h) for h in getattr(args, "headers", None) or ()),
        api_key_header=getattr(args, "api_key_header", None),
        ca_bundle=getattr(args, "ca_bundle", None),
        client_cert=getattr(args, "client_cert", None),
        client_key=getattr(args, "client_key", None),
        insecure=bool(getattr(args, "insecure", False)),
    )


def warn_insecure(options: EndpointOptions) -> None:
    """The warning line ``--insecure`` prints (on stderr), once per command."""
    if options.insecure:
        print(INSECURE_WARNING, file=sys.stderr)
