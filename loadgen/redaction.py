"""Secrets a run holds, and their removal from every text loadgen writes.

A run knows its secrets: the API key, every ``--header`` value, and the credentials in
the endpoint URL (user info, and query parameters whose names say they carry a secret).
An endpoint may send any of them back (an error body echoing the Authorization header, a
redirect URL, a base64 dump of the request), so every text bound for a record, a file, a
log or the terminal passes through ``Secrets.redact`` first. Each secret is searched in
the forms it travels in: raw, URL-encoded, and base64 (standard and URL-safe, of the
value alone, of its ``Bearer`` header, and of the value at any position inside a longer
base64 text, whose alignment changes the characters).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

__all__ = ["REDACTED", "Secrets", "url_secrets", "secret_query_name"]

REDACTED = "[REDACTED]"
_MIN_FORM = 6  # shorter forms would match ordinary text
# Key-like tokens redacted even when the run was not told of them.
_KEYLIKE = re.compile(r"(sk-|Bearer\s+|Basic\s+)[A-Za-z0-9_\-.+/=]{6,}")
_SECRET_NAMES = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session", re.IGNORECASE)


def secret_query_name(name: str) -> bool:
    """Whether a URL query parameter's name says its value is a secret (``api-key``, ``sig``, ...)."""
    return bool(_SECRET_NAMES.search(name))


def url_secrets(url: str) -> tuple[str, ...]:
    """The credentials written in an endpoint URL: user, password, secret query values."""
    try:
        parts = urlsplit(url)
        found = [parts.username or "", parts.password or ""]
    except ValueError:  # not a URL (an unclosed IPv6 bracket...): the flag's own check says so
        return ()
    found += [v for k, v in parse_qsl(parts.query, keep_blank_values=False) if secret_query_name(k)]
    return tuple(s for s in found if s)


def _b64_forms(raw: bytes) -> set[str]:
    """``raw`` in base64 at each of the three alignments it can take inside a longer text."""
    forms: set[str] = set()
    for shift in range(3):
        enc = base64.b64encode(b"\0" * shift + raw).decode()
        start = 4 if shift else 0  # the first group mixes in what came before
        end = 4 * ((shift + len(raw)) // 3)  # a last partial group mixes in what comes after
        core = enc[start:end]
        forms.update({core, core.replace("+", "-").replace("/", "_")})
    return forms


def _forms(secret: str) -> set[str]:
    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote_plus(secret), quote(secret)}
    for text in (raw, b"Bearer " + raw):
        full = base64.b64encode(text).decode()
        forms.update({full, full.rstrip("="), base64.urlsafe_b64encode(text).decode().rstrip("=")})
    forms |= _b64_forms(raw)
    return {f for f in forms if len(f) >= _MIN_FORM}


@dataclass(frozen=True)
class Secrets:
    """The secrets of one run; ``redact`` removes each of them, in each form, from a text."""

    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        forms: set[str] = set()
        for v in self.values:
            if v:
                forms |= _forms(v)
        # longest first, so a form is never half-replaced by a shorter one inside it
        pattern = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
        object.__setattr__(self, "_pattern", re.compile(pattern) if pattern else None)

    @classmethod
    def of(
        cls,
        *,
        api_key: str | None = None,
        headers: Iterable[str] = (),
        url: str | None = None,
        urls: Iterable[str] = (),
    ) -> Secrets:
        """The secrets of a run: its key, its extra header values, the credentials in its URLs
        (``url``, and ``urls``: a pipeline's stage endpoints)."""
        values = [api_key or "", *headers, *(s for u in (url, *urls) if u for s in url_secrets(u))]
        return cls(tuple(dict.fromkeys(v for v in values if v)))

    def __bool__(self) -> bool:
        return bool(self.values)

    def redact(self, text: str) -> str:
        """``text`` with every known secret (any form) and every key-like token replaced."""
        pattern: re.Pattern[str] | None = getattr(self, "_pattern")  # noqa: B009 - set in __post_init__
        if pattern is not None:
            text = pattern.sub(REDACTED, text)
        return _KEYLIKE.sub(lambda m: m.group(1) + REDACTED, text)

    def redact_bytes(self, data: bytes) -> bytes:
        """``data`` (a file's bytes, UTF-8 or not) with every secret removed."""
        return self.redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
