"""The body of one request, for whichever API the run speaks.

Chat and completions stream chunks (``session.build_body``: usage asked for, per-chunk usage
when asked); the Responses API takes ``input`` items and ``max_output_tokens``
(``responses_body``); embeddings and rerank send the session's own fields and are never
streamed (``pooled``). One entry point, so the engine and the preflight probe build the same
request a run sends.
"""

from __future__ import annotations

from typing import Any

from loadgen.workload.pooled import POOLED_APIS, build_pooled_body
from loadgen.workload.responses_body import build_responses_body
from loadgen.workload.session import Conversation, build_body, right_sized

__all__ = ["request_body"]


def request_body(
    api: str,
    model: str,
    conv: Conversation,
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    extra: dict[str, Any] | None = None,
    continuous_usage: bool = False,
    max_tokens_field: str = "max_tokens",
) -> bytes:
    """The JSON body of a request of ``api``; ``extra`` (the run's ``--extra-body`` under the
    session's own fields) goes in last. ``continuous_usage`` and ``max_tokens_field`` apply
    to chat and completions only (the Responses API has neither; pooled requests no length)."""
    if api in POOLED_APIS:
        return right_sized(build_pooled_body(model, extra or {}))
    if api == "responses":
        return right_sized(build_responses_body(model, conv.messages, max_tokens, ignore_eos=ignore_eos, extra=extra))
    return build_body(
        api,
        model,
        conv,
        max_tokens,
        ignore_eos=ignore_eos,
        extra=extra,
        continuous_usage=continuous_usage,
        max_tokens_field=max_tokens_field,
    )
