"""deploy/: the distributed compose file and Kubernetes manifests run commands the CLI really has.

No Docker engine or cluster in CI: static checks. Every loadgen command in them parses with
the real parser, the workers connect where the master listens (host and port), the master
waits for as many workers as are deployed, and its bind is the explicit non-loopback one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loadgen.cli.main import build_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
COMPOSE = DEPLOY / "compose.distributed.yaml"
KUBE = DEPLOY / "kubernetes" / "loadgen-distributed.yaml"


def parse(argv: list[str]) -> Any:
    return build_parser().parse_args([str(a) for a in argv])


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


@pytest.fixture(scope="module")
def kube() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(KUBE.read_text())}


def test_compose_commands_parse_and_meet(compose: dict[str, Any]) -> None:
    s = compose["services"]
    sim, master, worker = parse(s["sim"]["command"]), parse(s["master"]["command"]), parse(s["worker"]["command"])
    assert sim.command == "sim" and master.command == "run" and worker.command == "worker"
    assert master.master and master.master_bind_host == "0.0.0.0"
    assert worker.master_host == "master" and worker.master_port == master.master_bind_port
    assert f"{master.master_bind_port}" in s["master"]["expose"]
    assert master.expect_workers == s["worker"]["deploy"]["replicas"]
    assert master.endpoint == f"http://sim:{sim.port}/v1"


def test_kubernetes_commands_parse_and_meet(kube: dict[str, dict[str, Any]]) -> None:
    service, job, deployment = kube["Service"], kube["Job"], kube["Deployment"]
    (m,) = job["spec"]["template"]["spec"]["containers"]
    (w,) = deployment["spec"]["template"]["spec"]["containers"]
    master, worker = parse(m["args"]), parse(w["args"])
    assert master.command == "run" and master.master and master.master_bind_host == "0.0.0.0"
    assert worker.command == "worker" and worker.master_host == service["metadata"]["name"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == worker.master_port and port["targetPort"] == master.master_bind_port
    assert service["spec"]["selector"] == job["spec"]["template"]["metadata"]["labels"]
    assert master.expect_workers == deployment["spec"]["replicas"]
    assert m["image"] == w["image"]
