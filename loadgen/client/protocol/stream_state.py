"""What a stream has shown so far: output chunk times and texts, token counts, usage, its end.

The tally (tally.py) reads a response's bytes and records here what they said; this
is the part of it the engine and the record read (``chunk_ns``, ``reconcile``,
``end``, ``t_output``, the usage counts), apart from the reading so that each stays
within one page. Every value here is already bounded (usage.py, choices.py).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from loadgen.client.protocol.choices import finish_reason
from loadgen.client.protocol.chunk_texts import ChunkTexts
from loadgen.client.protocol.template import plain
from loadgen.client.protocol.token_counts import Reconciled, reconcile
from loadgen.client.protocol.tool_calls import CallCapture
from loadgen.client.protocol.usage import Problems, Usage
from loadgen.untrusted import MAX_TEXT_CHARS, MAX_TOKEN_COUNT

if TYPE_CHECKING:
    from loadgen.workload.session import ToolCall
    from loadgen.workload.tokenizer import Tokenizer

__all__ = ["APIS", "StreamState"]

APIS = ("chat", "completions")


class StreamState:
    """What one streamed response has shown so far; ``StreamTally`` (tally.py) fills it.

    ``chunk_ns`` and ``chunk_tokens``: per output chunk, its arrival and its observed
    count (lists, copied out); ``reconcile()`` gives the counts to record. ``problems``:
    one line per kind of impossible or odd value the endpoint sent (``clean_text``'d).

    Held compactly while the stream runs (issue 18: memory per in-flight stream): the
    arrivals in an ``array('q')``, 8 bytes a chunk where a list of ints takes ~40, and the
    counts not at all while every one is 1 (the usual stream without running usage),
    else in an ``array('q')`` too; ``_counted`` is the one way a count other than 1 is kept.
    """

    __slots__ = (
        "api",
        "keep_text",
        "done",
        "_ns",
        "_tokens",
        "finish_reason",
        "t_first_content",
        "problems",
        "events",
        "t_read",
        "_chat",
        "_parts",
        "_usage",
        "_problems",
        "_fr_raw",
        "_lenient",
        "_fed",
        "_texts",
        "_collect",
        "_calls",
    )

    def __init__(self, api: str, keep_text: bool, tokenizer: Tokenizer | None) -> None:
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, not {api!r}")
        self.api = api
        self.keep_text = keep_text
        self.done = False
        self._ns = array("q")  # each output chunk's arrival
        self._tokens: array[int] | None = None  # each one's count; None while every one is 1
        self.finish_reason: str | None = None
        self.t_first_content: int | None = None  # the first chunk with visible content (not reasoning)
        self._problems = Problems()
        self.problems: list[str] = self._problems.lines
        self._usage = Usage(self._problems)
        self.events = 0
        self.t_read = 0  # when the last read arrived (0: none yet), for the engine's idle timeout
        self._chat = api == "chat"
        self._parts: list[str] = []
        self._fr_raw: object = None  # the finish_reason last sent, as sent
        self._lenient = False  # an event was decoded leniently: kept text may hold lone surrogates
        self._fed = False  # a byte of body was fed
        # With a tokenizer, each output chunk's text (chunk_texts.py); None without one,
        # or once past its cap.
        self._texts = ChunkTexts(tokenizer) if tokenizer is not None else None
        self._collect = keep_text or tokenizer is not None  # an output chunk's text is kept somewhere
        self._calls: CallCapture | None = None  # the answer's tool calls, once asked to capture them

    def capture_tool_calls(self) -> None:
        """Keep the answer's tool calls (the request offered tools): ``tool_calls`` gives them."""
        if self._calls is None:
            self._calls = CallCapture(self._problems)

    @property
    def tool_call_count(self) -> int | None:
        """How many tool calls the answer made so far (``tool_calls``'s length, without building them)."""
        return None if self._calls is None else len(self._calls)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...] | None:
        """The answer's tool calls so far (tool_calls.py: bounded, cleaned, arguments as sent);
        None unless ``capture_tool_calls`` was called."""
        return None if self._calls is None else self._calls.calls()

    @property
    def prompt_tokens(self) -> int | None:
        """``usage.prompt_tokens``, the last in range (usage.py)."""
        return self._usage.prompt_tokens

    @property
    def completion_tokens(self) -> int | None:
        """``usage.completion_tokens``, the highest in range (usage.py)."""
        return self._usage.completion_tokens

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens``, the last in range."""
        return self._usage.cached_tokens

    @property
    def reasoning_tokens(self) -> int | None:
        """``usage.completion_tokens_details.reasoning_tokens``, the last in range."""
        return self._usage.reasoning_tokens

    @property
    def chunk_ns(self) -> list[int]:
        """Each output chunk's arrival (a copy)."""
        return self._ns.tolist()

    @property
    def chunk_tokens(self) -> list[int]:
        """Each output chunk's observed count (a copy); ``reconcile`` gives those to record."""
        tokens = self._tokens
        return [1] * len(self._ns) if tokens is None else tokens.tolist()

    def _counted(self, k: int) -> None:
        """The count of the output chunk just appended to ``_ns``, when it may not be 1."""
        tokens = self._tokens
        if tokens is None:
            if k == 1:
                return
            tokens = self._tokens = array("q", [1]) * (len(self._ns) - 1)
        tokens.append(k)

    @property
    def end(self) -> str | None:
        """How the body ended (records.STREAM_ENDS): ``"done"`` (``[DONE]`` seen),
        ``"finish"`` (a finish reason but no ``[DONE]``), ``"eof"`` (neither); None
        until a byte of body was fed. Read after ``close``, it is the stream's end."""
        if not self._fed:
            return None
        if self.done:
            return "done"
        return "eof" if self.finish_reason is None else "finish"

    @property
    def t_output(self) -> int | None:
        """When the first output-carrying event arrived (``chunk_ns[0]``), None before:
        comments, keep-alives, role chunks and tool-call headers do not count."""
        ns = self._ns
        return ns[0] if ns else None

    @property
    def text(self) -> str:
        """The output text so far (reasoning, content, tool arguments); '' unless keep_text."""
        text = "".join(self._parts)
        if self._lenient:  # a lone surrogate ("\\ud800", read leniently) cannot be stored or written
            text = text.encode("utf-8", "replace").decode()
        return text

    def _kept(self, text: str) -> None:
        """Keep the text of one output chunk: for ``text``, for the tokenizer, or both."""
        if self.keep_text:
            self._parts.append(text)
        if self._texts is not None:
            self._tokenized([text], len(text))

    def _running_chunk(self, body: bytes, ct: bytes, prompt: int, t_ns: int) -> bool:
        """Record an event the tally found to fit its usage template (usage_template.py),
        read at ``t_ns``: its text ``body``, the digits ``ct`` of its ``completion_tokens``
        and its ``prompt_tokens`` (the template's). False, recording nothing, unless the
        text is plain and the count in range (else the tally decodes it, and notes what is
        wrong); then exactly what decoding it would record."""
        c = int(ct)  # digits only, no sign or space (the template's pattern)
        if c > MAX_TOKEN_COUNT:
            return False
        text = plain(body)
        if text is None:
            return False
        # What Usage.take does with such a usage (its prompt_tokens, then the rise),
        # inlined to one call: this is the read of nearly every token on such a stream.
        usage = self._usage
        usage.prompt_tokens = prompt
        if text:
            chunks = self._ns
            chunks.append(t_ns)
            self._counted(usage.rise(c, chunks))
            if self._collect:
                self._kept(text)
        else:  # an empty body: an event without output, whose usage rise is carried
            usage.rise(c, None)
        return True

    def _kept_chunk(self, pieces: list[str]) -> None:
        """Keep the text of one decoded output chunk (its pieces: reasoning, content,
        tool arguments) for the tokenizer, and for ``text`` if kept."""
        text = "".join(pieces)
        if self.keep_text:
            self._parts.append(text)
        self._tokenized([text], len(text))

    def _tokenized(self, texts: list[str], size: int) -> None:
        """Keep the texts of output chunks for the tokenizer, ``size`` characters in all,
        unless that passes the cap (chunk_texts.py): then none is kept any more."""
        assert self._texts is not None
        if not self._texts.add(texts, size):
            self._texts = None  # reconcile counts as without a tokenizer
            self._collect = self.keep_text

    def _finish_reason(self, fr: object) -> None:
        """Keep a finish reason, cleaned (choices.py); a long one is not held on to."""
        self._fr_raw = fr if type(fr) is not str or len(fr) <= MAX_TEXT_CHARS else None
        self.finish_reason = finish_reason(fr, self._problems)

    def reconcile(self) -> Reconciled:
        """Final per-chunk token counts, their total, and where the count came from:
        running usage first, then the tokenizer (``token_counts.by_tokenizer``), then the
        final usage spread over the chunks (``token_counts.reconcile``), each within
        ``[0, MAX_TOKEN_COUNT]``; call it before reading ``problems``, as it may add one."""
        u = self._usage
        if not u.per_chunk and self._texts is not None:
            counted = self._texts.counts(len(self._ns), u.completion_tokens, self._lenient, self._problems)
            if counted is not None:
                return counted
        counted = reconcile(self.chunk_tokens, u.per_chunk, u.carry, u.completion_tokens)
        if u.per_chunk and counted.source == "chunks":
            self._problems.flag("usage.sum", "running usage adds up to an impossible count: one token per chunk kept")
        return counted
