"""Reaching a managed endpoint: headers, the key's header, the URL's query, proxies, TLS, preflight.

Each behaviour against a loopback server built for it (tests/endpoint_servers.py): an Azure
OpenAI-style deployment URL that demands ``?api-version=`` and its headers on every route, an
HTTP proxy, a TLS server whose CA is made in the test. Every header value is a secret: no form
of one reaches the run folder, stdout or stderr.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import orjson
import pytest

from loadgen.cli.main import main
from loadgen.client.endpoint import discover_model, fetch_models
from loadgen.client.endpoint_options import EndpointOptions, parse_header
from loadgen.errors import ConfigError, EndpointError
from loadgen.workload.session import Conversation, Turn, build_body
from tests.endpoint_servers import Forwarder, ManagedEndpoint, serving, tls_files
from tests.hostile_checks import RunFiles, secret_forms

KEY = "azure-key-0123456789abcdef"
TOKEN = "gw-token-fedcba9876543210"
AZURE = "/openai/deployments/d"
VERSION = {"api-version": "2024-10-21"}
QUICK = ["--requests", "4", "--rate", "40", "--no-live", "--no-report", "--server-metrics", "off"]


# -- the header flag ------------------------------------------------------------------------------
def test_a_header_value_is_read_from_its_variable_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_TOKEN", TOKEN)
    (tmp_path / "tok").write_text(TOKEN + "\n")
    assert parse_header("X-Token: env:GW_TOKEN") == ("X-Token", TOKEN)
    assert parse_header(f"X-Token: file:{tmp_path / 'tok'}") == ("X-Token", TOKEN)
    assert parse_header("X-Tenant:  blue ") == ("X-Tenant", "blue")


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("X-Token: env:NOT_SET_ANYWHERE", "environment variable NOT_SET_ANYWHERE is not set"),
        ("X-Token: file:/no/such/file", "cannot read /no/such/file"),
        ("X Token: v", "a header name is"),
        ("no colon here", "give 'Name: value'"),
        ("X-Token: a\rb", "line break"),
    ],
)
def test_a_bad_header_is_one_line_and_exit_2(given: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_header(given)
    assert main(["run", "--endpoint", "http://127.0.0.1:9/v1", "--rate", "1", "-H", given]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def test_the_key_goes_in_the_header_named_and_a_given_header_wins() -> None:
    azure = EndpointOptions(api_key_header="api-key", headers=(("X-Token", TOKEN),))
    assert azure.request_headers(KEY) == {"api-key": KEY, "X-Token": TOKEN}
    assert EndpointOptions().request_headers(KEY) == {"Authorization": f"Bearer {KEY}"}
    mine = EndpointOptions(headers=(("authorization", "Bearer mine"),))
    assert mine.request_headers(KEY) == {"authorization": "Bearer mine"}
    assert TOKEN not in repr(azure) and azure.json()["headers"] == ["X-Token"]


@pytest.mark.parametrize(
    ("field", "fields"),
    [("max_tokens", {"max_tokens"}), ("max_completion_tokens", {"max_completion_tokens"}), ("both", None)],
)
def test_the_length_goes_in_the_field_asked_for(field: str, fields: set[str] | None) -> None:
    conv = Conversation(None)
    conv.add_turn(Turn(text="hi", max_tokens=8))
    body = orjson.loads(build_body("chat", "m", conv, 8, max_tokens_field=field))
    sent = {k for k in body if k.startswith("max_")}
    assert sent == (fields or {"max_tokens", "max_completion_tokens"}) and all(body[k] == 8 for k in sent)


# -- an Azure OpenAI-style endpoint: its query and headers on every route, secrets nowhere ----------
@pytest.mark.parametrize("given", ["env:GW_TOKEN", TOKEN], ids=["from-a-variable", "written-out"])
def test_a_deployment_url_keeps_its_query_and_headers_on_every_route_and_no_secret_leaks(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A header's value is a secret whether it comes from a variable or is written out on the
    command line (then it is in the argv loadgen records as the run's command)."""
    server = ManagedEndpoint(AZURE, VERSION, {"api-key": KEY, "X-Token": TOKEN}, echo_every=3)
    monkeypatch.setenv("AZ_KEY", KEY)
    monkeypatch.setenv("GW_TOKEN", TOKEN)
    out = tmp_path / "run"
    with serving(server.app()) as port:
        url = f"http://127.0.0.1:{port}{AZURE}?api-version=2024-10-21"
        args = ["run", "--endpoint", url, "--model", "d", "--api-key-env", "AZ_KEY", "--api-key-header", "api-key"]
        args += ["-H", f"X-Token: {given}", "--out", str(out), *QUICK]
        monkeypatch.setattr(sys, "argv", ["loadgen", *args])  # run.json records the command line
        code = main(args)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    routes = {(s.method, s.path_qs.split("?")[0]) for s in server.seen}
    assert routes == {("GET", f"{AZURE}/models"), ("POST", f"{AZURE}/chat/completions")}
    assert len(server.chats()) == 5  # the preflight's tiny request, then the run's four
    for s in server.seen:
        assert s.path_qs.endswith("?api-version=2024-10-21"), s.path_qs
        assert (s.headers.get("api-key"), s.headers.get("X-Token")) == (KEY, TOKEN)
        assert "Authorization" not in s.headers
    meta = json.loads((out / "run.json").read_text())
    settings = meta["settings"]
    assert settings["headers"] == ["X-Token"] and settings["api_key_header"] == "api-key"
    assert "-H" in meta["command"] and f"X-Token: {given}" not in meta["command"]
    texts = {"stdout": printed.out.encode(), "stderr": printed.err.encode()}
    texts |= {RunFiles(out).where(p): data for p, data in RunFiles(out).files}
    for secret in (KEY, TOKEN):
        leaks = [(where, form) for form, f in secret_forms(secret).items() for where, t in texts.items() if f in t]
        assert not leaks, leaks


# -- preflight ----------------------------------------------------------------------------------------
def test_a_model_the_endpoint_does_not_list_is_one_line_naming_those_it_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = ManagedEndpoint(models=("llama-3.1-8b", "qwen-7b"))
    with serving(server.app()) as port:
        code = main(["run", "--endpoint", f"http://127.0.0.1:{port}/v1", "--model", "gpt-4o", *QUICK])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--model gpt-4o" in err and "lists llama-3.1-8b, qwen-7b" in err and "--no-preflight" in err
    assert not server.chats()  # nothing sent


def test_a_wrong_route_fails_before_the_schedule_and_no_preflight_sends_anyway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ManagedEndpoint(AZURE, VERSION)
    with serving(server.app()) as port:
        wrong = f"http://127.0.0.1:{port}/v1"  # no such route: /v1/models and the tiny request are 404s
        code = main(["run", "--endpoint", wrong, "--model", "d", *QUICK])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"POST http://127.0.0.1:{port}/v1/chat/completions answered HTTP 404" in err
        assert "check --endpoint and --api" in err
        unlisted = f"http://127.0.0.1:{port}{AZURE}?api-version=2024-10-21"
        code = main(["run", "--endpoint", unlisted, "--model", "x", "--no-preflight", "--out", str(tmp_path), *QUICK])
    assert code == 0 and len(server.chats()) == 1 + 4  # the 404'd tiny request, then the run (unchecked)


# -- proxies --------------------------------------------------------------------------------------------
def test_requests_go_through_the_proxy_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server, proxy = ManagedEndpoint(), Forwarder()
    with serving(server.app()) as port, serving(proxy.app()) as proxy_port:
        for name in ("HTTP_PROXY", "http_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy_port}")
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.setenv(name, "")  # loopback is often in a default NO_PROXY: not here
        url = f"http://127.0.0.1:{port}/v1"
        code = main(["run", "--endpoint", url, "--model", "d", "--out", str(tmp_path / "run"), *QUICK])
        assert code == 0, capsys.readouterr().err
        assert len(proxy.forwarded) == len(server.seen) == 1 + 1 + 4  # /models, the tiny request, the run
        assert all(f.split()[1].startswith(url) for f in proxy.forwarded)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.setenv(name, "127.0.0.1")
        asyncio.run(discover_model(url, None))
    assert len(proxy.forwarded) == 6 and len(server.seen) == 7  # NO_PROXY: straight to the endpoint


# -- TLS ----------------------------------------------------------------------------------------------------
def test_a_private_ca_and_a_client_certificate_are_used_and_an_unknown_ca_is_refused(tmp_path: Path) -> None:
    tls = tls_files(tmp_path)
    server = ManagedEndpoint()
    with serving(server.app(), tls.server_context(client_certs=True)) as port:
        url = f"https://127.0.0.1:{port}/v1"
        mutual = EndpointOptions(
            ca_bundle=str(tls.ca), client_cert=str(tls.client_cert), client_key=str(tls.client_key)
        )
        assert asyncio.run(discover_model(url, None, http=mutual)) == "d"
        with pytest.raises(EndpointError, match="cannot reach .*certificate verify failed"):
            asyncio.run(fetch_models(url, None))  # the system's CAs do not know it
        with pytest.raises(EndpointError, match="cannot reach"):
            asyncio.run(fetch_models(url, None, http=EndpointOptions(ca_bundle=str(tls.ca))))  # no client cert
    with pytest.raises(ConfigError, match="--ca-bundle: not a usable certificate file"):
        EndpointOptions(ca_bundle=str(tls.server_key))


def test_insecure_skips_verification_with_a_warning_and_says_so_in_run_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = tls_files(tmp_path)
    server = ManagedEndpoint()
    out = tmp_path / "run"
    with serving(server.app(), tls.server_context()) as port:
        url = f"https://127.0.0.1:{port}/v1"
        code = main(["run", "--endpoint", url, "--model", "d", "--insecure", "--out", str(out), *QUICK])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "warning: --insecure: the endpoint's TLS certificate is not verified" in err
    assert json.loads((out / "run.json").read_text())["settings"]["insecure"] is True
    assert len(server.chats()) == 5
