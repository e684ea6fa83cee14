"""What a reader must know before any figure: the run was interrupted, or its figures are suspect.

A run made in virtual time (``--sim-virtual``) says so first of all (``virtual_line``).
``loadgen report`` prints these lines first on the terminal and report.html shows them
at the top of the page, above the headline cards: an interrupted run (run.json ``state``,
``analysis.validity.interruption``) and a suspect run or load point (its ``Validity``:
codes such as ``client_lag``, ``sim_late``) are said before a number can be read as a
result. The lines are plain text; the HTML view escapes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.analysis.validity import Validity

__all__ = ["banner_lines", "virtual_line"]


def banner_lines(
    interruption: str | None,
    validity: Validity,
    points: Sequence[tuple[str, Validity]] = (),
    what: str = "run",
) -> list[str]:
    """The lines to show first (none for a complete, valid run). ``validity``: the run's own;
    ``points``: each point's label and its own validity (a sweep's; a single run passes its one)."""
    out = [interruption] if interruption else []
    said = {"interrupted"} if interruption else set()
    own = [(c, r) for c, r in zip(validity.codes, validity.reasons, strict=True) if c not in said]
    if own:
        codes = ", ".join(c for c, _ in own)
        out.append(f"SUSPECT ({codes}): this {what}'s figures may be distorted: " + "; ".join(r for _, r in own))
    bad = [(label, v) for label, v in points if set(v.codes) - said - set(validity.codes)]
    if bad and what == "run":
        v = bad[0][1]
        own = [(c, r) for c, r in zip(v.codes, v.reasons, strict=True) if c not in said]
        out.append(f"SUSPECT ({', '.join(c for c, _ in own)}): " + "; ".join(r for _, r in own))
    elif bad:
        out += _point_lines(bad)
    return out


def _point_lines(bad: Sequence[tuple[str, Validity]]) -> list[str]:
    """A sweep's suspect points: those left out of its verdicts, and those only short of samples."""
    out = []
    held = [(label, v) for label, v in bad if v.withholding.suspect]
    few = [label for label, v in bad if not v.withholding.suspect]
    if held:
        names = ", ".join(f"{label} ({', '.join(v.withholding.codes)})" for label, v in held)
        out.append(
            f"SUSPECT POINT{'S' if len(held) > 1 else ''}: {names}: shown and marked, left out of the "
            "frontier, capacity and saturation"
        )
    if few:
        out.append(
            f"FEW SAMPLES: {', '.join(few)}: too few requests for a bounded p99 (its interval is open); "
            "each verdict's own sample rule decides what they can show"
        )
    return out


def virtual_line(meta: dict[str, Any]) -> str | None:
    """The first line of a run made in virtual time (``--sim-virtual``): its figures are the
    simulated engine's model, not a measurement of anything."""
    v = meta.get("virtual")
    if not isinstance(v, dict):
        return None
    note = str(v.get("note") or "no server and no client ran")
    return f"VIRTUAL TIME: {note.removeprefix('virtual time: ')}"
