"""Errors a user can act on: each names what is wrong and where."""

from __future__ import annotations

__all__ = ["LoadgenError", "SpecError", "ConfigError", "EndpointError"]


class LoadgenError(Exception):
    """Base of every error loadgen reports as a one-line message (exit code 2)."""


class SpecError(LoadgenError):
    """A workload, SLO or trace file is invalid; the message names file, line and field."""


class ConfigError(LoadgenError):
    """Contradictory or invalid options, caught before any traffic is sent."""


class EndpointError(LoadgenError):
    """The endpoint cannot be used at all (unreachable, no model to send to)."""
