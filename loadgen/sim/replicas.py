"""``loadgen sim --replicas N``: N independent simulated engines behind one port, as a data-parallel deployment.

Each replica is an ordinary ``loadgen sim`` process with its own timing model, its own
queue and its own ground truth. They all listen on the same address with ``SO_REUSEPORT``,
so the kernel spreads the connections over them by a hash of each connection's addresses:
the random routing of a layer-4 balancer in front of N engine replicas. A connection stays
with the replica it landed on (as behind such a balancer); a client that opens many
connections spreads its requests over all of them. One machine so hosts a target that
several client processes can push, with one core per replica.

Each replica also listens on a port of its own (``own``), so that its ``/metrics`` can be
scraped (or it can be sent to) directly, as a pod's own address behind a Service. With
``--truth FILE`` replica i writes its ground truth to ``FILE`` with ``.r{i}`` before the
suffix. On a stop (SIGINT, SIGTERM) the parent scrapes every replica's ``/metrics``,
stops them, and prints one line per replica: what it served and where its truth is.

The replicas die with the parent, however it ends: each runs on a ``loadgen.lifeline``
(the parent-death signal and a pipe), as the simulator ``run`` starts does. The parent
holds a bound, non-listening socket on the shared port for as long as it runs: it
reserves the port (``--port 0`` picks one) and takes no connections itself.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TextIO

from loadgen.errors import ConfigError, EndpointError
from loadgen.lifeline import Lifelines, pdeathsig_safe
from loadgen.sim.process import READY

__all__ = ["Replica", "serve_replicas", "truth_path", "read_metrics", "reserve_port", "REPLICA"]

REPLICA = "LOADGEN_SIM_REPLICA "  # with --announce: one line per replica, "I PID OWN_URL", before READY
_START_TIMEOUT_S = 60.0  # N interpreters starting at once on a loaded box
_STOP_TIMEOUT_S = 5.0
_SCRAPE_TIMEOUT_S = 2.0


@dataclass
class Replica:
    """One replica process, as the parent knows it."""

    index: int
    proc: subprocess.Popen[bytes]
    truth: str | None
    own: str = ""  # its own address's base URL (…/v1)
    metrics: dict[str, float] = field(default_factory=dict)  # scraped at the stop


def truth_path(truth: str, index: int) -> str:
    """Replica ``index``'s ground-truth file: ``truth.jsonl`` -> ``truth.r0.jsonl``."""
    p = Path(truth)
    return str(p.with_name(f"{p.stem}.r{index}{p.suffix}"))


def read_metrics(text: str) -> dict[str, float]:
    """The simulator's Prometheus text (``vllm:NAME{labels} VALUE``) as {NAME: VALUE}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0].removeprefix("vllm:")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound socket with ``SO_REUSEPORT`` on (host, port), not listening: the port is held for the
    replicas (port 0: a free one) while the kernel hands this socket no connection."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: {e.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot share this address ({e.strerror})") from None
    return sock


def _command(flags: list[str], host: str, port: int, fd: int, truth: str | None) -> list[str]:
    sim = ["loadgen", "sim", *flags, *(["--truth", truth] if truth else [])]
    sim += ["--host", host, "--port", str(port), "--reuse-port", "--announce"]
    pdeathsig = "1" if pdeathsig_safe() else "0"
    return [sys.executable, "-m", "loadgen.lifeline", str(os.getpid()), str(fd), pdeathsig, *sim]


def _start(n: int, flags: list[str], host: str, port: int, truth: str | None, lifelines: Lifelines) -> list[Replica]:
    """Start the N replicas at once, then wait until every one listens."""
    replicas: list[Replica] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for i in range(n):
        fd = lifelines.open()
        mine = truth_path(truth, i) if truth else None
        try:
            proc = subprocess.Popen(
                _command(flags, host, port, fd, mine),
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=env,
                pass_fds=(fd,),
                start_new_session=True,  # a terminal's Ctrl-C is the parent's, which stops them in order
            )
        finally:
            os.close(fd)
        replicas.append(Replica(i, proc, mine))
    # read from the pipes themselves: a buffered reader could hold a line that select() no longer sees
    waiting = {r.proc.stdout.fileno(): r for r in replicas if r.proc.stdout is not None}
    pending = dict.fromkeys(waiting, b"")
    deadline = time.monotonic() + _START_TIMEOUT_S
    while waiting and time.monotonic() < deadline:
        ready, _, _ = select.select(list(waiting), [], [], 0.1)
        for fd in ready:
            r = waiting[fd]
            data = os.read(fd, 4096)
            if not data:
                raise EndpointError(f"replica {r.index} did not start (exit {r.proc.wait()}): see its stderr above")
            pending[fd] += data
            for line in pending[fd].decode("utf-8", "replace").splitlines():
                if line.startswith(READY):
                    r.own = line[len(READY) :].split()[-1]
                    del waiting[fd]
                    break
    if waiting:
        raise EndpointError(f"{len(waiting)} of {n} replicas did not start within {_START_TIMEOUT_S:g} s")
    return replicas


def _scrape(r: Replica) -> None:
    try:
        with urllib.request.urlopen(r.own.removesuffix("/v1") + "/metrics", timeout=_SCRAPE_TIMEOUT_S) as resp:
            r.metrics = read_metrics(resp.read().decode("utf-8", "replace"))
    except OSError:
        r.metrics = {}


def _stop(replicas: list[Replica]) -> None:
    for r in replicas:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
    for r in replicas:
        try:
            r.proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()
        if r.proc.stdout is not None:
            r.proc.stdout.close()


def _started(r: Replica) -> str:
    truth = f", its truth in {r.truth}" if r.truth else ""
    return f"loadgen sim: replica {r.index}: pid {r.proc.pid}, its own address {r.own}{truth}"


def _report(r: Replica) -> str:
    m = r.metrics
    if not m:
        served = "its metrics could not be read"
    else:
        served = (
            f"{int(m.get('request_success_total', 0))} requests, "
            f"{int(m.get('prompt_tokens_total', 0))} prompt and {int(m.get('generation_tokens_total', 0))} "
            f"output tokens, {int(m.get('num_preemptions_total', 0))} preemptions"
        )
    truth = f"; truth in {r.truth}" if r.truth else ""
    return f"loadgen sim: replica {r.index} (pid {r.proc.pid}, {r.own}): {served}{truth}"


def serve_replicas(
    n: int,
    flags: list[str],
    *,
    host: str,
    port: int,
    truth: str | None,
    announce: bool,
    out: TextIO | None = None,
) -> int:
    """Serve ``n`` replicas of ``loadgen sim FLAGS`` on (host, port) until SIGINT or SIGTERM (or a replica
    ends by itself: exit 1); print each replica's report at the end. ``flags``: the simulator options
    (no ``--truth``: each replica's is ``truth_path(truth, i)``)."""
    say = out or sys.stdout
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    held = reserve_port(host, port)
    port = held.getsockname()[1]
    lifelines = Lifelines()
    replicas: list[Replica] = []
    code = 0
    try:
        replicas = _start(n, flags, host, port, truth, lifelines)
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{port}/v1"
        for r in replicas:
            line = f"{REPLICA}{r.index} {r.proc.pid} {r.own}" if announce else _started(r)
            print(line, file=say, flush=True)
        if announce:
            print(READY + url, file=say, flush=True)
        else:
            print(f"loadgen sim serving {n} replicas at {url} (Ctrl-C to stop)", file=say, flush=True)
        while not stop.wait(0.2):
            ended = [r for r in replicas if r.proc.poll() is not None]
            if ended:
                r = ended[0]
                print(f"loadgen sim: replica {r.index} ended (exit {r.proc.returncode}): stopping", file=sys.stderr)
                code = 1
                break
        for r in replicas:
            if r.proc.poll() is None:
                _scrape(r)
    finally:
        _stop(replicas)
        lifelines.close()
        held.close()
    for r in replicas:
        print(_report(r), file=say, flush=True)
    return code
