"""The secrets a command was given, to be redacted from everything it prints and writes.

Its API key (from ``--api-key-env NAME`` where the command has that flag, else
``$OPENAI_API_KEY``) and the credentials written in its endpoint URL (``--endpoint``, else
``$OPENAI_BASE_URL``). Commands that only read run folders (``gate``, ``compare``) have
neither flag: the environment's key still counts, since an endpoint may have echoed it into
a run's error texts.
"""

from __future__ import annotations

import argparse
import os

from loadgen.redaction import Secrets

__all__ = ["secrets_of"]


def secrets_of(args: argparse.Namespace) -> Secrets:
    """The secrets of the command ``args`` were parsed for (see the module docstring)."""
    key_env = getattr(args, "api_key_env", None)
    key = os.environ.get(key_env) if key_env else None
    url = getattr(args, "endpoint", None) or os.environ.get("OPENAI_BASE_URL")
    return Secrets.of(api_key=key or os.environ.get("OPENAI_API_KEY"), url=url if isinstance(url, str) else None)
