"""The hostile endpoint itself (tests/hostile.py): it picks behaviours as documented, logs what
it was sent, and every behaviour ends inside its caps, so the tests that use it cannot hang."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from hostile import HostileServer, serve_in_thread
from hostile_behaviours import BEHAVIOURS

CAP_S, CAP_BYTES = 1.0, 1 << 20


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    with serve_in_thread(cap_bytes=CAP_BYTES, cap_s=CAP_S) as s:
        yield s


def _request(base: str, route: str, model: str | None = None, key: str = "k") -> tuple[str, int, bytes]:
    """(host, port, the raw request bytes) for ``route`` under a base URL (its query kept after the
    route's path); the server is told to close after."""
    u = urlsplit(base)
    path = {"models": u.path + "/models", "metrics": u.path[: -len("/v1")] + "/metrics"}.get(
        route, u.path + "/chat/completions"
    ) + (f"?{u.query}" if u.query else "")
    body = orjson.dumps({"model": model, "stream": True, "max_tokens": 4}) if model else b""
    method = "POST" if route in ("completions", "connect") else "GET"
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n"
    return u.hostname or "", u.port or 0, head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def _exchange(host: str, port: int, data: bytes, limit_s: float = 10.0) -> bytes:
    """Send ``data``, read until the server closes (at most ``limit_s``)."""
    got = bytearray()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except (ConnectionError, OSError):  # reset at connect
        return b""

    async def read_all() -> None:
        while chunk := await reader.read(1 << 16):
            got.extend(chunk)

    try:
        writer.write(data)
        await writer.drain()
        await asyncio.wait_for(read_all(), limit_s)
    except (ConnectionError, OSError, asyncio.TimeoutError):
        pass
    finally:
        writer.close()
    return bytes(got)


def _get(base: str, route: str, model: str | None = None, key: str = "k") -> bytes:
    return asyncio.run(_exchange(*_request(base, route, model, key)))


@pytest.mark.parametrize(
    ("how", "chosen"),
    [("prefix", "no-done"), ("model", "usage-huge"), ("default", "ok"), ("unknown prefix", "unknown:nope")],
)
def test_a_behaviour_is_chosen_by_path_prefix_then_model_then_ok(server: HostileServer, how: str, chosen: str) -> None:
    base = {"prefix": server.url("no-done"), "unknown prefix": server.url().replace("/v1", "/b/nope/v1")}
    model = {"model": "usage-huge", "prefix": "usage-huge"}.get(how, "gpt-4")
    answer = _get(base.get(how, server.url()), "completions", model, key=f"key-{how}")
    entry = next(e for e in server.served() if ("Authorization", f"Bearer key-{how}") in e["headers"])
    assert entry["behaviour"] == chosen
    assert answer.startswith(b"HTTP/1.1 404" if how == "unknown prefix" else b"HTTP/1.1 200")


def test_a_tag_gives_a_behaviour_a_path_of_its_own_in_the_log(server: HostileServer) -> None:
    tagged = server.url("no-done", "row-a")
    assert tagged.endswith("/b/no-done+row-a/v1")
    _get(tagged + "?api-key=q1", "completions", "x", key="tagged")
    _get(server.url("no-done"), "completions", "x", key="untagged")
    [mine] = server.served("no-done", "row-a")
    assert mine["behaviour"] == "no-done" and ("Authorization", "Bearer tagged") in mine["headers"]
    assert mine["target"] == "/b/no-done+row-a/v1/chat/completions?api-key=q1"
    assert mine["path"] == "/b/no-done+row-a/v1/chat/completions"
    assert all(("Authorization", "Bearer tagged") not in e["headers"] for e in server.served("no-done"))
    with pytest.raises(ValueError, match="no tag"):
        server.url("reset-connect", "row-b")


def test_echo_auth_sends_back_the_authorization_header_and_the_query(server: HostileServer) -> None:
    answer = _get(server.url("echo-auth") + "?api-key=q%2F2", "completions", "x", key="s3cr/t+=")
    assert b"raw=Bearer s3cr/t+=" in answer and b"key-b64=czNjci90Kz0=" in answer
    assert b"target=/b/echo-auth/v1/chat/completions?api-key=q%2F2" in answer


def test_models_lists_the_behaviour_by_name_and_metrics_is_absent(server: HostileServer) -> None:
    assert b'"id":"gzip"' in _get(server.url("gzip"), "models")
    assert _get(server.url("gzip"), "metrics").startswith(b"HTTP/1.1 404")


def test_the_log_keeps_every_header_as_received(server: HostileServer) -> None:
    _get(server.url("echo-auth"), "completions", "x", key="s3cr/t+=")
    entry = server.served("echo-auth")[-1]
    assert ("Authorization", "Bearer s3cr/t+=") in entry["headers"]
    assert entry["end"] == "complete" and entry["bytes_sent"] > 0 and entry["t_end_wall_ns"] is not None


@pytest.mark.timing
def test_every_behaviour_ends_inside_its_caps(server: HostileServer) -> None:
    async def all_of_them() -> list[bytes]:
        reqs = [_request(server.url(b.name), b.route, b.name, key=f"bounded-{b.name}") for b in BEHAVIOURS.values()]
        return await asyncio.gather(*(_exchange(*r, limit_s=CAP_S + 20) for r in reqs))

    t0 = time.monotonic()
    answers = asyncio.run(all_of_them())
    assert time.monotonic() - t0 < CAP_S + 20, "the server did not close some exchange at its time cap"
    assert all(len(a) <= CAP_BYTES + (1 << 16) for a in answers)

    def logged(name: str) -> list[dict[str, Any]]:
        entries = [e for e in server.served(name) if ("Authorization", f"Bearer bounded-{name}") in e["headers"]]
        return entries or server.served(name)[-1:]  # connection-level behaviours log no headers

    # the server's thread logs an exchange's end once it has closed it: on a loaded box, a moment
    # after the client saw the close (ended inside its cap all the same: the time asserted above)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
        logged(b.name) and all(e["end"] is not None for e in logged(b.name)) for b in BEHAVIOURS.values()
    ):
        time.sleep(0.05)
    for b in BEHAVIOURS.values():
        entries = logged(b.name)
        assert entries and all(e["end"] is not None for e in entries), b.name
        assert all(e["bytes_sent"] <= CAP_BYTES for e in entries), b.name
    ends = {name: server.served(name)[-1]["end"] for name in ("endless-line", "models-endless", "never-answer")}
    assert ends == {"endless-line": "cap bytes", "models-endless": "cap bytes", "never-answer": "cap time"}
    # a well-formed answer is not cut by the caps: sent alone (in the flood above, a loaded box can
    # hold the server's thread past the time cap before the answer is out)
    asyncio.run(_exchange(*_request(server.url("ok"), "completions", "ok", key="alone"), limit_s=CAP_S + 20))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.served("ok")[-1]["end"] is None:
        time.sleep(0.05)
    assert server.served("ok")[-1]["end"] == "complete"


def test_as_a_subprocess_it_prints_its_url_logs_each_request_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "served.jsonl"
    script = Path(__file__).with_name("hostile.py")
    cmd = [sys.executable, str(script), "--port", "0", "--log", str(log)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert _get(url, "completions", "ok").startswith(b"HTTP/1.1 200")
        u = urlsplit(url)
        listing = asyncio.run(_exchange(u.hostname or "", u.port or 0, b"GET /_hostile/urls HTTP/1.1\r\n\r\n", 2))
        urls = orjson.loads(listing.split(b"\r\n\r\n", 1)[1])
        assert set(urls) == set(BEHAVIOURS) and urls["gzip"] == url.replace("/v1", "/b/gzip/v1")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    events = [orjson.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events] == ["arrived", "ended"]
    assert events[1]["behaviour"] == "ok" and events[1]["end"] == "complete"
