"""The usage a stream reports, range-checked, and the list of what was wrong with it.

Apart from the tally (tally.py) because it is the one place where the endpoint's own
numbers enter a record: ``prompt_tokens``, ``completion_tokens``, the cached prompt
tokens (``prompt_tokens_details.cached_tokens``), the reasoning tokens
(``completion_tokens_details.reasoning_tokens``), and the running usage that vLLM's
``continuous_usage_stats`` puts on every chunk. Each goes through
``loadgen.untrusted.token_count``: an impossible value (3000000000, -5, 2.5, "12",
true, NaN) is not kept (an earlier good value stays, else None, and the token count
falls back to what the chunks show) and becomes one line of ``Problems``. Running
usage that goes down keeps its highest value, which is also a problem.

Per chunk on a stream with running usage, so the common case (a whole number in
range) is decided inline before any call.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

from loadgen.untrusted import MAX_TOKEN_COUNT, clean_text, token_count

__all__ = ["Problems", "Usage"]

_MAX = MAX_TOKEN_COUNT
_PT = "usage.prompt_tokens"
_CACHED = "usage.prompt_tokens_details.cached_tokens"
_CT = "usage.completion_tokens"
_DOWN = "usage.down"
_THINK = "usage.completion_tokens_details.reasoning_tokens"


class Problems:
    """What one stream sent that was impossible or odd: ``lines``, one per kind of
    problem (the first seen), each ``clean_text``'d, so the list stays short however
    long the stream."""

    __slots__ = ("lines", "_kinds")

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._kinds: set[str] = set()

    def __contains__(self, kind: str) -> bool:
        return kind in self._kinds

    def flag(self, kind: str, message: str) -> None:
        """Note a problem, unless one of its ``kind`` was noted already."""
        if kind not in self._kinds:
            self._kinds.add(kind)
            self.lines.append(clean_text(message))

    def count(self, value: object, what: str) -> int | None:
        """A token count the endpoint sent, range-checked (``token_count``); an
        impossible one is None, and a problem of the kind ``what``."""
        if type(value) is int and 0 <= value <= _MAX:  # token_count's verdict on the common case
            return value
        n, why = token_count(value, what)
        if why is not None:
            self.flag(what, why)
        return n


class Usage:
    """A stream's usage so far, every count bounded, and what running usage says per chunk.

    ``take`` per chunk that has a ``usage``; the counts the tally reports are these
    attributes, and ``per_chunk`` and ``carry`` feed ``token_counts.reconcile``.
    """

    __slots__ = (
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "reasoning_tokens",
        "per_chunk",
        "carry",
        "_last",
        "_problems",
    )

    def __init__(self, problems: Problems) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.reasoning_tokens: int | None = None
        self.per_chunk = False  # an output chunk got its count from running usage
        self.carry = 0  # usage rise seen on chunks without output, owed to the next one
        self._last: int | None = None  # completion_tokens of the last usage seen
        self._problems = problems

    def take(self, usage: Any, chunks: Sized | None) -> int:
        """Record a chunk's usage; return the chunk's token count (1 unless running usage).

        ``chunks``: None for a chunk without output, else the times of the output
        chunks so far, this one's included (only its length is read, and only once).
        Running usage gives a chunk its exact count when there is a baseline: an
        earlier usage, or none needed because this is the first output chunk. A
        usage first seen on a later output chunk is a final total riding on the last
        chunk (some servers do that), not a running count.
        """
        if type(usage) is not dict:
            self._problems.flag("usage", f"usage is not an object ({clean_text(repr(usage)[:80], 40)})")
            return 1
        # Each count: Problems.count's common case (an int in range) inlined, as this
        # runs per chunk with running usage; anything else goes through it.
        n = usage.get("prompt_tokens")
        if type(n) is int and 0 <= n <= _MAX:
            self.prompt_tokens = n
        elif n is not None and (n := self._problems.count(n, _PT)) is not None:
            self.prompt_tokens = n
        details = usage.get("prompt_tokens_details")
        if details and type(details) is dict:
            n = details.get("cached_tokens")
            if type(n) is int and 0 <= n <= _MAX:
                self.cached_tokens = n
            elif n is not None and (n := self._problems.count(n, _CACHED)) is not None:
                self.cached_tokens = n
        details = usage.get("completion_tokens_details")
        if details and type(details) is dict:
            n = details.get("reasoning_tokens")
            if type(n) is int and 0 <= n <= _MAX:
                self.reasoning_tokens = n
            elif n is not None and (n := self._problems.count(n, _THINK)) is not None:
                self.reasoning_tokens = n
        ct = usage.get("completion_tokens")
        if not (type(ct) is int and 0 <= ct <= _MAX):
            if ct is None or (ct := self._problems.count(ct, _CT)) is None:
                return 1
        return self.rise(ct, chunks)

    def rise(self, ct: int, chunks: Sized | None) -> int:
        """``take``'s last step, for a chunk's ``completion_tokens`` ``ct`` (in range): the
        chunk's count (``chunks`` as for ``take``). The tally calls it directly for a chunk
        it read off a usage template (usage_template.py), whose usage is nothing but
        ``prompt_tokens`` and this (both in range) and fields without effect: the same rule.
        """
        last = self._last
        if last is None:
            self.completion_tokens = self._last = ct
            if chunks is None or len(chunks) != 1:  # no output yet, or a total on a later chunk
                return 1
            last = 0
        elif ct < last:
            self._problems.flag(_DOWN, f"usage.completion_tokens went down ({last}, then {ct}): the highest kept")
            ct = last
        else:
            self.completion_tokens = self._last = ct
        rise = ct - last + self.carry
        if chunks is None:
            self.carry = rise
            return 1
        self.carry = 0
        self.per_chunk = True
        # An output chunk carries at least one token, whatever the counter says.
        return rise if rise > 1 else 1
