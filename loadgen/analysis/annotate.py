"""Annotating a compacted run: which rows the report counted, and how each one counted.

A report's figures depend on choices made at report time (the measurement window, and the
censoring rule: docs/metrics.md). ``annotation`` computes them per row from the records and
the windows the summary used: ``in_window``, and each request's TTFT, E2E and TPOT exactly as
the summary's distributions hold them (``columns.Latencies``, the same code), with whether the
value is censored. ``annotate_run`` writes them into records.parquet
(``record_annotation.annotate``) with the run's id and each point's window as metadata, so a
one-line query reproduces the report (docs/metrics.md, "Querying the records"), e.g. in duckdb
``SELECT quantile_disc(ttft_ms, 0.99) FROM 'records.parquet' WHERE in_window``.

A sweep's points each have their own window and their own end of observation, so each is
computed over its own rows (the ``point`` column), as ``points.analyze_run`` does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.analysis.columns import Cols, Floats, Mask, int_column
from loadgen.analysis.forked import Beside, start_beside
from loadgen.analysis.latencies import Latencies
from loadgen.analysis.window import Window, choose_window
from loadgen.record_annotation import DERIVED, DERIVED_SCHEMA, METADATA_PREFIX, annotate
from loadgen.record_version import VERSION_KEY, parse_version, version_of
from loadgen.records import SCHEMA, SCHEMA_VERSION, file_metadata, read_records
from loadgen.run_folder import PARQUET_NAME, read_run_meta

__all__ = [
    "Annotation",
    "annotation",
    "annotate_run",
    "start_annotate_run",
    "report_windows",
    "PERCENTILE_RULE",
    "EXAMPLE_QUERY",
]

PERCENTILE_RULE = (
    "nearest rank: the p-th percentile is the value at rank ceil(p/100 * n) (at least 1) of the n "
    "non-null in-window values sorted ascending; duckdb quantile_disc, numpy method='inverted_cdf'"
)
EXAMPLE_QUERY = "SELECT point, quantile_disc(ttft_ms, 0.99) FROM 'records.parquet' WHERE in_window GROUP BY point"


@dataclass(frozen=True)
class Annotation:
    """Per row of the table: ``in_window`` and the derived columns (``record_annotation.DERIVED``);
    ``metadata`` for the file's footer (str to str)."""

    in_window: Mask
    derived: dict[str, pa.Array[Any]]
    metadata: dict[str, str]


def annotation(
    table: pa.Table, windows: Window | Mapping[int, Window], *, sweep: bool = False, run_id: str | None = None
) -> Annotation:
    """The annotation of ``table`` (a run's records, in file order) for ``windows``: one window
    for a single run (every row), or a sweep's windows by point index (``sweep=True``: each over
    the rows of its point; a point without a window counts nowhere: not in_window, no values)."""
    n = table.num_rows
    by_point = dict(windows) if isinstance(windows, Mapping) else {0: windows}
    if not sweep and set(by_point) != {0}:
        raise ValueError(f"a single run has one window (point 0), got points {sorted(by_point)}")
    point = int_column(table, "point")[0]
    inwin = np.zeros(n, dtype=np.bool_)
    values = {name: np.full(n, np.nan) for name in ("ttft", "ttft_c", "e2e", "e2e_c", "tpot")}
    described = []
    for k, w in sorted(by_point.items()):
        rows = np.flatnonzero(point == k) if sweep else np.arange(n)
        c = Cols.of(table.take(rows) if sweep else table)
        lat = Latencies.of(c)
        inwin[rows] = w.contains(c.t_sched)
        for name in values:
            values[name][rows] = getattr(lat, name)
        described.append(_window_json(k, w, c.observed_end_ns() if c.n else 0, int(inwin[rows].sum())))
    ttft, ttft_c = _with_censored(values["ttft"], values["ttft_c"])
    e2e, e2e_c = _with_censored(values["e2e"], values["e2e_c"])
    derived = {
        "ttft_ms": ttft,
        "ttft_censored": ttft_c,
        "e2e_ms": e2e,
        "e2e_censored": e2e_c,
        "tpot_ms": _floats(values["tpot"]),
    }
    rid = run_id if run_id is not None else _first_run_id(table)
    metadata = {
        f"{METADATA_PREFIX}run_id": rid,
        f"{METADATA_PREFIX}windows": orjson.dumps(described).decode(),
        f"{METADATA_PREFIX}percentiles": PERCENTILE_RULE,
        f"{METADATA_PREFIX}example_query": EXAMPLE_QUERY,
    }
    return Annotation(inwin, derived, metadata)


def annotate_run(
    run_dir: str | os.PathLike[str],
    windows: Window | Mapping[int, Window] | None = None,
    *,
    table: pa.Table | None = None,
) -> Path | None:
    """Write the annotation of ``run_dir``'s records.parquet for the windows its summary used
    (``report.summary.window`` of a run; ``{p.index: p.summary.window for p in analysis.points}``
    of a sweep; None: ``report_windows``, the windows run.json's settings give). ``table`` is
    the records as ``read_records`` returned them, to save reading them again (they are read
    once either way, and the annotated file written from them). A run whose records were never
    compacted (no Parquet file) is left as it is: None."""
    return start_annotate_run(run_dir, windows, table=table).result()


def start_annotate_run(
    run_dir: str | os.PathLike[str],
    windows: Window | Mapping[int, Window] | None = None,
    *,
    table: pa.Table | None = None,
) -> Beside[Path | None]:
    """``annotate_run``, its annotation computed here and its file written beside the figures
    computed meanwhile, in a forked child (``forked.start_beside``: on the other core, the table
    shared copy-on-write): ``result()`` waits for the file and raises what ``annotate_run`` would."""
    run = Path(run_dir)
    if not (run / PARQUET_NAME).exists():
        return Beside.done(None)
    meta = read_run_meta(run)
    records = table if table is not None else read_records(run)
    chosen = windows if windows is not None else report_windows(meta, records)
    run_id = meta.get("run_id")
    a = annotation(records, chosen, sweep="points" in meta, run_id=run_id if isinstance(run_id, str) else None)
    if _holds(run / PARQUET_NAME, a):  # a report run again: the same bytes would be written
        return Beside.done(run / PARQUET_NAME)
    return start_beside(lambda: annotate(run, a.in_window, a.metadata, a.derived, table=records))  # not read again


def _holds(path: Path, a: Annotation) -> bool:
    """Whether the file already holds annotation ``a`` exactly, as ``annotate`` would write it:
    the records' columns in ``SCHEMA``'s types, the derived columns equal value for value, the
    same key-value metadata (this loadgen's version included). Reads the footer, then (only
    then) the derived columns."""
    try:
        schema = pq.read_schema(path)
        version = max(version_of(schema.metadata), SCHEMA_VERSION, key=parse_version)
        want = {**file_metadata(), VERSION_KEY: version, **a.metadata}
        found = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items() if not k.startswith(b"ARROW:")}
        names = [n for n in schema.names if n not in DERIVED]
        if found != want or schema.names != [*names, *DERIVED] or names[: len(SCHEMA)] != SCHEMA.names:
            return False
        if any(not schema.field(f.name).type.equals(f.type) for f in [*SCHEMA, *DERIVED_SCHEMA]):
            return False
        held = pq.read_table(path, columns=list(DERIVED))
    except (pa.ArrowException, OSError, ValueError):
        return False
    derived = {"in_window": pa.array(a.in_window, pa.bool_()), **a.derived}
    return all(held.column(name).combine_chunks().equals(derived[name]) for name in DERIVED if name in derived)


def report_windows(meta: Mapping[str, Any], table: pa.Table) -> Window | dict[int, Window]:
    """The windows a report chooses from run.json's settings: a run's from its warm-up and
    cool-down (``run_summary.summarize_run``), each sweep point's from its own
    (``points.point_window``, which falls back to the whole point when warm-up leaves none)."""
    from loadgen.analysis.points import point_window

    if "points" not in meta:
        s = meta.get("settings") or {}
        return choose_window(table, warmup_s=s.get("warmup_s", 0.0), cooldown_s=s.get("cooldown_s", 0.0))
    point = int_column(table, "point")[0]
    out = {}
    for pm in meta["points"]:
        k = int(pm["index"])
        rows = table.take(np.flatnonzero(point == k))
        out[k] = point_window(rows, float(pm.get("warmup_s", 0.0)), float(pm.get("cooldown_s", 0.0)))[0]
    return out


def _window_json(point: int, w: Window, observed_end_ns: int, requests: int) -> dict[str, Any]:
    return {
        "point": point,
        "start_ns": w.start_ns,
        "end_ns": w.end_ns,
        "t0_ns": w.t0_ns,
        "how": w.how,
        "warmup_s": w.warmup_s,
        "cooldown_s": w.cooldown_s,
        "warmup_requests": w.warmup_requests,
        "cooldown_requests": w.cooldown_requests,
        "observed_end_ns": observed_end_ns,  # where a request that never ended is censored
        "requests_in_window": requests,
    }


def _with_censored(exact: Floats, censored: Floats) -> tuple[pa.Array[Any], pa.Array[Any]]:
    """(value: exact, else censored; null where neither), (whether censored; null where neither)."""
    is_c = ~np.isnan(censored)
    value = np.where(is_c, censored, exact)
    none = np.isnan(value)
    return _floats(value), pa.array(is_c, pa.bool_(), mask=none)


def _floats(x: Floats) -> pa.Array[Any]:
    return pa.array(x, pa.float64(), mask=np.isnan(x))


def _first_run_id(table: pa.Table) -> str:
    if table.num_rows == 0:
        return ""
    value = table.column("run_id")[0].as_py()
    return value if isinstance(value, str) else ""
