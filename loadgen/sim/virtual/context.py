"""A session's context as the simulated server sees it: the prompt's token ids, turn by turn.

The real-time path builds each turn's request body (``workload.session.Conversation``), the server
joins its messages' contents and tokenizes the text (``BUILTIN.encode``). Here the same prompt is
kept as token ids and grown by each message, so a turn costs the tokens it adds, not the whole
context again: ``"".join(contents)`` tokenizes to the concatenation of each content's tokens when
no word runs across a boundary, and where one would (a content ending in a word character followed
by one starting with one) the joined text is tokenized whole, as the server does. The answer's
words are the server's (``answer.word_index``), known as ids without any text.
"""

from __future__ import annotations

import re

import numpy as np

from loadgen.workload.session import Turn
from loadgen.workload.tokenizer import BUILTIN, WORDS

__all__ = ["Context", "encode", "answer_ids"]

_ID = {w: i for i, w in enumerate(WORDS)}
_GET = _ID.__getitem__
_N_WORDS = len(WORDS)
_WORDISH = re.compile(r"\w")


def encode(text: str) -> list[int]:
    """``BUILTIN.encode(text)``, fast where the text is words of the built-in list (what workloads send,
    after a salt word perhaps).

    The built-in tokenizer's tokens never span whitespace, so the text's tokens are its
    whitespace-separated pieces' tokens in order: a known word is one, and only a piece that is
    not (a run's salt, punctuation) goes through the tokenizer."""
    words = text.split()
    try:
        return list(map(_GET, words))
    except KeyError:
        pass
    if words[0] not in _ID:  # most often the only one: a salt word at the start
        try:
            return [*BUILTIN.encode(words[0]), *map(_GET, words[1:])]
        except KeyError:
            pass
    ids: list[int] = []
    for w in words:
        known = _ID.get(w)
        if known is None:
            ids.extend(BUILTIN.encode(w))
        else:
            ids.append(known)
    return ids


def answer_ids(prompt_len: int, n: int) -> list[int]:
    """The ids of an answer's ``n`` words after a prompt of ``prompt_len`` tokens (``answer.word_index``)."""
    k = np.arange(n, dtype=np.int64)
    ids: list[int] = ((prompt_len * 31 + k * 7919) % _N_WORDS).tolist()
    return ids


class Context:
    """One session's conversation as token ids (the server's ``prompt_ids`` for each of its turns).

    ``add_turn`` hands out the context's own list (no copy per turn): the next change to the
    context copies it first, so a prompt handed out never changes. An answer's words are added
    when the next turn is (a session's last answer is never needed as ids)."""

    __slots__ = ("ids", "_pieces", "_joinable", "_calls", "_shared", "_answer")

    def __init__(self, system: str | None) -> None:
        self.ids: list[int] = []
        # every content so far (an answer as its prompt length and size), for the rare re-tokenization
        self._pieces: list[str | tuple[int, int]] = []
        self._joinable = False  # the text so far ends in a word character
        self._calls = False  # the last answer was a tool call: the next turn answers it
        self._shared = False  # ``ids`` was handed out: copy it before changing it
        self._answer: tuple[int, int] | None = None  # the last answer's (prompt length, size), not yet in ids
        if system:
            self._add(system)

    @property
    def empty(self) -> bool:
        """Nothing in the context yet (no system prompt, no turn)."""
        return not self._pieces and not self._calls

    def add_turn(self, turn: Turn, ids: list[int] | None = None) -> list[int]:
        """The messages ``Conversation.add_turn`` adds for ``turn``, in order; returns the prompt's
        ids (the caller must not change them). ``ids``: the first turn's text already as ids
        (``BUILTIN.encode`` of it, a list the context may keep), for a context still empty."""
        self._settle()
        calls, self._calls = self._calls, False
        if ids is not None:
            if self._pieces or calls:
                raise ValueError("a turn's ids are given only for the first turn of an empty context")
            self._add(turn.text + turn.follow_up, ids)
        elif not calls:
            self._add(turn.text + turn.follow_up)
        else:
            tool = turn.role == "tool"
            self._add(turn.text if tool else "")  # one call per answer: one tool message
            self._add(turn.follow_up if tool else turn.text)
        self._shared = True
        return self.ids

    def add_answer(self, prompt_len: int, n: int, tool_call: bool) -> None:
        """The answer of ``n`` tokens to a prompt of ``prompt_len``: its words, or, a tool call, no content."""
        self._calls = tool_call
        if tool_call or n <= 0:
            return
        if self._answer is not None:
            self._settle()
        self._pieces.append((prompt_len, n))
        self._answer = (prompt_len, n)
        self._joinable = True

    def _settle(self) -> None:
        """``ids`` the context's own again, with the last answer's words in it."""
        if self._shared:
            self.ids, self._shared = list(self.ids), False
        if self._answer is not None:
            self.ids.extend(answer_ids(*self._answer))  # the words come with a leading space: nothing joins across
            self._answer = None

    def _add(self, text: str, ids: list[int] | None = None) -> None:
        if not text:
            return
        if self._joinable and _WORDISH.match(text):  # a word runs across the boundary: as the server sees it
            self._pieces.append(text)
            self.ids = BUILTIN.encode("".join(map(_text, self._pieces)))
        else:
            self._pieces.append(text)
            if not self.ids:
                self.ids = encode(text) if ids is None else ids
            else:
                self.ids.extend(encode(text) if ids is None else ids)
        self._joinable = bool(_WORDISH.match(text[-1]))


def _text(piece: str | tuple[int, int]) -> str:
    if isinstance(piece, str):
        return piece
    return "".join(" " + WORDS[i] for i in answer_ids(*piece))
