"""An engine's config and timeouts refuse bad values when built, naming the flag."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from loadgen.client.config import MAX_INFLIGHT, EngineConfig, Timeouts
from loadgen.errors import ConfigError

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("first_byte", NAN, "--first-byte-timeout nan: must be a finite number of seconds > 0"),
        ("idle", 0, "--idle-timeout 0: must be a finite number of seconds > 0"),
        ("total", -5.0, "--request-timeout -5.0: must be a finite number of seconds > 0"),
        ("connect", INF, "--connect-timeout inf: must be a finite number of seconds > 0"),
        ("connect", "10", "--connect-timeout '10': must be a finite number of seconds > 0"),
        ("connect", True, "--connect-timeout True: must be a finite number of seconds > 0"),
        ("total", 1e9, "--request-timeout 1000000000.0: more than 2,592,000 seconds: check the unit"),
    ],
)
def test_a_bad_timeout_is_refused_naming_its_flag(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        Timeouts(**{field: value})
    assert str(e.value) == message


@pytest.mark.parametrize(
    "field,value,flag",
    [
        ("url", "ftp://host/v1", "--endpoint 'ftp://host/v1'"),
        ("model", "  ", "--model '  '"),
        ("api", "assistants", "--api 'assistants'"),
        ("max_inflight", 0, "--max-inflight 0"),
        ("max_inflight", MAX_INFLIGHT + 1, "--max-inflight 1000001"),
        ("max_inflight", 2.5, "--max-inflight 2.5"),
        ("shards", 0, "--workers 0"),
        ("shard", 3, "EngineConfig.shard 3"),
        ("read_bufsize", 16, "EngineConfig.read_bufsize 16"),
        ("read_bufsize", 1 << 40, "EngineConfig.read_bufsize 1099511627776"),
        ("flush_interval_s", NAN, "EngineConfig.flush_interval_s nan"),
        ("flush_interval_s", 0.0, "EngineConfig.flush_interval_s 0.0"),
        ("timeouts", 30, "EngineConfig.timeouts 30"),
        ("extra_body", [1], "--extra-body [1]"),
    ],
)
def test_a_bad_engine_config_is_refused_naming_its_flag(field: str, value: Any, flag: str) -> None:
    with pytest.raises(ConfigError, match="^" + flag.replace("[", r"\[").replace(".", r"\.") + ": "):
        EngineConfig(**{"url": "http://127.0.0.1:8000/v1", "model": "m", field: value})


def test_the_defaults_are_valid_and_the_configs_frozen() -> None:
    cfg = EngineConfig(url="http://127.0.0.1:8000/v1", model="m")
    assert cfg.timeouts == Timeouts() and cfg.max_inflight == 10_000 and cfg.path == "/chat/completions"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_inflight = 5  # type: ignore[misc]  # the point: it cannot be changed
    with pytest.raises(ConfigError):  # replace builds anew, so it validates too
        dataclasses.replace(cfg, timeouts=dataclasses.replace(cfg.timeouts, idle=NAN))


@pytest.mark.parametrize(
    "url,api,request_url",
    [
        ("http://127.0.0.1:8000/v1", "chat", "http://127.0.0.1:8000/v1/chat/completions"),
        ("http://127.0.0.1:8000/v1/", "completions", "http://127.0.0.1:8000/v1/completions"),
        ("http://u:p@h:1/v1?api-key=K&x=1", "chat", "http://u:p@h:1/v1/chat/completions?api-key=K&x=1"),
    ],
)
def test_requests_go_to_the_base_path_with_its_query_kept_after_it(url: str, api: str, request_url: str) -> None:
    assert EngineConfig(url=url, model="m", api=api).request_url == request_url
