"""Azure LLM inference traces (``format: azure``): the CSVs of Azure's public dataset.

Columns ``TIMESTAMP`` (a date and time, or seconds), ``ContextTokens`` and
``GeneratedTokens``; any other column is ignored. They record arrivals and
lengths of production chat and code traffic but no text and no prefix
structure, so every prompt is unique filler of the recorded length.
"""

from __future__ import annotations

from pathlib import Path

from loadgen.workload.traces.csv_rows import cell_time_ns, cell_whole, csv_rows
from loadgen.workload.traces.timed import Requests, requests_from_times

__all__ = ["read_azure"]

_COLUMNS = {"t": "TIMESTAMP", "in": "ContextTokens", "out": "GeneratedTokens"}


def read_azure(path: Path) -> Requests:
    """Every request of the file, in file order."""
    t: list[int] = []
    inp: list[int] = []
    out: list[int] = []
    for ln, row in csv_rows(path, _COLUMNS, {}):
        where = f"{path}:{ln}"
        t.append(cell_time_ns(row["t"], where, _COLUMNS["t"]))
        inp.append(cell_whole(row["in"], where, _COLUMNS["in"]))
        out.append(cell_whole(row["out"], where, _COLUMNS["out"]))
    return requests_from_times(path, t, inp, out)
