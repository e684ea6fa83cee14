"""Where the built-in spec folders are: inside the installed package, or the checkout.

The top-level ``workloads/``, ``conformance/`` and ``reports/`` folders ship in
the wheel as ``loadgen/_workloads`` etc.; in a source checkout (or an editable
install) they are read from the repository root instead.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["builtin_dir"]


def builtin_dir(kind: str) -> Path:
    """The folder of built-in ``kind`` files: "workloads", "conformance" or "reports"."""
    packaged = Path(str(files("loadgen"))) / f"_{kind}"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / kind
