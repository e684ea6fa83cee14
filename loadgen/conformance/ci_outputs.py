"""What `gate` and `check` hand to CI: one outcome, rendered as terminal, JUnit, Markdown, JSON.

Both commands end in the same shape: a list of named cases, each pass / fail /
inconclusive / skip with a one-line reason and a few table cells. Rendering that
shape lives here once, so a CI system sees the same structure from either
command, and escaping is done in one place.

Every string may carry text the endpoint sent (model names, error messages,
stream excerpts), so every renderer treats every string as untrusted: rich
output never parses markup, JUnit strips characters XML 1.0 cannot hold (the
serializer escapes the rest), Markdown escapes HTML and the punctuation that
would start a link, emphasis, code span or table cell.
"""

from __future__ import annotations

import html
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # rich is imported by the terminal renderers: `loadgen check --help` needs ITEMS only
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "STATUSES",
    "Case",
    "Outcome",
    "overall_status",
    "clip",
    "md_escape",
    "to_junit",
    "to_markdown",
    "to_json",
    "to_table",
    "print_outcome",
    "write_outputs",
]

STATUSES = ("pass", "fail", "inconclusive", "skip")
_STYLE = {"pass": "green", "fail": "bold red", "inconclusive": "yellow", "skip": "dim"}
_MARK = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "skip": "SKIP"}
_CLIP = 300
# Characters XML 1.0 forbids even when escaped; an endpoint can send any of them.
_XML_BAD = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MD_PUNCT = re.compile(r"([\\`*_\[\]|~])")


@dataclass(frozen=True)
class Case:
    """One criterion or check item.

    ``message`` is the one-line reason or evidence; ``cells`` the table columns
    (name, text); ``data`` machine-readable extras that only the JSON carries.
    """

    name: str
    status: str
    message: str = ""
    suite: str = ""
    cells: tuple[tuple[str, str], ...] = ()
    data: dict[str, Any] = field(default_factory=dict)
    time_s: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def cell(self, column: str) -> str:
        return dict(self.cells).get(column, "")


@dataclass
class Outcome:
    """The result of one `gate` or `check` invocation, ready to render."""

    kind: str  # "gate" | "check"
    title: str
    status: str
    exit_code: int
    header: list[tuple[str, str]] = field(default_factory=list)  # (label, value), shown above the table
    cases: list[Case] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    columns: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for c in self.cases:
            out[c.status] += 1
        return out


def overall_status(statuses: Sequence[str]) -> str:
    """Fail beats inconclusive beats pass; skips alone do not fail anything."""
    if "fail" in statuses:
        return "fail"
    if "inconclusive" in statuses:
        return "inconclusive"
    return "pass"


def clip(text: Any, limit: int = _CLIP) -> str:
    """One printable line of at most ``limit`` characters (for endpoint-provided text)."""
    s = _CONTROL.sub(" ", str(text)).strip()
    return s if len(s) <= limit else s[: limit - 1] + "…"


# --------------------------------------------------------------------------- terminal


def to_table(outcome: Outcome, why: bool = True) -> Table:
    """A rich table; every cell is a ``Text`` so endpoint text is never read as markup."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(outcome.title), show_edge=False, title_justify="left")
    cols = ("", *outcome.columns, "result", *(("why",) if why else ()))
    for col in cols:
        t.add_column(
            col,
            justify="right" if col in outcome.columns and col != "limit" else "left",
            no_wrap=col not in ("", "why"),
        )
    for c in outcome.cases:
        t.add_row(
            Text(c.name),
            *(Text(c.cell(col)) for col in outcome.columns),
            Text(_MARK[c.status], style=_STYLE[c.status]),
            *((Text(clip(c.message)),) if why else ()),
        )
    return t


def print_outcome(outcome: Outcome, console: Console | None = None) -> None:
    """Header, table, reasons, notes and the verdict line; with data columns the
    reasons go under the table, one line each, so the table fits a terminal."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    for label, value in outcome.header:
        console.print(Text(f"{label}: ", style="bold") + Text(clip(value)))
    wide = bool(outcome.columns)
    console.print(to_table(outcome, why=not wide))
    if wide:
        for c in outcome.cases:
            mark = Text(f"{_MARK[c.status]:>12} ", style=_STYLE[c.status])
            console.print(mark + Text(f"{c.name}: {clip(c.message)}"))
    for note in outcome.notes:
        console.print(Text("note: " + clip(note, 500), style="yellow"))
    n = outcome.counts()
    summary = ", ".join(f"{v} {k}" for k, v in n.items() if v)
    console.print(
        Text(f"{outcome.kind}: ", style="bold")
        + Text(_MARK[outcome.status], style=_STYLE[outcome.status])
        + Text(f" ({summary}); exit code {outcome.exit_code}")
    )


# --------------------------------------------------------------------------- JUnit


def _x(text: Any) -> str:
    return _XML_BAD.sub("\ufffd", str(text))


def to_junit(outcome: Outcome) -> str:
    """JUnit XML in the common subset GitHub, GitLab and Jenkins read.

    ``<testsuites>`` of ``<testsuite>`` (one per suite name) of ``<testcase>``;
    a FAIL carries ``<failure message type>``, an INCONCLUSIVE or SKIP a
    ``<skipped message>``; the table cells go to ``<system-out>``. Counts and
    times are on every suite and on the root.
    """
    root = ET.Element("testsuites", name=_x(f"loadgen {outcome.kind}"))
    suites: dict[str, list[Case]] = {}
    for c in outcome.cases:
        suites.setdefault(c.suite or outcome.kind, []).append(c)
    for suite_name, cases in suites.items():
        _junit_suite(root, outcome, suite_name, cases)
    els = root.findall("testsuite")
    for key in ("tests", "failures", "skipped"):
        root.set(key, str(sum(int(el.get(key, "0")) for el in els)))
    root.set("errors", "0")
    root.set("time", f"{sum(c.time_s for c in outcome.cases):.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _junit_suite(root: ET.Element, outcome: Outcome, suite_name: str, cases: list[Case]) -> None:
    """One ``<testsuite>``: its counts, the outcome's header as properties, a ``<testcase>`` per case."""
    suite = ET.SubElement(
        root,
        "testsuite",
        name=_x(suite_name),
        tests=str(len(cases)),
        failures=str(sum(c.status == "fail" for c in cases)),
        errors="0",
        skipped=str(sum(c.status in ("inconclusive", "skip") for c in cases)),
        time=f"{sum(c.time_s for c in cases):.3f}",
    )
    if outcome.header:
        props = ET.SubElement(suite, "properties")
        for label, value in outcome.header:
            ET.SubElement(props, "property", name=_x(label), value=_x(clip(value, 1000)))
    for c in cases:
        tc = ET.SubElement(
            suite,
            "testcase",
            name=_x(c.name),
            classname=_x(f"loadgen.{outcome.kind}.{suite_name}"),
            time=f"{c.time_s:.3f}",
        )
        msg = _x(clip(c.message, 1000))
        if c.status == "fail":
            el = ET.SubElement(tc, "failure", message=msg, type="FAIL")
            el.text = _x(_details(c))
        elif c.status in ("inconclusive", "skip"):
            ET.SubElement(tc, "skipped", message=_x(f"{_MARK[c.status]}: {clip(c.message, 1000)}"))
        if c.cells:
            ET.SubElement(tc, "system-out").text = _x(_details(c))


def _details(c: Case) -> str:
    lines = [f"{_MARK[c.status]}: {clip(c.message, 1000)}"]
    lines += [f"{k}: {clip(v, 1000)}" for k, v in c.cells]
    return "\n".join(lines)


# --------------------------------------------------------------------------- Markdown


def md_escape(text: Any, limit: int = _CLIP) -> str:
    """Text safe inside a GitHub/GitLab Markdown table cell.

    HTML is escaped (no tag or entity survives), and backslashes go before the
    characters that open links, images, emphasis, code spans, strikethrough or a
    new table cell; line breaks become spaces.
    """
    return _MD_PUNCT.sub(r"\\\1", html.escape(clip(text, limit), quote=False))


def to_markdown(outcome: Outcome) -> str:
    """A job-summary section: heading with the verdict, header lines, one table, notes."""
    icon = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️"}.get(outcome.status, "")
    n = outcome.counts()
    counts = ", ".join(f"{v} {k}" for k, v in n.items() if v)
    lines = [f"### {icon} loadgen {outcome.kind}: {_MARK[outcome.status]} ({counts})", ""]
    lines += [f"- **{md_escape(label)}**: {md_escape(value)}" for label, value in outcome.header]
    if outcome.header:
        lines.append("")
    cols = ("", *outcome.columns, "result", "why")
    lines.append("| " + " | ".join(md_escape(c) for c in cols) + " |")
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for c in outcome.cases:
        row = [
            md_escape(c.name),
            *(md_escape(c.cell(col)) for col in outcome.columns),
            f"**{_MARK[c.status]}**",
            md_escape(c.message),
        ]
        lines.append("| " + " | ".join(row) + " |")
    if outcome.notes:
        lines.append("")
        lines += [f"> {md_escape(note, 500)}" for note in outcome.notes]
    lines.append("")
    lines.append(f"Exit code {outcome.exit_code}.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- JSON


def to_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "tool": "loadgen",
        "kind": outcome.kind,
        "title": outcome.title,
        "status": outcome.status,
        "exit_code": outcome.exit_code,
        "header": dict(outcome.header),
        "counts": outcome.counts(),
        "cases": [
            {
                "suite": c.suite,
                "name": c.name,
                "status": c.status,
                "message": c.message,
                "cells": dict(c.cells),
                "data": c.data,
                "time_s": c.time_s,
            }
            for c in outcome.cases
        ],
        "notes": list(outcome.notes),
    }


# --------------------------------------------------------------------------- files


def write_outputs(
    outcome: Outcome,
    *,
    junit: str | os.PathLike[str] | None = None,
    markdown: str | os.PathLike[str] | None = None,
    json: str | os.PathLike[str] | None = None,
    step_summary: bool = True,
) -> None:
    """Write the requested files; with ``step_summary``, also append the Markdown to
    ``$GITHUB_STEP_SUMMARY`` when that is set and no ``markdown`` file was named."""
    if junit:
        _write(Path(junit), to_junit(outcome).encode())
    if markdown:
        _write(Path(markdown), to_markdown(outcome).encode())
    elif step_summary and os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(to_markdown(outcome))
    if json:
        _write(Path(json), orjson.dumps(to_json(outcome), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def _write(path: Path, data: bytes) -> None:
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
