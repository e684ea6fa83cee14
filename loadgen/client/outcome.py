"""What became of one request: its record, from what the wire and the stream's tally saw.

Every scheduled request ends as exactly one ``Record``; this module fills it in. Its status
comes from how the exchange ended (``judge`` for an answer that came back, ``judge_error``
for an exception); its counts from the tally (``fill``). A request that never reached the
wire is ``not_sent`` (``not_sent``), with the reason, and nothing measured.

Every text that ends in a record passes through ``Say``: an endpoint's error body, a header
value or an exception message is untrusted and may echo the run's key. ``Say`` strips it to
one clean line, removes every secret the run holds (in any form), and only then cuts it to
length, so a cut never leaves half a key behind.
"""

from __future__ import annotations

from loadgen.client.config import EngineConfig, Route
from loadgen.client.protocol.chunk_errors import StreamError
from loadgen.client.protocol.sse import BadStream
from loadgen.client.protocol.tallies import Tally
from loadgen.client.transport import Exchange, WireError
from loadgen.records import Record
from loadgen.redaction import Secrets
from loadgen.untrusted import MAX_TEXT_CHARS, clean_text
from loadgen.workload.session import Turn

__all__ = ["Say", "new_record", "not_sent", "judge", "judge_error", "fill"]

_KNOWN = 256  # distinct values ``Say.word`` remembers


class Say:
    """Makes an untrusted text safe for a record: one line, no secret, at most ``limit`` characters."""

    __slots__ = ("secrets", "_known")

    def __init__(self, secrets: Secrets) -> None:
        self.secrets = secrets
        self._known: dict[str, str] = {}  # ``word``'s answers: a few values, sent on every request

    def word(self, text: str) -> str:
        """``self(text)``, remembered: for a value most answers repeat (a finish_reason), which
        would otherwise cost a redaction per request (~10 us)."""
        said = self._known.get(text)
        if said is None:
            said = self(text)
            if len(self._known) < _KNOWN:
                self._known[text] = said
        return said

    def __call__(self, text: object, limit: int = MAX_TEXT_CHARS) -> str:
        raw = text if isinstance(text, str) else str(text)
        # Cleaned whole first (a key with a zero-width character inside is a key once it is
        # stripped), redacted whole (before any cut), cut last.
        whole = clean_text(raw, limit=max(len(raw), 1))
        return clean_text(self.secrets.redact(whole), limit)


def new_record(
    cfg: EngineConfig, seq: int, session: int, turn_no: int, turn: Turn, t_sched: int, route: Route
) -> Record:
    """The record of one request (to ``route``: its stage's endpoint), before anything happened to it."""
    return Record(
        run_id=cfg.run_id,
        point=cfg.point,
        shard=cfg.shard,
        request=seq,
        session=session,
        turn=turn_no,
        endpoint=route.label,
        model=route.model,
        api=route.api,
        stage=route.stage or None,
        t_sched=t_sched,
        prompt_tokens_requested=turn.prompt_tokens or None,
        output_tokens_requested=turn.max_tokens,
    )


def not_sent(rec: Record, why: str) -> Record:
    """Mark ``rec`` as never written to the wire: no time but its instant, and why."""
    rec.status = "not_sent"
    rec.error = why
    rec.t_sent = rec.t_headers = rec.t_first = rec.t_last = rec.t_done = None
    return rec


def judge(rec: Record, ex: Exchange, tally: Tally, t_end: int, say: Say) -> None:
    """The status of an exchange whose answer came back (the transport returned); ``t_end`` is
    when its body's last read arrived. How a 200 stream ended is kept (``stream_end``,
    records.STREAM_ENDS): ``done`` and ``finish`` (a finish_reason, then the body closed without
    ``[DONE]``: the answer is whole, its framing not) are ``ok``; ``eof`` (neither) is
    ``disconnected``."""
    if ex.status != 200:
        rec.status = "http_error"
        body = ex.error.decode("utf-8", "replace")
        after = f" (Retry-After: {say(ex.retry_after, 40)})" if ex.retry_after else ""
        rec.error = say(f"HTTP {ex.status}: {say(body, MAX_TEXT_CHARS - 12 - len(after))}{after}")
        return
    tally.close(t_end)
    rec.stream_end = tally.end
    if tally.events == 0:
        rec.status = "bad_stream"
        rec.error = f"HTTP 200 but no SSE events (Content-Type {say(ex.content_type, 80)!r})"
    elif tally.end == "eof":
        rec.status = "disconnected"
        rec.error = "stream ended without [DONE] or a finish_reason"


def judge_error(rec: Record, e: Exception, say: Say) -> None:
    """The status of an exchange that ended in an exception (any: a bug must not lose the record)."""
    if isinstance(e, StreamError):
        rec.status, rec.error = "http_error", say(f"error in stream: {e}")
    elif isinstance(e, BadStream):
        rec.status, rec.error = "bad_stream", say(e)
    elif isinstance(e, WireError):
        rec.status, rec.error = e.status, say(e)
    elif isinstance(e, (ValueError, OSError)):
        rec.status, rec.error = "client_error", say(f"{type(e).__name__}: {e}")
    else:
        rec.status, rec.error = "client_error", say(f"internal error ({type(e).__name__}: {e})")


def fill(rec: Record, tally: Tally, t_done: int, keep_text: bool, say: Say) -> None:
    """Copy what the tally saw into ``rec``: times, counts, and the impossible values it bounded
    (``tally.problems``, a note in ``error`` that leaves the status as it is)."""
    rec.t_done = t_done
    counts, total, source = tally.reconcile()
    rec.chunk_ns = chunks = tally.chunk_ns  # (a list of its own: the tally holds them compactly)
    rec.chunk_tokens = counts
    rec.output_tokens = total
    rec.output_tokens_source = source
    rec.output_tokens_reported = tally.completion_tokens
    rec.prompt_tokens_reported = tally.prompt_tokens
    rec.cached_tokens = tally.cached_tokens
    if tally.finish_reason is not None:  # an endpoint's string: it may echo the key
        rec.finish_reason = say.word(tally.finish_reason)
    if chunks:
        rec.t_first, rec.t_last = chunks[0], chunks[-1]
    if keep_text:  # kept as sent (it is untrusted, the reader knows), but never with a secret in it
        rec.output_text = say.secrets.redact(tally.text)
    rec.t_first_content = tally.t_first_content
    rec.reasoning_tokens = tally.reasoning_tokens
    if tally.problems:  # read after reconcile, which may add one
        note = "; ".join(tally.problems)
        rec.error = say(f"{rec.error}; {note}" if rec.error else note)
