"""RunSettings: frozen, validated at construction with messages that name the flag, its defaults the CLI's."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from loadgen.cli.main import build_parser
from loadgen.cli.run_settings import settings_from_args
from loadgen.client.config import Timeouts
from loadgen.client.point import cpu_utilisation
from loadgen.client.run import command_line
from loadgen.client.settings import MAX_REQUESTS, RunSettings, engine_config, settings_json
from loadgen.errors import ConfigError
from loadgen.redaction import Secrets
from loadgen.schedule import Arrival

POISSON = Arrival("poisson", rate=10.0)


def settings(**kw: Any) -> RunSettings:
    return RunSettings(**{"endpoint": "http://127.0.0.1:8000/v1", "model": "m", **kw})


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(endpoint="http://127.0.0.1:99999/v1"), r"--endpoint .*port out of range"),
        (dict(endpoint="http://[::1"), r"--endpoint .*invalid ipv6"),
        (dict(endpoint="localhost:8000"), "--endpoint 'localhost:8000': expected an OpenAI base URL"),
        (dict(endpoint="http://127.0.0.1:0/v1"), "port 0"),
        (dict(model=""), "--model ''"),
        (dict(api="assistants"), "--api 'assistants'"),
        (dict(server_metrics="metrics"), "--server-metrics 'metrics'"),
        (dict(arrival=Arrival("poisson", rate=2e6)), r"--rate 2000000.0: must be a finite number in \(0, 1,000,000\]"),
        (dict(arrival=Arrival("closed", concurrency=200_000)), "--concurrency 200000"),
        (dict(duration_s=None, requests=None), "give --duration or --requests"),
        (dict(duration_s=float("nan")), "--duration nan"),
        (dict(duration_s=float("inf")), "--duration inf"),
        (dict(duration_s=0.0), r"--duration 0.0: must be a finite number in \(0,"),
        (dict(duration_s=1e308), "--duration 1e"),
        (dict(requests=0), r"--requests 0: must be an integer in \[1, 10,000,000\]"),
        (dict(requests=MAX_REQUESTS + 1), "--requests 10000001"),
        (dict(requests=2.5), "--requests 2.5: must be an integer"),
        (dict(arrival=Arrival("poisson", rate=1e6), duration_s=11.0), "more than a run's limit of 10,000,000"),
        (dict(seed=-1), "--seed -1"),
        (dict(seed=True), "--seed True"),
        (dict(seed=2**64), "--seed"),
        (dict(warmup_s=-1.0), "--warmup -1.0"),
        (dict(cooldown_s=float("nan")), "--cooldown nan"),
        (dict(duration_s=5.0, warmup_s=3.0, cooldown_s=3.0), "no measurement window"),
        (dict(max_inflight=0), "--max-inflight 0"),
        (dict(drain_s=float("inf")), "--drain inf"),
        (dict(drain_s=-1.0), r"--drain -1.0: must be a finite number in \[0,"),
        (dict(max_inflight=-3), "--max-inflight -3"),
        (dict(lag_limit_ms=0.0), "--lag-limit-ms 0.0"),
        (dict(workers=0), "--workers 0"),
        (dict(workers=4, arrival=Arrival("closed", concurrency=2)), "--workers 4 exceeds --concurrency 2"),
        (dict(extra_body=[1]), "--extra-body"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_flag(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings(**kw)


def test_a_count_within_the_cap_needs_no_duration_bound() -> None:
    """--requests bounds a run as rate x duration does: a high rate with a count is fine."""
    s = settings(arrival=Arrival("poisson", rate=1e6), duration_s=100.0, requests=1000)
    assert s.requests == 1000


def test_settings_are_frozen_and_replace_validates_again() -> None:
    s = settings(arrival=POISSON)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 3  # type: ignore[misc] # the point: it is frozen
    with pytest.raises(ConfigError, match="--duration"):
        dataclasses.replace(s, duration_s=float("nan"))  # how a sweep makes each point


def test_the_cli_defaults_are_the_dataclass_defaults() -> None:
    """`loadgen run --rate R --duration D` builds exactly RunSettings(...) with nothing else given."""
    args = build_parser().parse_args(["run", "--endpoint", "http://127.0.0.1:8000/v1", "--rate", "10"])
    got = settings_from_args(args)
    want = RunSettings(endpoint="http://127.0.0.1:8000/v1", model=None, arrival=POISSON)
    assert got == want
    assert got.timeouts == Timeouts()


def test_a_closed_loop_given_no_length_sends_a_count() -> None:
    args = build_parser().parse_args(["run", "--concurrency", "4"])
    got = settings_from_args(args)
    assert got.duration_s is None and got.requests == 100


def test_the_engine_config_comes_from_the_settings() -> None:
    s = settings(
        arrival=POISSON,
        api="completions",
        timeouts=Timeouts(connect=2.0),
        ignore_eos=False,
        keep_text=True,
        max_inflight=7,
        extra_body={"temperature": 0},
        point=3,
    )
    cfg = engine_config(s, "http://user:pw@127.0.0.1:8000/v1", "m", "run-1", shard=1, shards=2)
    assert (cfg.url, cfg.model, cfg.run_id, cfg.shard, cfg.shards) == (
        "http://user:pw@127.0.0.1:8000/v1",
        "m",
        "run-1",
        1,
        2,
    )
    assert cfg.endpoint_label == "http://127.0.0.1:8000/v1"  # no credentials in what is written down
    assert (cfg.api, cfg.path, cfg.point, cfg.max_inflight) == ("completions", "/completions", 3, 7)
    assert cfg.timeouts == Timeouts(connect=2.0) and not cfg.ignore_eos and cfg.keep_text
    assert cfg.extra_body == {"temperature": 0}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--rate", "1", "--drain", "-1"], "--drain"),
        (["run", "--rate", "1", "--max-inflight", "0"], "--max-inflight"),
        (["sweep", "--drain", "-1"], "--drain"),
    ],
)
def test_a_negative_drain_or_no_inflight_slot_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("loadgen: error: ") and message in err
    assert err.count("\n") == 1


def test_run_json_keeps_the_endpoint_without_credentials() -> None:
    s = settings(
        endpoint="http://user:sk-in-url-123@127.0.0.1:8000/v1?api-key=sk-in-query-456",
        server_metrics="http://u:p4ssw0rd@127.0.0.1:8000/metrics?token=abc",
    )
    d = settings_json(s)
    assert d["endpoint"] == "http://127.0.0.1:8000/v1"
    assert d["server_metrics"] == "http://127.0.0.1:8000/metrics"
    assert settings_json(settings(server_metrics="off"))["server_metrics"] == "off"


def test_the_command_line_in_run_json_holds_no_secret() -> None:
    url = "http://me:sk-in-url-123@127.0.0.1:8000/v1?api-key=sk-in-query-456&x=1"
    secrets = Secrets.of(api_key="sk-env-key-789", url=url)
    argv = ["run", "--endpoint", url, "--api-key", "sk-flag-000", "--token=tok-000000", "--input-tokens", "8"]
    argv += ["--api-key-env", "MY_KEY", "--extra-body", '{"note": "sk-env-key-789"}']
    shown = command_line(argv, secrets)
    text = " ".join(shown)
    for secret in ("sk-in-url-123", "sk-in-query-456", "sk-flag-000", "tok-000000", "sk-env-key-789", "me:"):
        assert secret not in text
    assert shown[3:6] == ["--api-key", "[REDACTED]", "--token=[REDACTED]"]
    assert ["--input-tokens", "8", "--api-key-env", "MY_KEY"] == shown[6:10]  # names are no secret
    assert "127.0.0.1:8000/v1" in shown[2]


def test_a_point_too_short_to_judge_gives_no_cpu_share() -> None:
    """A zero-length point read "client CPU saturated (101%)": start-up noise over no time."""
    assert "cpu_utilisation" not in cpu_utilisation(0.02, 0.019)
    assert "too short" in cpu_utilisation(0.02, 0.019)["cpu_utilisation_why_not"]
    assert cpu_utilisation(0.5, 2.0) == {"cpu_utilisation": 0.25}
    assert cpu_utilisation(0.0, 0.0)["cpu_utilisation_why_not"]  # no division by zero
