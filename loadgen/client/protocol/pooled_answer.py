"""Interpretation of one non-streamed pooled answer: embeddings (``POST /v1/embeddings``) or rerank.

An embeddings or rerank request has no output tokens: the server runs the prompts through
the model once (prefill only) and answers with one JSON document. So there is no TTFT and
no ITL; the request's latency is E2E (``t_done - t_sched``, DESIGN.md). This reader
presents the interface the engine reads of a stream's tally (``StreamState``'s fields,
``feed``, ``close``, ``reconcile``), so the engine, its timeouts and the records do not ask
which kind of answer came back. What each field means here:

- ``chunk_ns`` and ``chunk_tokens`` stay empty (no output chunk), so ``t_first`` and
  ``t_last`` stay null and TTFT is undefined for the record; ``reconcile()`` is
  ``Reconciled([], 0, "none")``.
- ``t_output``: the arrival of the answer's first byte of body. The engine's first-byte
  timeout (``client.request_timer``) runs until then, as for a stream it runs until the
  first output: for a pooled request, "first byte" means what it says. ``t_read`` is the
  last read, for the idle timeout, as for a stream.
- ``end``: ``"done"`` once the top-level JSON value was read whole; ``"eof"`` when the body
  closed before that (the record is then ``disconnected``); None before any byte.
  ``events`` is 1 once the answer began (its first bracket), so that a cut-short answer is
  ``disconnected``, not ``bad_stream``; ``done`` once it was read whole.
- ``prompt_tokens``: ``usage.prompt_tokens``; else ``usage.total_tokens`` (vLLM's and Jina's
  rerank usage has only that, and a pooled request's total is all prompt).
  ``cached_tokens``: ``usage.prompt_tokens_details.cached_tokens`` where sent.
  ``completion_tokens`` and ``reasoning_tokens`` stay None, and so does ``finish_reason``.
- ``items``: how many embeddings (``data``) or results (``results``) came back, counted,
  never kept: an embeddings answer can be megabytes of numbers (a batch of 256 inputs of
  4096 floats is ~20 MB). The reader keeps only the answer's envelope (every top-level
  member but the item list, as bytes, at most ``MAX_ENVELOPE_BYTES``) and decodes that at
  the end, so what it holds per request is bounded whatever the answer's size. A count
  other than ``expected`` (the inputs sent, or rerank's ``top_n``) is a line of ``problems``.
  A bare top-level array (TEI's native ``/embed`` and ``/rerank``) is read as the item list.

The items are counted by their opening brackets (each an object or an array), not
validated: the numbers inside are skipped by finding the next bracket or quote (``bytes.find``,
memchr), which costs about a millisecond per MB. What the endpoint sent is untrusted: counts are
range-checked (``loadgen.untrusted.token_count``), an error object in a 200 answer raises
``StreamError`` (chunk_errors.py), and an answer that is not JSON, or larger than
``max_answer_bytes``, raises ``BadStream``.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from loadgen.client.protocol.chunk_errors import check_error
from loadgen.client.protocol.sse import BadStream
from loadgen.client.protocol.token_counts import Reconciled
from loadgen.client.protocol.usage import Problems
from loadgen.untrusted import clean_text
from loadgen.workload.pooled import POOLED_APIS
from loadgen.workload.session import ToolCall

__all__ = ["MAX_ENVELOPE_BYTES", "PooledAnswer"]

MAX_ENVELOPE_BYTES = 64 * 1024  # the answer without its item list: usage, model, id, ...
_ITEM_KEYS = (b"data", b"results")  # where the item list is (embeddings; rerank)
_TOKENS = (b'"', b"[", b"]", b"{", b"}")  # outside a string, only these change what is read
_LAST_KEY = re.compile(rb'"([^"\\]{0,64})"\s*:\s*$')  # the member name just before a value
_SPACE = b" \t\r\n"
_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")


class PooledAnswer:
    """Reader of one embeddings or rerank answer (non-streamed JSON), as its bytes arrive.

    ``feed(data, t_ns)`` per read, ``close(t_ns)`` at end of body, then ``reconcile()``, as
    for ``StreamTally``. ``expected``: the items the answer should hold (None: not checked).
    """

    __slots__ = (
        "api",
        "keep_text",
        "expected",
        "done",
        "chunk_ns",
        "chunk_tokens",
        "finish_reason",
        "t_first_content",
        "problems",
        "events",
        "t_read",
        "t_output",
        "items",
        "prompt_tokens",
        "cached_tokens",
        "_problems",
        "_max",
        "_size",
        "_depth",
        "_in_str",
        "_esc",
        "_skip",
        "_kept",
        "_over",
    )

    def __init__(
        self,
        api: str,
        keep_text: bool = False,
        expected: int | None = None,
        max_answer_bytes: int = 1 << 30,
    ) -> None:
        if api not in POOLED_APIS:
            raise ValueError(f"api must be one of {POOLED_APIS}, not {api!r}")
        self.api = api
        self.keep_text = keep_text  # accepted for the engine's one way of making a reader: there is no text
        self.expected = expected
        self.done = False
        self.chunk_ns: list[int] = []  # no output chunk: TTFT stays null
        self.chunk_tokens: list[int] = []
        self.finish_reason: str | None = None
        self.t_first_content: int | None = None
        self._problems = Problems()
        self.problems: list[str] = self._problems.lines
        self.events = 0
        self.t_read = 0
        self.t_output: int | None = None  # the answer's first byte of body
        self.items = 0
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self._max = max_answer_bytes
        self._size = 0
        self._depth = 0  # brackets open
        self._in_str = False  # the last read ended inside a string
        self._esc = False  # ... right after its backslash
        self._skip = 0  # the depth of the item list while inside it (its bytes are not kept), else 0
        self._kept = bytearray()  # the envelope so far (the item list as [])
        self._over = False  # the envelope passed MAX_ENVELOPE_BYTES: no longer kept

    # -- the interface the engine reads ---------------------------------------------
    @property
    def completion_tokens(self) -> int | None:
        return None

    @property
    def reasoning_tokens(self) -> int | None:
        return None

    @property
    def tool_call_count(self) -> int | None:
        return None  # a pooled request offers no tools

    @property
    def tool_calls(self) -> tuple[ToolCall, ...] | None:
        return None

    def capture_tool_calls(self) -> None:
        """Nothing to capture: a pooled answer is vectors or scores."""

    @property
    def text(self) -> str:
        return ""

    @property
    def end(self) -> str | None:
        """``"done"`` (the JSON answer read whole), ``"eof"`` (the body closed before), None before a byte."""
        if self.done:
            return "done"
        return "eof" if self._size else None

    def reconcile(self) -> Reconciled:
        return Reconciled([], 0, "none")

    # -- reading ----------------------------------------------------------------------
    def feed(self, data: bytes, t_ns: int) -> None:
        """Read one read of the body, which arrived at ``t_ns``."""
        self.t_read = t_ns
        if not data:
            return
        if self.t_output is None:
            self.t_output = t_ns
        self._size += len(data)
        if self._size > self._max:
            raise BadStream(f"{self.api} answer over {self._max:,} bytes")
        if self.done:
            if data.strip(_SPACE):
                self._problems.flag("after", "bytes after the JSON answer ignored")
            return
        self._scan(data)

    def close(self, t_ns: int | None = None) -> None:
        """End of body: an answer not read whole is ``eof`` (nothing to decode); a body of
        white space only is not an answer."""
        if self._size and not self.events:
            raise BadStream(f"{self.api} answer is empty")

    def _scan(self, data: bytes) -> None:
        n, i = len(data), 0
        keep_from = 0 if not self._skip else -1  # where the bytes kept from this read start (-1: none)
        if self._in_str:
            esc, self._esc = self._esc, False
            i = self._string_end(data, 1 if esc else 0)
            if i < 0:
                self._keep(data, keep_from, n)
                return
        if not self.events:  # the answer starts here: it must be an object or an array
            j = n - len(data.lstrip(_SPACE))
            if j == n:
                return  # white space so far
            if data[j] not in _OPEN:
                raise BadStream(f"{self.api} answer is not JSON (starts {clean_text(repr(data[j : j + 40]), 60)})")
            self.events = 1  # an answer began: cut short now, it is ``eof`` (disconnected)
        # The next of each bracket and of the quote (memchr each, found again only once
        # passed): the numbers between are never looked at one by one.
        at = [data.find(b, i) for b in _TOKENS]
        while True:
            i = min((p for p in at if p >= 0), default=-1)
            if i < 0:
                break
            c = data[i]
            if c == 34:  # a quote: a string to its end
                i = self._string_end(data, i + 1)
                if i < 0:
                    break
                at = [p if p >= i or p < 0 else data.find(b, i) for p, b in zip(at, _TOKENS, strict=True)]
                continue
            if c in _OPEN:
                self._depth += 1
                d = self._depth
                if self._skip:
                    if d == self._skip + 1:
                        self.items += 1
                elif self._starts_items(data, keep_from, i, c):
                    self._keep(data, keep_from, i + 1)
                    keep_from = -1
            else:
                d = self._depth
                self._depth -= 1
                if self._skip and d == self._skip:  # the item list ends: keep from its bracket on
                    self._skip = 0
                    keep_from = i
                if self._depth == 0:
                    self._keep(data, keep_from, i + 1)
                    self._whole()
                    if data[i + 1 :].strip(_SPACE):
                        self._problems.flag("after", "bytes after the JSON answer ignored")
                    return
                if self._depth < 0:
                    raise BadStream(f"{self.api} answer is not JSON (a bracket closes what was not open)")
            i += 1
            k = _TOKENS.index(bytes((c,)))
            at[k] = data.find(_TOKENS[k], i)
        self._keep(data, keep_from, n)

    def _string_end(self, data: bytes, i: int) -> int:
        """The index after the closing quote of the string ``data[i:]`` is inside; -1 (and
        ``_in_str``, ``_esc`` set) when it runs past this read."""
        n = len(data)
        j = data.find(b'"', i)
        while j >= 0:
            k = j  # the backslashes right before it (from the string's start in this read)
            while k > i and data[k - 1] == 92:
                k -= 1
            if not (j - k) % 2:  # not escaped
                self._in_str = False
                return j + 1
            j = data.find(b'"', j + 1)
        k = n
        while k > i and data[k - 1] == 92:
            k -= 1
        self._esc = bool((n - k) % 2)  # a backslash, the read's last byte: what it escapes comes next
        self._in_str = True
        return -1

    def _starts_items(self, data: bytes, keep_from: int, i: int, c: int) -> bool:
        """Whether the bracket at ``data[i]`` (``c``) opens the item list: a top-level array, or
        an array member of the top-level object named ``data`` or ``results``."""
        if c != 91:  # "["
            return False
        if self._depth == 1:
            self._skip = 1
            return True
        if self._depth != 2 or self._over:
            return False
        head = bytes(self._kept[-80:]) + data[max(i - 80, keep_from) : i]  # (not skipping: keep_from >= 0)
        m = _LAST_KEY.search(head)
        if m is None or m.group(1) not in _ITEM_KEYS:
            return False
        self._skip = 2
        return True

    def _keep(self, data: bytes, lo: int, hi: int) -> None:
        if lo < 0 or hi <= lo or self._over:
            return
        if len(self._kept) + hi - lo > MAX_ENVELOPE_BYTES:
            self._over = True
            self._kept.clear()
            self._problems.flag("envelope", f"answer without its items over {MAX_ENVELOPE_BYTES:,} bytes: not read")
            return
        self._kept += data[lo:hi]

    # -- the whole answer -------------------------------------------------------------
    def _whole(self) -> None:
        """The top-level value closed: decode its envelope (usage, an error), check the count."""
        self.done = True
        self.events = 1
        if not self._over:
            try:
                obj = orjson.loads(self._kept)
            except orjson.JSONDecodeError:
                raise BadStream(f"{self.api} answer is not JSON: {clean_text(bytes(self._kept[:80]), 100)}") from None
            self._kept = bytearray()
            if type(obj) is dict:
                check_error(obj)
                self._usage(obj.get("usage"))
        if self.expected is not None and self.items != self.expected:
            what = "embeddings" if self.api == "embeddings" else "results"
            self._problems.flag("items", f"answer has {self.items} {what}, {self.expected} expected")

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        if type(usage) is not dict:
            self._problems.flag("usage", "usage is not an object: ignored")
            return
        count = self._problems.count
        n = count(usage.get("prompt_tokens"), "usage.prompt_tokens")
        if n is None:
            n = count(usage.get("total_tokens"), "usage.total_tokens")
        self.prompt_tokens = n
        details = usage.get("prompt_tokens_details")
        if type(details) is dict:
            self.cached_tokens = count(details.get("cached_tokens"), "usage.cached_tokens")
