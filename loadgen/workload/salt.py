"""A run's prompt salt: what keeps one run from finding another's prompts in a prefix cache.

A prefix cache (vLLM's, SGLang's, the simulator's) serves a prompt's leading tokens from
memory when an earlier request sent the same ones; a rerun of the same workload against the
same server would then see most of its prompt cached, and its TTFT would win a bake-off it
did not earn. So every run (and sweep) draws a fresh salt by default, and every prompt of the
run starts with text derived from it (``TextSource.salt_text``, ``SyntheticChat``): the
salt is a common prefix of every prompt of the run, so the workload's own reuse within the
run (a shared system prompt, RAG documents, a conversation's history) is unchanged, while
nothing an earlier run sent can match.

``--salt S`` replays a run's exact bytes (its run.json records the salt it drew); ``--salt
none`` sends the prompts unsalted, for a user who measures a warm cache on purpose. run.json
says which of the three it was (``Salt.json``).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from loadgen.errors import ConfigError

__all__ = ["Salt", "SaltSource", "new_salt", "resolve_salt", "salt_of", "SALT_OFF"]

SaltSource: TypeAlias = Literal["fresh", "given", "off"]
SALT_OFF = "none"  # ``--salt none``: no salt, on purpose
_HEX_CHARS = 6  # 16.7 million salts: two runs that drew the same one would be a 1-in-16-million accident
_VALID = re.compile(r"[A-Za-z0-9]{1,32}")  # one word: it goes into prompts as it is


@dataclass(frozen=True)
class Salt:
    """The salt a run's prompts carry (``text``; empty when off) and where it came from."""

    text: str
    source: SaltSource

    def json(self) -> dict[str, str | None]:
        """What run.json records: ``salt`` (null when off) and ``salt_source``."""
        return {"salt": self.text or None, "salt_source": self.source}


def new_salt() -> str:
    """A fresh random salt: 6 hex characters."""
    return secrets.token_hex(_HEX_CHARS // 2)


def resolve_salt(value: str | None) -> Salt:
    """``--salt``'s value: absent, a fresh salt; ``none``, no salt; else that salt (to replay a run)."""
    if value is None:
        return Salt(new_salt(), "fresh")
    if value.strip().lower() in (SALT_OFF, "off"):
        return Salt("", "off")
    if not _VALID.fullmatch(value):
        raise ConfigError(
            f"--salt {value!r}: give 1 to 32 letters or digits (a run's recorded salt), "
            f"or '{SALT_OFF}' to send the prompts unsalted"
        )
    return Salt(value, "given")


def salt_of(described: Mapping[str, Any]) -> Salt:
    """The salt of a workload its caller built (from its ``describe()``), for run.json: given, or off."""
    text = described.get("salt")
    return Salt(text, "given") if isinstance(text, str) and text else Salt("", "off")
