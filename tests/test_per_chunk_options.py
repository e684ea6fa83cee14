"""Per-chunk token counting as a run is told it: the flags, the request body, the traffic fingerprints.

``--per-chunk-usage auto|on|off`` and ``--tokenizer`` reach the engine's config through the
run's settings; asking for running usage adds ``continuous_usage_stats`` to the body's
``stream_options`` (merged with any the user gives), and the traffic fingerprints do not see
``stream_options``, so a run with per-chunk usage and one without sent the same traffic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.cli.main import build_parser, main
from loadgen.cli.run_settings import resolve_workload, settings_from_args
from loadgen.cli.sweep_cmd import settings_from_args as sweep_settings_from_args
from loadgen.client.fingerprint import first_request, without_stream_options
from loadgen.client.settings import RunSettings, engine_config
from loadgen.errors import ConfigError
from loadgen.workload.session import Conversation, Turn, build_body

ENDPOINT = "http://127.0.0.1:9/v1"  # nothing listens: every case here ends before a byte is sent
RUN = ["run", "--endpoint", ENDPOINT, "--rate", "1", "--model", "m"]


def tokenizer_file(tmp_path: Path) -> Path:
    """A tiny word-level Hugging Face tokenizer.json, built here, offline."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    out = tmp_path / "tokenizer.json"
    tk.save(str(out))
    return out


def conv(text: str = "hi") -> Conversation:
    c = Conversation("system prompt")
    c.add_turn(Turn(text=text, max_tokens=8))
    return c


# -- the flags -----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_both_commands_take_the_flags_with_their_defaults(command: str) -> None:
    parse = build_parser().parse_args
    assert (parse([command]).per_chunk_usage, parse([command]).tokenizer) == ("auto", None)
    args = parse([command, "--per-chunk-usage", "off", "--tokenizer", "builtin"])
    assert (args.per_chunk_usage, args.tokenizer) == ("off", "builtin")


def test_the_flags_reach_the_settings_and_the_engine_config(tmp_path: Path) -> None:
    tok = tokenizer_file(tmp_path)
    args = build_parser().parse_args([*RUN, "--per-chunk-usage", "on", "--tokenizer", str(tmp_path)])
    s = settings_from_args(args)
    assert (s.per_chunk_usage, s.tokenizer) == ("on", str(tok.resolve()))  # a folder means its tokenizer.json
    cfg = engine_config(s, ENDPOINT, "m", "r")
    assert cfg.continuous_usage is True and cfg.tokenizer == str(tok.resolve())
    sweep = sweep_settings_from_args(
        build_parser().parse_args(["sweep", "--rates", "1", "--point-duration", "5", "--per-chunk-usage", "off"])
    )
    assert sweep.base.per_chunk_usage == "off" and sweep.base.tokenizer is None


def test_auto_is_not_asked_until_it_is_resolved() -> None:
    s = RunSettings(endpoint=ENDPOINT, model="m")
    assert s.per_chunk_usage == "auto" and engine_config(s, ENDPOINT, "m", "r").continuous_usage is False


def test_the_tokenizer_defaults_to_the_one_the_workload_spec_names(tmp_path: Path) -> None:
    tok = tokenizer_file(tmp_path)
    spec = tmp_path / "w.yaml"
    spec.write_text(f"kind: chat\ninput: 4\noutput: 4\ntokens:\n  tokenizer: {tok.name}\n")
    args = build_parser().parse_args([*RUN, "--workload", str(spec)])
    assert settings_from_args(args, resolve_workload(args)).tokenizer == str(tok.resolve())
    args = build_parser().parse_args([*RUN, "--workload", str(spec), "--tokenizer", "none"])
    assert settings_from_args(args, resolve_workload(args)).tokenizer is None
    args = build_parser().parse_args([*RUN, "--workload", "chat"])  # a built-in spec names none
    assert settings_from_args(args, resolve_workload(args)).tokenizer is None


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--per-chunk-usage", "maybe"], "argument --per-chunk-usage: invalid choice: 'maybe'"),
        (["--tokenizer", "/nonexistent/tok.json"], "--tokenizer: /nonexistent/tok.json: no such tokenizer file"),
        (["--tokenizer", "JUNK"], "--tokenizer: "),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(
    argv: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "JUNK").write_text("{not a tokenizer")
    for command in (RUN, ["sweep", "--endpoint", ENDPOINT, "--rates", "1", "--model", "m"]):
        try:
            code = main([*command, *argv, "--out", str(tmp_path / "out"), "--no-live"])
        except SystemExit as stop:  # argparse's own errors
            code = int(stop.code or 0)
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("loadgen: error: ") and err.count("\n") == 1, err
        assert says in err
        assert not (tmp_path / "out").exists()  # refused before anything was started or sent


@pytest.mark.parametrize(
    "kw, message",
    [(dict(per_chunk_usage="yes"), "--per-chunk-usage 'yes'"), (dict(tokenizer=" "), "--tokenizer ' '")],
)
def test_the_settings_refuse_a_bad_value_naming_its_flag(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunSettings(endpoint=ENDPOINT, model="m", **kw)


# -- the request body ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "continuous, extra, options",
    [
        (False, None, {"include_usage": True}),
        (True, None, {"include_usage": True, "continuous_usage_stats": True}),
        # an --extra-body stream_options is merged in: include_usage is not silently lost
        (False, {"stream_options": {"x": 1}}, {"include_usage": True, "x": 1}),
        (True, {"stream_options": {"x": 1}}, {"include_usage": True, "continuous_usage_stats": True, "x": 1}),
        # what it names explicitly wins; a stream_options that is no object replaces loadgen's
        (True, {"stream_options": {"include_usage": False}}, {"include_usage": False, "continuous_usage_stats": True}),
        (True, {"stream_options": None}, None),
    ],
)
def test_the_body_asks_for_running_usage_when_told(
    continuous: bool, extra: dict[str, Any] | None, options: dict[str, Any] | None
) -> None:
    body = orjson.loads(build_body("chat", "m", conv(), 8, extra=extra, continuous_usage=continuous))
    assert body["stream_options"] == options
    assert body["stream"] is True and body["max_tokens"] == 8 and body["messages"][-1]["content"] == "hi"


# -- the traffic fingerprints --------------------------------------------------------------------
@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("extra", [None, {"stream_options": {"x": [1, "}"]}, "temperature": 0}])
def test_per_chunk_usage_does_not_change_the_traffic_fingerprints(api: str, extra: dict[str, Any] | None) -> None:
    salt = b"SALT-123"
    plain = build_body(api, "m", conv("SALT-123 question"), 8, extra=extra)
    asked = build_body(api, "m", conv("SALT-123 question"), 8, extra=extra, continuous_usage=True)
    assert plain != asked
    assert first_request(plain, salt, b'"m"') == first_request(asked, salt, b'"m"')
    other = build_body(api, "m", conv("SALT-123 another question"), 8, extra=extra, continuous_usage=True)
    assert first_request(other, salt, b'"m"') != first_request(asked, salt, b'"m"')  # the text still counts


@pytest.mark.parametrize(
    "doc",
    [
        {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 3},
        {"model": "m", "stream_options": {"a": {"b": '}{\\"'}, "c": [1, {}]}, "n": 1},
        {"model": "m", "stream": True, "stream_options": "odd"},  # the last member, a scalar
        {"model": "m", "stream_options": None, "prompt": 'say "stream_options": no'},
        {"model": "m", "prompt": "no options"},
    ],
)
def test_stream_options_is_cut_out_leaving_the_rest_of_the_body(doc: dict[str, Any]) -> None:
    rest = {k: v for k, v in doc.items() if k != "stream_options"}
    assert orjson.loads(without_stream_options(orjson.dumps(doc))) == rest
