"""What a run against a hostile endpoint must not leave behind, as checks over its files.

Each ``check_*`` yields findings (one line each; none means the promise holds) about one run
folder and the run's captured stdout and stderr (tests/test_hostile_endpoints.py runs them):

- ``check_records``: every scheduled request has exactly one record, with a status that
  tells the truth about the behaviour and an error text that says what happened; no
  impossible number and no control, bidi or overlong string in a record;
- ``check_exit``: exit code 0 when some request succeeded, 4 with a line naming the most
  common failure and its count when every one failed, 2 and one line when the endpoint
  could not be used at all (and then nothing recorded);
- ``check_secrets``: no secret, in any form it travels in (raw, URL-encoded, base64 of it,
  of its ``Bearer`` header and of a Basic ``user:password``, fragments), in any file,
  Parquet and Arrow files decoded too, nor on stdout or stderr;
- ``check_text``: no control, ANSI or bidi character on the terminal or in a JSON, HTML,
  Markdown, XML or text file, and none of the endpoint's markup unescaped in them.
"""

from __future__ import annotations

import base64
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

__all__ = [
    "UNUSABLE",
    "RunFiles",
    "check_exit",
    "check_records",
    "check_secrets",
    "check_text",
    "read_records",
    "secret_forms",
]

UNUSABLE = "unusable"  # an expected "status" of a case: exit 2, one line, no request recorded
COUNT_COLUMNS = (
    "output_tokens",
    "output_tokens_reported",
    "prompt_tokens_reported",
    "cached_tokens",
    "reasoning_tokens",
)
TEXT_COLUMNS = ("endpoint", "model", "finish_reason", "error", "output_text")
MAX_COUNT = 100_000_000  # untrusted.MAX_TOKEN_COUNT: no count above it is possible
_BIDI = set("\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff")
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")
_MARKUP = (b"<script>alert(", b"<img src=x onerror")  # the endpoint's markup, not escaped


def secret_forms(secret: str, user: str | None = None) -> dict[str, bytes]:
    """How a secret may show up: raw, URL-encoded, base64 (of it, of its Bearer header, of a
    Basic ``user:secret`` when ``user`` is given), and fragments of the raw and base64 forms."""
    b64 = base64.b64encode(secret.encode()).decode()
    forms = {
        "raw": secret,
        "url": quote(secret, safe=""),
        "url-plus": quote_plus(secret),
        "b64": b64,
        "b64-header": base64.b64encode(f"Bearer {secret}".encode()).decode(),
        "b64url": base64.urlsafe_b64encode(secret.encode()).decode().rstrip("="),
        "fragment": secret[8:20],
        "fragment-b64": b64[8:28],
    }
    if user is not None:
        basic = base64.b64encode(f"{user}:{secret}".encode()).decode()
        forms |= {"b64-basic": basic, "fragment-b64-basic": basic[12:32]}
    return {k: v.encode() for k, v in forms.items() if len(v) >= 8}


# -- the files of a run ----------------------------------------------------------------------
class RunFiles:
    """Every file a run left under ``home``, read once: its bytes, and for Arrow and Parquet
    files also the text of their values (where a secret or an escape would hide from a grep)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.files: list[tuple[Path, bytes]] = []
        for p in sorted(home.rglob("*")):
            if p.is_file():
                self.files.append((p, p.read_bytes()))
                decoded = _decoded(p)
                if decoded is not None:
                    self.files.append((p, repr(decoded.to_pylist()).encode("utf-8", "backslashreplace")))

    def where(self, p: Path) -> str:
        return str(p.relative_to(self.home))


def _decoded(p: Path) -> pa.Table | None:
    try:
        if p.suffix == ".parquet":
            return pq.read_table(p)
        if p.suffix == ".arrows":
            with ipc.open_stream(pa.memory_map(str(p))) as reader:
                return reader.read_all()
    except (pa.ArrowException, OSError):
        pass
    return None


def read_records(run_dir: Path) -> pa.Table | None:
    """records.parquet, else every complete batch of records.arrows; None if neither is readable."""
    parquet, stream = run_dir / "records.parquet", run_dir / "records.arrows"
    if parquet.exists():
        try:
            return pq.read_table(parquet)
        except (pa.ArrowException, OSError):
            pass
    if not stream.exists():
        return None
    batches = []
    try:
        with ipc.open_stream(pa.memory_map(str(stream))) as reader:
            for batch in reader:
                batches.append(batch)
    except (pa.ArrowException, OSError):
        if not batches:
            return None
    return pa.Table.from_batches(batches)


# -- the checks ------------------------------------------------------------------------------
def check_exit(code: int, rows: list[dict[str, Any]], stderr: bytes, expected: frozenset[str]) -> Iterator[str]:
    """The exit code tells how the run went (0 / 4 / 2), and an unusable endpoint is one line."""
    lines = [ln for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    statuses = Counter(str(r["status"]) for r in rows)
    if code < 0:
        yield f"exit: killed by signal {-code}"
    elif not rows:
        if UNUSABLE not in expected:
            yield f"exit {code} and no record at all: {_last(lines)}"
        elif code != 2 or len(lines) != 1:
            yield f"unusable endpoint: exit {code} (expected 2) and {len(lines)} stderr lines: {_last(lines)}"
    elif statuses["ok"] and code != 0:
        yield f"exit {code} although {statuses['ok']} requests succeeded"
    elif not statuses["ok"]:
        if code != 4:
            yield f"exit {code} although every request failed (expected 4)"
        elif not _names_the_failure(lines, rows):
            status, n = statuses.most_common(1)[0]
            yield f"exit 4, but no stderr line names the most common failure ({status}) and its count ({n})"


def _names_the_failure(lines: list[str], rows: list[dict[str, Any]]) -> bool:
    """Some line holds the most common failure's count and its status or error text."""
    common = Counter((str(r["status"]), str(r["error"] or "")) for r in rows).most_common()
    for (status, error), n in common[:1]:
        status_n = sum(1 for r in rows if r["status"] == status)
        for ln in lines:
            counted = any(re.search(rf"\b{k}\b", ln) for k in (n, status_n))
            named = status.replace("_", " ") in ln.replace("_", " ") or (error[:20] and error[:20] in ln)
            if counted and named:
                return True
    return False


def _last(lines: list[str]) -> str:
    return lines[-1][:160] if lines else ""


def check_records(
    rows: list[dict[str, Any]], requests: int, expected: frozenset[str], error_says: str, must_see: frozenset[str]
) -> Iterator[str]:
    """One record per scheduled request, truthful statuses, bounded numbers and strings."""
    if not rows and UNUSABLE in expected:
        return  # the endpoint could not be used: said in one line (check_exit), nothing sent
    seen = Counter(int(r["request"]) for r in rows)
    lost = sorted(set(range(requests)) - set(seen))
    if lost:
        yield f"records lost: {len(lost)} of {requests} (requests {lost})"
    if any(n > 1 for n in seen.values()) or set(seen) - set(range(requests)):
        yield f"records: requests {sorted(seen.elements())}, expected each of 0..{requests - 1} once"
    statuses = Counter(str(r["status"]) for r in rows)
    wrong = {k: v for k, v in statuses.items() if k not in expected}
    if wrong:
        yield f"status {wrong} (expected {'/'.join(sorted(expected - {UNUSABLE}))})"
    if rows and must_see - set(statuses):
        yield f"no {'/'.join(sorted(must_see - set(statuses)))} record (statuses {dict(statuses)})"
    pattern = re.compile(error_says, re.I) if error_says else None
    for r in rows:
        err = str(r["error"] or "")
        if r["status"] != "ok" and (not err.strip() or (pattern is not None and not pattern.search(err))):
            yield f"{r['status']} record whose error does not say what happened: {err[:100]!r}"
            break
    for col in COUNT_COLUMNS:
        bad = [v for r in rows if (v := r.get(col)) is not None and not 0 <= v <= MAX_COUNT]
        if bad:
            yield f"impossible {col} kept: {bad[0]}"
    if any(not 0 <= v <= MAX_COUNT for r in rows for v in r.get("chunk_tokens") or ()):
        yield "impossible chunk_tokens kept"
    for col in TEXT_COLUMNS:
        unsafe = [v for r in rows if isinstance(v := r.get(col), str) and _unsafe(v)]
        if unsafe:
            yield f"unsafe {col} in records: {unsafe[0][:60]!r}"


def _unsafe(text: str) -> bool:
    """Control, bidi or other unprintable characters (tab and newline aside), or past a sane length."""
    return len(text) > 2000 or any(not c.isprintable() and c not in "\t\n" for c in text)


def check_secrets(files: RunFiles, forms: dict[str, bytes]) -> Iterator[str]:
    """No form of any secret in any file (the captures of stdout and stderr included)."""
    found: dict[str, set[str]] = {}
    for p, data in files.files:
        for name, form in forms.items():
            if form in data:
                found.setdefault(name, set()).add(files.where(p))
    for name, where in sorted(found.items()):
        yield f"key leaked ({name}) in {', '.join(sorted(where))}"


def check_text(files: RunFiles, terminal: bytes, captures: tuple[Path, ...]) -> Iterator[str]:
    """No control, escape or bidi character, nor unescaped endpoint markup, where a person reads."""
    if _hostile_bytes(terminal):
        yield "control, escape or bidi characters on the terminal"
    reported: set[str] = set()
    for p, data in files.files:
        where = files.where(p)
        if p in captures or where in reported:
            continue
        if p.suffix in (".json", ".jsonl"):
            try:
                strings = list(_json_strings(data))
            except orjson.JSONDecodeError:
                reported.add(where)
                yield f"{where} is not JSON"
                continue
            if any(_unsafe(s) for s in strings):
                reported.add(where)
                yield f"control, bidi or overlong strings in {where}"
        elif p.suffix in (".html", ".md", ".xml", ".txt", ".svg"):
            if _hostile_bytes(data):
                reported.add(where)
                yield f"control or bidi characters in {where}"
            if any(m in data for m in _MARKUP):
                reported.add(where)
                yield f"endpoint markup unescaped in {where}"


def _hostile_bytes(data: bytes) -> bool:
    return bool(_CONTROL.search(data)) or any(c.encode() in data for c in _BIDI)


def _json_strings(data: bytes) -> Iterator[str]:
    """Every string (keys too) in a JSON file or JSON-lines file (JSONDecodeError if neither)."""
    try:
        docs = [orjson.loads(data)]
    except orjson.JSONDecodeError:
        docs = [orjson.loads(ln) for ln in data.splitlines() if ln.strip()]
    todo: list[Any] = docs
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
