"""``loadgen worker``: a worker of a distributed run, an ordinary Locust worker process.

It connects to a master (``loadgen run|sweep ... --master``), takes shard i of n of each
point the master sends, runs the engine in a child process that Locust's gevent never
touches, and streams its records home. The command checks its flags, then becomes the
worker's control process (``loadgen.distributed.worker``, through ``exec``: same pid), so
that Locust is imported first in a fresh interpreter and never by the ``loadgen`` command.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from loadgen.cli.distributed_flags import DEFAULT_MASTER_PORT
from loadgen.cli.flags import bounded_int

__all__ = ["add_parser", "main", "worker_argv"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="work for a master (`loadgen run|sweep --master`): send a shard of its schedule",
        description="Connect to a loadgen master, send shard i of n of each point it hands out, "
        "and stream the records home. Exits when the master quits (0) or goes silent mid-point (3).",
    )
    p.add_argument("--master-host", required=True, metavar="H", help="the master's address")
    p.add_argument(
        "--master-port",
        type=bounded_int(1, 65535),
        default=DEFAULT_MASTER_PORT,
        metavar="P",
        help="the master's port (default: %(default)s)",
    )
    p.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="this worker's API key from $NAME (default $OPENAI_API_KEY); the master never sends one",
    )
    p.add_argument(
        "--work-dir",
        default=None,
        metavar="DIR",
        help="where the engine's records are kept until they are home (default: the system's temp folder)",
    )
    p.set_defaults(func=main)


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The control process's command line."""
    argv = [sys.executable, "-m", "loadgen.distributed.worker", "--master-host", args.master_host]
    argv += ["--master-port", str(args.master_port)]
    if args.api_key_env:
        argv += ["--api-key-env", args.api_key_env]
    if args.work_dir:
        argv += ["--work-dir", str(Path(args.work_dir).resolve())]
    return argv


def main(args: argparse.Namespace) -> NoReturn:
    from loadgen.client.settings import api_key_from_env
    from loadgen.run_folder import writable_folder

    api_key_from_env(args.api_key_env)  # a named variable that is not set: one line, exit 2
    if args.work_dir:
        writable_folder(Path(args.work_dir), "--work-dir")
    argv = worker_argv(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)  # this process becomes the worker (Locust imported first there)
