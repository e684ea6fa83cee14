"""``--master`` and its options on ``loadgen run`` and ``loadgen sweep``: the points go to ``loadgen worker`` processes.

Wiring only (``loadgen.distributed.master``). The master listens on loopback unless
``--master-bind-host`` names another address; Locust's control channel is neither
authenticated nor encrypted, so a non-loopback bind is said on stderr. Nothing here imports
Locust: only the master's and the workers' control processes do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from loadgen.cli.flags import bounded_int, finite_float
from loadgen.errors import ConfigError

if TYPE_CHECKING:
    from loadgen.distributed.master import MasterOptions

__all__ = ["add_master_options", "master_options_of", "point_sender_of", "DEFAULT_MASTER_PORT", "MASTER_FLAGS"]

DEFAULT_MASTER_PORT = 5557  # Locust's (loadgen.distributed.protocol.DEFAULT_PORT)
DEFAULT_EXPECT_TIMEOUT_S = 60.0
DEFAULT_WEB_PORT = 8089  # Locust's
# the flags that mean nothing without --master (dest, flag)
MASTER_FLAGS = (
    ("expect_workers", "--expect-workers"),
    ("expect_workers_timeout", "--expect-workers-timeout"),
    ("master_bind_host", "--master-bind-host"),
    ("master_bind_port", "--master-bind-port"),
    ("web", "--web"),
    ("web_host", "--web-host"),
    ("web_port", "--web-port"),
)
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_master_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("distributed (Locust master and workers: see docs/distributed.md)")
    g.add_argument(
        "--master",
        action="store_true",
        help="send every point through `loadgen worker` processes (each takes shard i of n of the schedule) "
        "instead of from this process; the records come home into one run folder",
    )
    g.add_argument(
        "--expect-workers",
        type=bounded_int(1, 4096),
        default=None,
        metavar="N",
        help="with --master: wait for N workers before sending (default 1)",
    )
    g.add_argument(
        "--expect-workers-timeout",
        type=finite_float(0, 86_400.0, above=True, unit=" seconds"),
        default=None,
        metavar="S",
        help=f"with --master: give up (exit 2, nothing sent) when fewer than N have come by then "
        f"(default {DEFAULT_EXPECT_TIMEOUT_S:g} s)",
    )
    g.add_argument(
        "--master-bind-host",
        default=None,
        metavar="H",
        help="with --master: the address workers connect to (default 127.0.0.1; another one, e.g. 0.0.0.0, "
        "must be given: the control channel is not authenticated)",
    )
    g.add_argument(
        "--master-bind-port",
        type=bounded_int(0, 65535),
        default=None,
        metavar="P",
        help=f"with --master: its port (default {DEFAULT_MASTER_PORT}; 0: any free port, printed)",
    )
    g.add_argument("--web", action="store_true", help="with --master: serve Locust's web UI (live request counts)")
    g.add_argument("--web-host", default=None, metavar="H", help="the web UI's address (default 127.0.0.1)")
    g.add_argument(
        "--web-port",
        type=bounded_int(1, 65535),
        default=None,
        metavar="P",
        help=f"the web UI's port (default {DEFAULT_WEB_PORT})",
    )


def master_options_of(args: argparse.Namespace) -> MasterOptions | None:
    """The master's options, or None without ``--master``; one of its flags without it is refused."""
    if not getattr(args, "master", False):
        for dest, flag in MASTER_FLAGS:
            if getattr(args, dest, None) not in (None, False):
                raise ConfigError(f"{flag} applies with --master only")
        return None
    if getattr(args, "workers", 1) not in (1, None):
        raise ConfigError(
            f"--workers {args.workers} with --master: each worker runs one engine process; "
            "start more `loadgen worker` processes instead"
        )
    if (args.web_host is not None or args.web_port is not None) and not args.web:
        raise ConfigError("--web-host / --web-port apply with --web only")
    from loadgen.distributed.master import MasterOptions

    host = args.master_bind_host or "127.0.0.1"
    if host not in _LOOPBACK:
        print(
            f"loadgen: warning: --master-bind-host {host}: workers can connect from the network; Locust's control "
            "channel is neither authenticated nor encrypted: keep it on a private network",
            file=sys.stderr,
        )
    return MasterOptions(
        bind_host=host,
        bind_port=DEFAULT_MASTER_PORT if args.master_bind_port is None else args.master_bind_port,
        expect_workers=args.expect_workers or 1,
        expect_timeout_s=args.expect_workers_timeout or DEFAULT_EXPECT_TIMEOUT_S,
        web_host=(args.web_host or "127.0.0.1") if args.web else None,
        web_port=args.web_port or DEFAULT_WEB_PORT,
    )


@contextmanager
def point_sender_of(args: argparse.Namespace) -> Iterator[Callable[..., dict[str, Any]] | None]:
    """With ``--master``: a master with its workers ready (the wait is over before anything is
    started), yielding its point sender; else None (points are sent from this machine)."""
    options = master_options_of(args)
    if options is None:
        yield None
        return
    from loadgen.distributed.master import Master

    with Master(options) as master:
        yield master.run_point
