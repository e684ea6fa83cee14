"""Which tally reads an API's stream: ``StreamTally`` for chat and completions chunks,
``ResponsesTally`` for the Responses API's typed events.

Both present the one interface the engine reads (``StreamState``'s fields, ``feed``,
``close``, ``reconcile``), so the engine, its timeouts and the records never ask which API
a stream came from.
"""

from __future__ import annotations

from loadgen.client.protocol.responses import ResponsesTally
from loadgen.client.protocol.tally import StreamTally
from loadgen.workload.tokenizer import Tokenizer

__all__ = ["Tally", "new_tally"]

Tally = StreamTally | ResponsesTally


def new_tally(api: str, *, keep_text: bool = False, tokenizer: Tokenizer | None = None) -> Tally:
    """The tally for one streamed answer of ``api`` (chat, completions or responses)."""
    if api == "responses":
        return ResponsesTally(keep_text=keep_text, tokenizer=tokenizer)
    return StreamTally(api, keep_text=keep_text, tokenizer=tokenizer)
