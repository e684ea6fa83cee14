"""Every report says what its requests asked for: the API, ignore_eos, per-chunk usage, a
tokenizer counting chunks, an unverified TLS connection (issue 16)."""

from __future__ import annotations

from loadgen.report.request_terms import request_terms


def test_the_request_terms_name_what_changes_the_measurement() -> None:
    meta = {
        "settings": {"api": "chat", "ignore_eos": False, "tokenizer": "/t.json", "insecure": True},
        "per_chunk_usage": {"asked": True, "how": "probe", "supported": True},
    }
    assert request_terms(meta) == (
        "api chat · ignore_eos off (answers may end early) · per-chunk usage asked (probe) · "
        "chunks counted with a tokenizer · TLS NOT verified (--insecure)"
    )


def test_a_plain_run_and_a_pooled_one_say_little() -> None:
    assert request_terms({"settings": {"api": "completions", "ignore_eos": True}}) == "api completions · ignore_eos on"
    assert request_terms({"settings": {"api": "embeddings", "ignore_eos": True}}) == "api embeddings"
    assert request_terms({}) == "api chat · ignore_eos on"  # an older run.json: the defaults it ran with
