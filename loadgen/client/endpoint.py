"""How an endpoint's URL may be written down: never with credentials or a query."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["endpoint_label"]


def endpoint_label(url: str) -> str:
    """The URL without user info, query or fragment (they can carry secrets)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
