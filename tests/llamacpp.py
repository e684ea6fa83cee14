"""llama.cpp's own HTTP server, from the ``xllamacpp`` wheel, as a test fixture.

Why a real engine: the simulator only has the stream shapes we taught it. llama.cpp
brings its own continuous batching over N slots, a prompt cache, ``/tokenize``,
``/slots`` and Prometheus ``/metrics``, and its own quirks (a role-only first chat
chunk with ``content: null``, usage on the completions finish chunk).

The server runs in a child interpreter started with ``python -c`` so a crash in
native code cannot take pytest down. The child is bounded in time (``lifetime_s``),
exits on its own if its parent disappears, and is stopped by PID. It serves a tiny
random-weight model that ``tinymodel.py`` builds offline (once per test process).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from loadgen.sim.process import ChildServer

__all__ = ["LlamaServer", "start_llamacpp", "tiny_model", "READY", "have_xllamacpp"]

READY = "LOADGEN_LLAMACPP_READY "

# The child: build params from a JSON argument, start the server (which listens at
# once), announce the address, then wait for SIGTERM/SIGINT, the lifetime bound, or
# the parent's death. It leaves with os._exit so no native teardown can hang it.
_CHILD = r"""
import json, os, signal, sys, time
cfg = json.loads(sys.argv[1])
parent = os.getppid()
import xllamacpp as x
p = x.CommonParams()
p.model.path = cfg["model"]
p.hostnames = ["127.0.0.1"]
p.port = cfg["port"]
p.n_parallel = cfg["n_parallel"]
p.n_ctx = cfg["n_ctx"]
p.cpuparams.n_threads = cfg["threads"]
p.cpuparams_batch.n_threads = cfg["threads"]
p.n_threads_http = cfg["http_threads"]
p.endpoint_metrics = cfg["metrics"]
p.endpoint_slots = True
p.cache_prompt = cfg["cache_prompt"]
p.verbosity = cfg["verbosity"]
p.warmup = False
p.model_alias = {cfg["alias"]}
server = x.Server(p)
print("LOADGEN_LLAMACPP_READY " + server.listening_address, flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
deadline = time.monotonic() + cfg["lifetime_s"]
while time.monotonic() < deadline and os.getppid() == parent:
    if signal.sigtimedwait([signal.SIGTERM, signal.SIGINT], 0.5) is not None:
        break
os._exit(0)
"""


class LlamaStartError(RuntimeError):
    pass


def have_xllamacpp() -> bool:
    """Whether the wheel imports here (it is in the ``test`` extra; CPU-only is enough)."""
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def tiny_model() -> Path:
    """The tiny GGUF (and its tokenizer.json beside it), built once per process into a temp folder."""
    from tinymodel import build_tiny_model

    folder = Path(tempfile.mkdtemp(prefix="loadgen-tiny-"))
    atexit.register(shutil.rmtree, folder, True)
    return build_tiny_model(folder)


@dataclass
class LlamaServer(ChildServer):
    """A running llama.cpp server child: ``url`` is the OpenAI base URL (``.../v1``)."""

    proc: subprocess.Popen[str]
    root: str  # http://127.0.0.1:PORT
    errlog: IO[Any]
    model_path: Path
    alias: str
    started_s: float  # seconds from spawn to listening
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.root + "/v1"

    @property
    def tokenizer_path(self) -> Path:
        return self.model_path.parent / "tokenizer.json"


def start_llamacpp(
    model: Path | None = None,
    *,
    n_parallel: int = 2,
    n_ctx: int = 4096,
    threads: int = 1,
    http_threads: int = 32,
    metrics: bool = True,
    cache_prompt: bool = True,
    alias: str = "tiny",
    lifetime_s: float = 300.0,
    timeout_s: float = 30.0,
    verbosity: int = 0,
) -> LlamaServer:
    """Start llama.cpp on 127.0.0.1 (a free port) and wait until it listens.

    ``n_ctx`` is the whole KV cache, split evenly over the ``n_parallel`` slots.
    One compute thread by default: the test box has two cores, shared with the client.
    (Requests beyond the slots queue inside llama.cpp, visible as ``requests_deferred``;
    with this build even 3 HTTP threads carried 6 concurrent streams, but HTTP threads
    are idle while they wait, so the default is generous.)
    """
    model = model or tiny_model()
    cfg = {
        "model": str(model),
        "port": 0,
        "n_parallel": n_parallel,
        "n_ctx": n_ctx,
        "threads": threads,
        "http_threads": http_threads,
        "metrics": metrics,
        "cache_prompt": cache_prompt,
        "alias": alias,
        "lifetime_s": lifetime_s,
        "verbosity": verbosity,
    }
    errlog = tempfile.TemporaryFile(mode="w+")  # a pipe nobody drains could block the server
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(cfg)], stdout=subprocess.PIPE, stderr=errlog, text=True, env=env
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if line.startswith(READY):
                root = line[len(READY) :].strip().rstrip("/")
                return LlamaServer(proc, root, errlog, model, alias, time.perf_counter() - t0, cfg)
            if not line and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    errlog.seek(0)
    err = errlog.read()[-2000:]
    errlog.close()
    raise LlamaStartError(f"llama.cpp server did not start (exit {proc.returncode}): {err}")
