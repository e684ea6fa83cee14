"""Trace replay: arrival times, lengths and prefix structure from real traces.

Formats (``format:`` in a ``kind: trace`` spec):

- ``mooncake``  JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (one id per block of ``block_tokens``, default 512; equal ids are
  equal text, so prefix sharing is reproduced; the last block may be partial).
- ``azure``     Azure LLM inference CSV: ``TIMESTAMP`` (datetime or seconds),
  ``ContextTokens``, ``GeneratedTokens``.
- ``burstgpt``  BurstGPT CSV, columns read by name: ``Timestamp`` (s),
  ``Request tokens``, ``Response tokens``; optional ``Model``/``Log Type`` filter
  rows (``models:``, ``log_types:``); any other column is ignored.
- ``sharegpt``  JSON (array or JSONL) of ``{conversations: [{from, value}]}``:
  real multi-turn text; each human message is a turn, answered at the length of
  the recorded answer. No timestamps: sessions arrive per the arrival spec.
- ``agentic``   Weka/AgentX-style coding-agent sessions (a JSON file per session,
  or a folder of them): per request ``in``/``out`` tokens, ``hash_ids`` (blocks of
  the file's ``block_size``), ``think_time``; ``type: subagent`` entries hold
  nested requests and become ``Turn.children`` of the next parent request.
  No absolute start times: sessions arrive per the arrival spec.

Timed formats (mooncake, azure, burstgpt) give ``offsets_ns()``: arrival offsets
in int64 ns, sorted, divided by ``speed``, cut to ``[start, start + window)``
seconds of trace time, at most ``max_requests``, starting at 0. Files are read
once into arrays; sessions are built on demand.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadgen.errors import SpecError
from loadgen.specfile import Fields
from loadgen.workload.base import Base
from loadgen.workload.session import Session, Turn
from loadgen.workload.text import Memo, TextSource, rng

__all__ = [
    "FORMATS",
    "Requests",
    "Blocks",
    "read_mooncake",
    "read_azure",
    "read_burstgpt",
    "select",
    "RequestTrace",
    "build_trace",
    "gap_stats",
]

FORMATS = ("mooncake", "azure", "burstgpt", "sharegpt", "agentic")
TIMED = ("mooncake", "azure", "burstgpt")
_TAG_BLOCK, _TAG_FILL, _TAG_UNIQUE = 21, 22, 23
_BLOCK_CACHE = 2048
_REUSE_CAP = 100_000  # requests scanned for block-reuse statistics


def _err(where: str, field: str, msg: str) -> SpecError:
    return SpecError(f"{where}: {field}: {msg}" if field else f"{where}: {msg}")


def _int(v: Any, where: str, field: str, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v != int(v) or v < minimum:
        raise _err(where, field, f"must be a whole number >= {minimum}, not {v!r}")
    return int(v)


def _num(v: Any, where: str, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
        raise _err(where, field, f"must be a number >= 0, not {v!r}")
    return float(v)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise SpecError(f"{path}: cannot read trace: {e.strerror or e}") from None


# -- request tables (timed formats) ----------------------------------------------------


@dataclass(frozen=True)
class Requests:
    """One row per request, in file order; ``hash_ids`` of row r are
    ``hash_flat[hash_off[r]:hash_off[r + 1]]``."""

    t_s: np.ndarray
    input: np.ndarray
    output: np.ndarray
    hash_flat: np.ndarray | None = None
    hash_off: np.ndarray | None = None

    def hash_ids(self, r: int) -> np.ndarray | None:
        if self.hash_flat is None or self.hash_off is None:
            return None
        return self.hash_flat[self.hash_off[r] : self.hash_off[r + 1]]


def read_mooncake(path: Path) -> Requests:
    t, inp, out, flat, off = [], [], [], [], [0]
    for ln, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{ln}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise _err(where, "", f"not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise _err(where, "", "each line must be a JSON object")
        t.append(_num(obj.get("timestamp"), where, "timestamp") / 1000.0)
        inp.append(_int(obj.get("input_length"), where, "input_length"))
        out.append(_int(obj.get("output_length"), where, "output_length"))
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list):
            raise _err(where, "hash_ids", "must be a list of whole numbers")
        flat += [_int(h, where, "hash_ids") for h in ids]
        off.append(len(flat))
    if not t:
        raise SpecError(f"{path}: no requests in the trace")
    return Requests(
        np.asarray(t),
        np.asarray(inp, np.int64),
        np.asarray(out, np.int64),
        np.asarray(flat, np.int64),
        np.asarray(off, np.int64),
    )


def _csv_rows(path: Path, need: dict[str, str], opt: dict[str, str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, {field: cell}) per data row; columns are found by name, any case."""
    text = _read(path).decode("utf-8-sig", errors="replace")
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise SpecError(f"{path}: empty file")
    cols = {h.strip().lower(): i for i, h in enumerate(header)}
    missing = [name for name in need.values() if name.lower() not in cols]
    if missing:
        raise SpecError(f"{path}:1: missing column(s) {', '.join(missing)} (found: {', '.join(header)})")
    index = {f: cols[n.lower()] for f, n in {**need, **opt}.items() if n.lower() in cols}
    for row in reader:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(header):
            raise SpecError(f"{path}:{reader.line_num}: {len(row)} columns, the header has {len(header)}")
        yield reader.line_num, {f: row[i].strip() for f, i in index.items()}


def _cell_int(cell: str, where: str, field: str) -> int:
    try:
        v = float(cell)
    except ValueError:
        raise _err(where, field, f"not a number: {cell[:40]!r}") from None
    return _int(v, where, field)


def _timestamp_ns(cell: str, where: str, field: str) -> int:
    """Seconds, or a date and time; in integer ns so that epoch times keep their digits."""
    try:
        return round(_num(float(cell), where, field) * 1e9)
    except ValueError:
        pass
    try:
        return int(np.datetime64(cell.replace(" ", "T"), "ns").astype(np.int64))
    except ValueError:
        raise _err(where, field, f"not a time: {cell[:40]!r}") from None


def read_azure(path: Path) -> Requests:
    need = {"t": "TIMESTAMP", "in": "ContextTokens", "out": "GeneratedTokens"}
    t, inp, out = [], [], []
    for ln, row in _csv_rows(path, need, {}):
        where = f"{path}:{ln}"
        t.append(_timestamp_ns(row["t"], where, need["t"]))
        inp.append(_cell_int(row["in"], where, need["in"]))
        out.append(_cell_int(row["out"], where, need["out"]))
    return _table(path, t, inp, out)


def read_burstgpt(
    path: Path, models: tuple[str, ...] | None = None, log_types: tuple[str, ...] | None = None
) -> Requests:
    need = {"t": "Timestamp", "in": "Request tokens", "out": "Response tokens"}
    opt = {"model": "Model", "log": "Log Type"}
    t, inp, out = [], [], []
    for ln, row in _csv_rows(path, need, opt):
        if models and row.get("model") not in models:
            continue
        if log_types and row.get("log") not in log_types:
            continue
        where = f"{path}:{ln}"
        t.append(_timestamp_ns(row["t"], where, need["t"]))
        inp.append(_cell_int(row["in"], where, need["in"]))
        out.append(_cell_int(row["out"], where, need["out"]))
    return _table(path, t, inp, out)


def _table(path: Path, t_ns: list[int], inp: list[int], out: list[int]) -> Requests:
    if not t_ns:
        raise SpecError(f"{path}: no requests in the trace (after filters)")
    ns = np.asarray(t_ns, dtype=np.int64)
    return Requests((ns - ns.min()) / 1e9, np.asarray(inp, np.int64), np.asarray(out, np.int64))


def select(t_s: np.ndarray, start_s: float, window_s: float | None, max_requests: int | None) -> np.ndarray:
    """Row indices to replay, in time order (ties keep file order)."""
    order = np.argsort(t_s, kind="stable")
    rel = t_s[order] - t_s[order[0]]
    keep = rel >= start_s
    if window_s is not None:
        keep &= rel < start_s + window_s
    idx = order[keep]
    return idx[:max_requests] if max_requests is not None else idx


def gap_stats(offsets_ns: np.ndarray) -> dict[str, Any]:
    """Duration, mean rate and burstiness (CV of inter-arrival gaps) of a schedule."""
    n = len(offsets_ns)
    dur = float(offsets_ns[-1] - offsets_ns[0]) / 1e9 if n else 0.0
    gaps = np.diff(offsets_ns) / 1e9
    cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else None
    return {"requests": n, "duration_s": dur, "rate_per_s": (n - 1) / dur if dur > 0 else None, "gap_cv": cv}


# -- text from hash blocks ---------------------------------------------------------------


class Blocks:
    """Text for hash-id blocks: block (scope, id) is a pure function of the seed, so
    equal ids give equal text in every request and the prefix is shared."""

    def __init__(self, ts: TextSource, seed: int) -> None:
        self.ts, self.seed = ts, seed
        self._memo = Memo(_BLOCK_CACHE)

    def _block(self, scope: int, hid: int, m: int) -> str:
        return self._memo.get((scope, hid, m), lambda: self.ts.words(m, rng(self.seed, _TAG_BLOCK, scope, hid, m)))

    def text(
        self, scope: int, ids: np.ndarray | tuple[int, ...], n: int, block: int, fill: Callable[[], np.random.Generator]
    ) -> str:
        """``n`` tokens: whole blocks, a partial last block (its own text, keyed by its
        size), then unique filler if the ids cover fewer than ``n`` tokens."""
        full = min(len(ids), n // block)
        parts = [self._block(scope, int(h), block) for h in ids[:full]]
        rest = n - full * block
        if rest and full < len(ids):
            parts.append(self._block(scope, int(ids[full]), rest))
            rest = 0
        if rest:
            parts.append(self.ts.words(rest, fill()))
        return "".join(parts)


@dataclass(frozen=True, kw_only=True)
class RequestTrace(Base):
    """Timed single-request sessions (mooncake, azure, burstgpt)."""

    kind = "trace"
    format: str
    path: str
    table: Requests
    idx: np.ndarray
    speed: float = 1.0
    start_s: float = 0.0
    window_s: float | None = None
    max_requests: int | None = None
    block_tokens: int = 512
    output_tokens: int | None = None
    max_output: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_blocks", Blocks(self.text, self.seed))

    @property
    def size(self) -> int | None:
        return len(self.idx)

    def offsets_ns(self) -> np.ndarray | None:
        return self._offsets

    @cached_property
    def _offsets(self) -> np.ndarray:
        t = self.table.t_s[self.idx]
        return np.rint((t - t[0]) * 1e9 / self.speed).astype(np.int64)

    def _build(self, j: int) -> Session:
        r = int(self.idx[j])
        n = max(1, int(self.table.input[r]))
        out = self.output_tokens or max(1, int(self.table.output[r]))
        if self.max_output:
            out = min(out, self.max_output)
        ids = self.table.hash_ids(r)
        fill = lambda: rng(self.seed, _TAG_UNIQUE, r)  # noqa: E731
        if ids is not None and len(ids):
            text = self._blocks.text(0, ids, n, self.block_tokens, fill)  # type: ignore[attr-defined]
        else:
            text = self.text.words(n, fill())
        return Session(session=j, turns=(Turn(text=text, max_tokens=out, prompt_tokens=n),))

    @cached_property
    def reuse(self) -> dict[str, Any] | None:
        """Fraction of hash blocks seen in an earlier request, and in a leading run of
        seen blocks (what an unbounded prefix cache can hit)."""
        if self.table.hash_flat is None or not len(self.table.hash_flat):
            return None
        seen: set[int] = set()
        total = again = prefix = 0
        for r in self.idx[:_REUSE_CAP].tolist():
            ids = self.table.hash_ids(r).tolist()  # type: ignore[union-attr]
            hits = [h in seen for h in ids]
            total += len(ids)
            again += sum(hits)
            prefix += next((i for i, hit in enumerate(hits) if not hit), len(hits))
            seen.update(ids)
        return {
            "requests": min(len(self.idx), _REUSE_CAP),
            "blocks_seen_before": again / max(total, 1),
            "blocks_in_cached_prefix": prefix / max(total, 1),
        }

    def _describe(self) -> dict[str, Any]:
        inp, out = self.table.input[self.idx], self.table.output[self.idx]
        d = {
            "format": self.format,
            "path": self.path,
            "rows": len(self.table.t_s),
            "speed": self.speed,
            "start_s": self.start_s,
            "window_s": self.window_s,
            "max_requests": self.max_requests,
            "output_tokens": self.output_tokens,
            "max_output": self.max_output,
            "mean_input": float(inp.mean()),
            "mean_output": float(out.mean()),
            "arrivals": gap_stats(self._offsets),
        }
        if self.format == "mooncake":
            d["block_tokens"] = self.block_tokens
            d["reuse"] = self.reuse
        return d


# -- spec ---------------------------------------------------------------------------------------

# Options that only make sense for some formats; elsewhere they are errors, not no-ops.
_APPLIES: dict[str, tuple[str, ...]] = {
    "speed": (*TIMED, "agentic"),
    "start": TIMED,
    "window": TIMED,
    "block_tokens": ("mooncake", "agentic"),
    "models": ("burstgpt",),
    "log_types": ("burstgpt",),
    "max_turns": ("sharegpt",),
    "think": ("sharegpt",),
    "max_think": ("agentic",),
    "max_context": ("agentic",),
}


def build_trace(f: Fields, common: dict[str, Any]) -> Base:
    """A trace-replay workload from the fields of a ``kind: trace`` spec."""
    from loadgen.workload.distributions import Fixed, parse_distribution

    fmt = f.string("format", choices=FORMATS)
    for key, fmts in _APPLIES.items():
        if f.has(key) and fmt not in fmts:
            raise f.error(key, f"does not apply to format {fmt} (only to {', '.join(fmts)})")
    path = f.path("path")
    if not path.exists():
        raise f.error("path", f"no such file or folder: {path}")
    opts: dict[str, Any] = {
        "path": str(path),
        "max_requests": f.number("max_requests", None, integer=True, ge=1),
        "output_tokens": f.number("output_tokens", None, integer=True, ge=1),
        "max_output": f.number("max_output", None, integer=True, ge=1),
    }
    if fmt in TIMED:
        speed = float(f.number("speed", 1.0, gt=0))
        start = float(f.number("start", 0.0, ge=0))
        window = f.number("window", None, gt=0)
        if fmt == "mooncake":
            table = read_mooncake(path)
            opts["block_tokens"] = f.number("block_tokens", 512, integer=True, ge=1)
        elif fmt == "azure":
            table = read_azure(path)
        else:
            table = read_burstgpt(path, f.strings("models", None), f.strings("log_types", None))
        idx = select(table.t_s, start, window, opts["max_requests"])
        if not len(idx):
            raise f.error("start", f"no request of {path} lies in the chosen start/window")
        return RequestTrace(
            **common,
            format=fmt,
            table=table,
            idx=idx,
            speed=speed,
            start_s=start,
            window_s=None if window is None else float(window),
            **opts,
        )
    if fmt == "sharegpt":
        from loadgen.workload.traces.sharegpt import ShareGPTTrace, read_sharegpt

        if path.is_dir():
            raise f.error("path", f"{path} is a folder; give a ShareGPT JSON file")
        convs, skipped = read_sharegpt(path)
        if opts["max_requests"]:
            convs = convs[: opts["max_requests"]]
        del opts["max_requests"]
        return ShareGPTTrace(
            **common,
            convs=tuple(convs),
            skipped=skipped,
            max_turns=f.number("max_turns", None, integer=True, ge=1),
            think=parse_distribution(f, "think", integer=False, default=Fixed(value=0.0, integer=False)),
            **opts,
        )
    from loadgen.workload.traces.agentic import AgenticTrace, read_agentic

    traces = read_agentic(path, f.number("block_tokens", None, integer=True, ge=1))
    if opts["max_requests"]:
        traces = traces[: opts["max_requests"]]
    del opts["max_requests"]
    return AgenticTrace(
        **common,
        traces=tuple(traces),
        speed=float(f.number("speed", 1.0, gt=0)),
        max_think_s=f.number("max_think", None, ge=0),
        max_context=f.number("max_context", None, integer=True, ge=1),
        **opts,
    )
