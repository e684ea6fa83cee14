"""Errors a user can act on: each names what is wrong and where.

Every error loadgen raises for a bad input derives from ``LoadgenError``; the
command line catches it in one place (``loadgen.cli.main``) and prints it as one
line, ``loadgen: error: <message>``, with exit code 2 and no traceback. So a
message is one line and names the file, line and field (``spec.yaml:12: input.mean:
must be > 0``) or the flag and its value (``--duration nan: ...``).
"""

from __future__ import annotations

__all__ = ["LoadgenError", "SpecError", "ConfigError", "EndpointError"]


class LoadgenError(Exception):
    """Base of every error loadgen reports as a one-line message (exit code 2)."""


class SpecError(LoadgenError):
    """A file loadgen reads is invalid: a workload, SLO or trace file, or a run folder's
    ``run.json`` or records. The message names the file (and line and field where it has them)."""


class ConfigError(LoadgenError):
    """Contradictory or invalid options, caught before any traffic is sent."""


class EndpointError(LoadgenError):
    """The endpoint cannot be used at all (unreachable, no model to send to)."""
