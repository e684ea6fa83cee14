"""The secrets a command was given, to be redacted from everything it prints and writes.

Its API key (from ``--api-key-env NAME`` where the command has that flag, else
``$OPENAI_API_KEY``) and the credentials written in its endpoint URL (``--endpoint``, else
``$OPENAI_BASE_URL``), and every ``-H/--header`` value (read from its ``env:`` variable or
``file:`` where it says so; one that cannot be read is no secret of the command).
Commands that only read run folders (``gate``, ``compare``) have
neither flag: the environment's key still counts, since an endpoint may have echoed it into
a run's error texts.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

from loadgen.redaction import Secrets

__all__ = ["secrets_of"]


def secrets_of(args: argparse.Namespace) -> Secrets:
    """The secrets of the command ``args`` were parsed for (see the module docstring)."""
    key_env = getattr(args, "api_key_env", None)
    key = os.environ.get(key_env) if key_env else None
    url = getattr(args, "endpoint", None) or os.environ.get("OPENAI_BASE_URL")
    return Secrets.of(
        api_key=key or os.environ.get("OPENAI_API_KEY"),
        headers=_header_values(getattr(args, "headers", None) or ()),
        url=url if isinstance(url, str) else None,
    )


def _header_values(given: Iterable[str]) -> list[str]:
    """The value of each ``-H``: as given, or as read from its variable or file."""
    from loadgen.client.endpoint_options import parse_header
    from loadgen.errors import ConfigError

    values: list[str] = []
    for text in given:
        raw = text.partition(":")[2].strip()
        if not raw.startswith(("env:", "file:")):
            values.append(raw)  # even when the header is refused (a bad name): it was typed as a secret
            continue
        try:
            values.append(parse_header(text)[1])
        except ConfigError:
            pass
    return values
