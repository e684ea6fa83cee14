"""What the requests asked for, in one line: the API, ignore_eos, per-chunk usage, the
tokenizer counting chunks, and TLS verification switched off.

Two runs that differ in any of these measured different things (ignore_eos fixes answer
lengths; per-chunk usage makes ITL exact), so every report says them beside its figures.
"""

from __future__ import annotations

from typing import Any

__all__ = ["request_terms"]


def request_terms(meta: dict[str, Any]) -> str:
    """``meta`` (run.json) as "api chat · ignore_eos on · per-chunk usage asked (probe) · ..."."""
    s = meta.get("settings") or {}
    api = s.get("api", "chat")
    terms = [f"api {api}"]
    if api not in ("embeddings", "rerank"):
        terms.append("ignore_eos on" if s.get("ignore_eos", True) else "ignore_eos off (answers may end early)")
    usage = meta.get("per_chunk_usage") or {}
    if usage.get("asked"):
        terms.append(f"per-chunk usage asked ({usage.get('how', '?')})")
    if s.get("tokenizer"):
        terms.append("chunks counted with a tokenizer")
    if s.get("max_tokens_field") not in (None, "max_tokens"):
        terms.append(f"length as {s['max_tokens_field']}")
    if s.get("insecure"):
        terms.append("TLS NOT verified (--insecure)")
    return " · ".join(terms)
