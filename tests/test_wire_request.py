"""A lean-wire request's bytes (client/wire/request.py), on literals: the head, the run's headers
in their order, the per-request ids, the length, the body."""

from __future__ import annotations

from loadgen.client.wire.request import RequestHead

RUN = {"Content-Type": "application/json", "Accept": "text/event-stream", "X-Loadgen-Run": "r"}


def test_a_request_is_its_head_the_runs_headers_its_ids_its_length_and_its_body() -> None:
    head = RequestHead("http://127.0.0.1:8000/v1/chat/completions?k=1")
    headers = {**RUN, "X-Loadgen-Seq": "7", "X-Request-Id": "r-7"}  # the engine's order: the ids last
    assert head.render(headers, b"{}") == (
        b"POST /v1/chat/completions?k=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
        b"Content-Type: application/json\r\nAccept: text/event-stream\r\nX-Loadgen-Run: r\r\n"
        b"X-Loadgen-Seq: 7\r\nX-Request-Id: r-7\r\nContent-Length: 2\r\n\r\n{}"
    )
    again = head.render({**RUN, "X-Loadgen-Seq": "8", "X-Request-Id": "r-8"}, b"{}")  # the run's block kept
    assert again.endswith(b"X-Loadgen-Seq: 8\r\nX-Request-Id: r-8\r\nContent-Length: 2\r\n\r\n{}")


def test_ids_anywhere_among_the_headers_go_after_the_runs_own() -> None:
    head = RequestHead("http://h/v1")
    mixed = {"X-Request-Id": "r-7", "Accept": "a", "X-Loadgen-Seq": "7", "B": "b"}
    assert head.render(mixed, b"") == (
        b"POST /v1 HTTP/1.1\r\nHost: h\r\nAccept: a\r\nB: b\r\n"
        b"X-Request-Id: r-7\r\nX-Loadgen-Seq: 7\r\nContent-Length: 0\r\n\r\n"
    )


def test_credentials_in_the_url_are_sent_as_basic_auth_unless_a_header_gives_its_own() -> None:
    head = RequestHead("https://user:p%40ss@h:8443/v1")
    assert b"Authorization: Basic dXNlcjpwQHNz\r\n" in head.render({"X-Loadgen-Seq": "1", "X-Request-Id": "1"}, b"")
    own = head.render({"Authorization": "Bearer k", "X-Loadgen-Seq": "1", "X-Request-Id": "1"}, b"")
    assert b"Basic" not in own and b"Authorization: Bearer k\r\n" in own and b"Host: h:8443\r\n" in own
