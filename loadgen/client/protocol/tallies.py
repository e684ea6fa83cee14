"""Which tally reads an API's answer: ``StreamTally`` for chat and completions chunks,
``ResponsesTally`` for the Responses API's typed events, ``PooledAnswer`` for the one JSON
body of an embeddings or rerank request.

All present the one interface the engine reads (``StreamState``'s fields, ``feed``,
``close``, ``reconcile``, the tool calls), so the engine, its timeouts and the records never
ask which API an answer came from.
"""

from __future__ import annotations

from typing import Any

from loadgen.client.protocol.pooled_answer import PooledAnswer
from loadgen.client.protocol.responses import ResponsesTally
from loadgen.client.protocol.tally import StreamTally
from loadgen.client.protocol.template import Learned
from loadgen.workload.pooled import POOLED_APIS, expected_items
from loadgen.workload.tokenizer import Tokenizer

__all__ = ["Tally", "new_tally"]

Tally = StreamTally | ResponsesTally | PooledAnswer


def new_tally(
    api: str,
    body: dict[str, Any],
    *,
    keep_text: bool = False,
    tokenizer: Tokenizer | None = None,
    learned: Learned | None = None,
) -> Tally:
    """The tally for one answer of ``api`` to a request whose extra fields are ``body`` (the
    run's and the session's): the tool calls are kept when it offered tools; a pooled answer
    is checked against the count of inputs it sent. ``learned``: the content template of the
    answers on its route so far (chat and completions; template.Learned), shared by them."""
    if api in POOLED_APIS:
        return PooledAnswer(api, expected=expected_items(api, body))
    tally: Tally = (
        ResponsesTally(keep_text=keep_text, tokenizer=tokenizer)
        if api == "responses"
        else StreamTally(api, keep_text=keep_text, tokenizer=tokenizer, learned=learned)
    )
    if body.get("tools") and api != "completions":  # tools offered: their calls go back next turn
        tally.capture_tool_calls()
    return tally
