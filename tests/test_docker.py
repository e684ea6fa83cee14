"""docker/: the compose file and Dockerfile say what they should, and every loadgen command in them parses.

There is no Docker engine in CI, so these are static checks: what would break at
``docker compose up`` time without anyone noticing (a renamed CLI flag, an engine flag
typo, a missing GPU reservation, a root user) fails here instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadgen.cli.main import build_parser

DOCKER = Path(__file__).resolve().parent.parent / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def services(compose: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if name.startswith(prefix)}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_services_and_images(compose: dict[str, Any]) -> None:
    svc = compose["services"]
    assert set(svc) == {"vllm", "loadgen-vllm", "llamacpp", "loadgen-llamacpp"}
    assert svc["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert svc["llamacpp"]["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    for name, s in services(compose, "loadgen-").items():
        assert s["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}, name
        assert (COMPOSE.parent / s["build"]["context"] / s["build"]["dockerfile"]).resolve() == DOCKERFILE
        assert "./runs:/runs" in s["volumes"]
        engine = name.removeprefix("loadgen-")
        assert s["profiles"] == svc[engine]["profiles"] == [engine]
        assert s["depends_on"] == {engine: {"condition": "service_healthy"}}
        assert "healthcheck" in svc[engine]


def test_vllm_reserves_nvidia_gpus_and_uses_real_flags(compose: dict[str, Any]) -> None:
    vllm = compose["services"]["vllm"]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    cmd = [str(a) for a in vllm["command"]]
    for f in ("--model", "--served-model-name", "--max-model-len", "--host", "--port"):
        assert f in cmd, f
    assert int(flag(cmd, "--max-model-len")) > 0 and flag(cmd, "--port") == "8000"
    # loadgen asks for the name vLLM serves under
    assert flag(compose["services"]["loadgen-vllm"]["command"], "--model") == flag(cmd, "--served-model-name")


def test_llamacpp_server_flags(compose: dict[str, Any]) -> None:
    cmd = [str(a) for a in compose["services"]["llamacpp"]["command"]]
    for f in ("-m", "--host", "--port", "--metrics", "-np", "-c"):
        assert f in cmd, f
    assert flag(cmd, "-m").startswith("/models/") and flag(cmd, "--host") == "0.0.0.0"
    assert int(flag(cmd, "-np")) >= 1 and int(flag(cmd, "-c")) >= 1024
    assert "./models:/models:ro" in compose["services"]["llamacpp"]["volumes"]


@pytest.mark.parametrize("engine, port", [("vllm", "8000"), ("llamacpp", "8080")])
def test_loadgen_commands_parse_with_the_real_cli(compose: dict[str, Any], engine: str, port: str) -> None:
    service = compose["services"][f"loadgen-{engine}"]
    argv = [str(a) for a in service["command"]]
    args = build_parser().parse_args(argv)  # an unknown flag or bad choice exits here
    assert args.command == "sweep"
    assert args.endpoint == f"http://{engine}:{port}/v1"
    server = [str(a) for a in compose["services"][engine]["command"]]
    assert flag(server, "--port") == port
    assert args.out.startswith("/runs/") and args.live is False
    from loadgen.cli.sweep_cmd import settings_from_args

    settings_from_args(args)  # rates, SLO and durations are valid values too, not just known flags


def test_dockerfile_runs_the_cli_as_a_non_root_user_writing_to_runs() -> None:
    text = DOCKERFILE.read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[0].startswith("FROM python:3.12-slim")
    assert 'ENTRYPOINT ["loadgen"]' in lines
    users = [ln for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0")
    assert lines.index(users[-1]) < lines.index('ENTRYPOINT ["loadgen"]')
    assert 'VOLUME ["/runs"]' in lines
    assert re.search(r"useradd .*loadgen", text) and "chown loadgen:loadgen /runs" in text
    # everything the package build needs is copied in (pyproject maps these folders into the wheel)
    for folder in ("loadgen", "workloads", "conformance", "reports"):
        assert f"COPY {folder} ./{folder}" in text
        assert f"!{folder}/**" in (DOCKER / "Dockerfile.dockerignore").read_text()
