"""BurstGPT traces (``format: burstgpt``): a CSV of logged ChatGPT and GPT-4 requests.

Columns read by name: ``Timestamp`` (seconds), ``Request tokens``, ``Response
tokens``, and, when present, ``Model`` and ``Log Type``; any other column is
ignored. The file mixes models and both API and conversation logs, whose
traffic differs, so ``models:`` and ``log_types:`` keep only the rows asked for
(a row without the column never matches a filter).
"""

from __future__ import annotations

from pathlib import Path

from loadgen.workload.traces.csv_rows import cell_time_ns, cell_whole, csv_rows
from loadgen.workload.traces.timed import Requests, requests_from_times

__all__ = ["read_burstgpt"]

_COLUMNS = {"t": "Timestamp", "in": "Request tokens", "out": "Response tokens"}
_FILTERS = {"model": "Model", "log": "Log Type"}


def read_burstgpt(
    path: Path, models: tuple[str, ...] | None = None, log_types: tuple[str, ...] | None = None
) -> Requests:
    """The requests of the file that pass the filters, in file order."""
    t: list[int] = []
    inp: list[int] = []
    out: list[int] = []
    for ln, row in csv_rows(path, _COLUMNS, _FILTERS):
        if models and row.get("model") not in models:
            continue
        if log_types and row.get("log") not in log_types:
            continue
        where = f"{path}:{ln}"
        t.append(cell_time_ns(row["t"], where, _COLUMNS["t"]))
        inp.append(cell_whole(row["in"], where, _COLUMNS["in"]))
        out.append(cell_whole(row["out"], where, _COLUMNS["out"]))
    return requests_from_times(path, t, inp, out)
