"""The ``loadgen`` command: a thin shell over the library, one module per command.

Building the parsers imports no heavy library (numpy, scipy, pyarrow, matplotlib,
aiohttp): a command module imports those in the functions that run the command,
so ``loadgen --help`` answers at once. tests/test_cli_startup.py holds this.

A user error is one line and exit code 2, never a traceback: argparse's errors
(``flags.Parser``) and every ``LoadgenError``, which is caught here and nowhere
else. Commands validate everything before they send anything, so such an error
means no traffic was sent. tests/test_bad_input.py holds this. The line is redacted
with the secrets the command was given (the API key, credentials in the endpoint URL).

Exit codes (``run_flags.EXIT_CODES``, shown in ``--help``): 0 done, 1 gate FAIL, 2 usage or
bad input, 3 gate INCONCLUSIVE, 4 every request failed, 130 SIGINT, 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from loadgen import __version__
from loadgen.cli.command_secrets import secrets_of
from loadgen.cli.flags import Parser, error_line
from loadgen.errors import LoadgenError
from loadgen.heap import keep_freed_memory

# Each module exposes add_parser(subparsers); a missing optional one is skipped.
COMMANDS = (
    "run_cmd",
    "report_cmd",
    "sim_cmd",
    "workloads_cmd",
    "sweep_cmd",
    "compare_cmd",
    "gate_cmd",
    "check_cmd",
    "worker_cmd",
    "plan_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    from loadgen.cli.run_flags import EXIT_CODES

    parser = Parser(
        prog="loadgen",
        description="Open-loop load generator and honest meter for OpenAI-compatible LLM endpoints.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"loadgen.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"loadgen.cli.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    keep_freed_memory()  # the analysis's block temporaries reuse the heap (loadgen.heap)
    try:
        return int(args.func(args) or 0)
    except LoadgenError as e:
        print(secrets_of(args).redact(error_line(str(e))), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
