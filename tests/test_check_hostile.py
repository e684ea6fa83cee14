"""`loadgen check` against a hostile endpoint: it leaks no secret (an endpoint that echoes the key,
raw, URL-encoded or base64, in headers, error bodies and stream chunks, finds it in no output file
and on no terminal line), reads no body without a cap, and says what a compressing server did.

Behaviours of the hostile endpoint (tests/hostile.py): ``echo-auth`` streams the Authorization
header back in content, model and finish_reason (and headers), ``echo-auth-error`` answers 401
with it in the error message, ``echo-auth-stream-error`` sends it in an in-stream error.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from hostile import HostileServer, serve_in_thread
from hostile_checks import secret_forms
from junit_schema import junit_problems

from loadgen.cli.main import main as cli_main
from loadgen.conformance.ci_outputs import Case, Outcome, to_json, to_junit, to_markdown
from loadgen.redaction import Secrets

SECRET = "chk-Q7mZ4tWb2Xp9/Lr8+Vn3Ks="
PASSWORD = "pw-Hx81Ld0Qz7Rk"
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u202a-\u202e\u2066-\u2069]")


def leaks(secret: str, texts: dict[str, str]) -> list[str]:
    forms = {form: f.decode() for form, f in secret_forms(secret).items()}
    return [f"{form} in {where}" for where, t in texts.items() for form, f in forms.items() if f in t]


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with serve_in_thread(cap_s=10) as server:
        yield server


def run_cli(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, dict[str, str]]:
    monkeypatch.setenv("COLUMNS", "1000")  # rich wraps nothing, so no key hides across a line break
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    files = {"junit": tmp_path / "c.xml", "json": tmp_path / "c.json"}
    rc = cli_main(["check", *args, "--timeout", "5", "--streams", "2", *(f"--{k}={v}" for k, v in files.items())])
    out = capsys.readouterr()
    texts = {name: p.read_text(encoding="utf-8") for name, p in {**files, "step summary": summary}.items()}
    return rc, {**texts, "stdout": out.out, "stderr": out.err}


@pytest.mark.parametrize("behaviour", ["echo-auth", "echo-auth-error", "echo-auth-stream-error"])
def test_an_echoed_api_key_is_in_no_output(
    behaviour: str,
    hostile: HostileServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    before = len(hostile.served(behaviour))
    rc, texts = run_cli(["--endpoint", hostile.url(behaviour)], tmp_path, capsys, monkeypatch)
    echoed = hostile.served(behaviour)[before:]
    assert any(v == f"Bearer {SECRET}" for r in echoed for k, v in r["headers"] if k.lower() == "authorization")
    assert rc in (0, 1)  # a verdict, not a crash
    assert leaks(SECRET, texts) == []
    assert "[REDACTED]" in texts["json"]  # the echo was there, and was removed
    assert not [w for w, t in texts.items() if _UNSAFE.search(t)]
    assert junit_problems(texts["junit"]) == []


def test_a_header_given_on_the_command_line_is_in_no_output(
    hostile: HostileServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-H "Authorization: Bearer TOKEN"``, the value written out literally: echo-auth sends it back."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    token = "hdr-Zr5Kq2Wn8/Tb4+Lm7Xc1="
    before = len(hostile.served("echo-auth"))
    args = ["--endpoint", hostile.url("echo-auth"), "-H", f"Authorization: Bearer {token}"]
    rc, texts = run_cli(args, tmp_path, capsys, monkeypatch)
    echoed = hostile.served("echo-auth")[before:]
    assert any(v == f"Bearer {token}" for r in echoed for k, v in r["headers"] if k.lower() == "authorization")
    assert rc in (0, 1)
    assert leaks(token, texts) == []
    assert "[REDACTED]" in texts["json"]


def test_credentials_in_the_endpoint_url_are_in_no_output(
    hostile: HostileServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``http://user:PASSWORD@host/...``: aiohttp sends them as Basic auth, which echo-auth returns."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = hostile.url("echo-auth").replace("http://", f"http://lg-user:{PASSWORD}@")
    rc, texts = run_cli(["--endpoint", url], tmp_path, capsys, monkeypatch)
    assert rc in (0, 1)
    assert leaks(PASSWORD, texts) == []
    assert "lg-user:" not in texts["stdout"] and "lg-user" not in texts["json"]


def test_every_renderer_redacts_what_a_case_carries() -> None:
    """Redaction comes before the escapes: Markdown's backslashes and XML's entities would hide
    a key from a redaction made after them."""
    key = "sk_live_a*b[c]|d<e>&f"
    b64 = base64.b64encode(key.encode()).decode()
    echo = f"raw={key} url={quote(key, safe='')} b64={b64}"
    cases = [Case("c", "fail", f"bad key: {echo}", cells=(("got", echo),)), Case("w", "warn", echo)]
    outcome = Outcome(
        kind="check",
        title=f"t {key}",
        status="fail",
        exit_code=1,
        header=[("model", echo)],
        cases=cases,
        notes=[echo],
        secrets=Secrets.of(api_key=key),
    )
    import orjson

    texts = {
        "junit": to_junit(outcome),
        "markdown": to_markdown(outcome),
        "json": orjson.dumps(to_json(outcome)).decode(),
    }
    escaped = {"md": key.replace("*", "\\*").replace("[", "\\["), "xml": key.replace("&", "&amp;").replace("<", "&lt;")}
    for where, text in texts.items():
        for form in (key, quote(key, safe=""), b64, *escaped.values()):
            assert form not in text, (where, form)
    assert junit_problems(texts["junit"]) == []


def test_an_endless_models_list_is_read_up_to_a_cap(hostile: HostileServer) -> None:
    import asyncio

    from loadgen.conformance.check import run_check
    from loadgen.conformance.check_client import CheckOptions

    out = asyncio.run(run_check(CheckOptions(url=hostile.url("models-endless"), timeout_s=10, streams=2)))
    models = next(c for c in out.cases if c.name == "models-list")
    assert models.status == "warn" and "stopped reading" in models.message
    import time

    deadline = time.monotonic() + 10  # the server logs the end when its write fails: after the client hung up
    while (served := hostile.served("models-endless")[-1])["end"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served["end"] == "client closed" and served["bytes_sent"] < 64 << 20  # the client hung up, not the cap


def test_a_compressed_stream_fails_framing_saying_so(hostile: HostileServer) -> None:
    import asyncio

    from loadgen.conformance.check import run_check
    from loadgen.conformance.check_client import CheckOptions

    out = asyncio.run(run_check(CheckOptions(url=hostile.url("gzip"), timeout_s=10, streams=2)))
    framing = next(c for c in out.cases if c.name == "chat-stream-framing")
    assert framing.status == "fail" and "Content-Encoding: gzip" in framing.message
    sent = hostile.served("gzip")[-1]
    assert ("Accept-Encoding", "identity") in [tuple(h) for h in sent["headers"]]
