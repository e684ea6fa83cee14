"""What `gate` and `check` hand to CI: one outcome, rendered as terminal, JUnit, Markdown, JSON.

Both commands end in the same shape: a list of named cases, each pass / warn /
fail / inconclusive / skip with a one-line reason and a few table cells. Rendering
that shape lives here once, so a CI system sees the same structure from either
command, and escaping is done in one place.

Every string may carry text the endpoint sent (model names, error messages,
stream excerpts), so every renderer treats every string as untrusted. Each one goes
through ``Outcome.text`` first: the run's secrets removed (``Outcome.secrets``, in
every form ``loadgen.redaction`` knows), then ``clean_text`` (one line, no control,
ANSI or bidi character, capped), and only then escaped for its format: rich output
never parses markup, JUnit strips characters XML 1.0 cannot hold (the serializer
escapes the rest), Markdown escapes HTML and the punctuation that would start a
link, emphasis, code span or table cell. Every file written, and the step summary,
is redacted once more as a whole.

WARN is a deviation that does not break measurement (``check``): it passes CI unless
the command was asked to be strict, so in JUnit it is a passing ``<testcase>`` whose
``<system-out>`` starts with ``WARN:``. The XML follows the common JUnit schema
(Jenkins xunit's junit-10.xsd, which GitHub and GitLab readers accept): a
``skipped`` count on each ``<testsuite>``, none on the root ``<testsuites>``.
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

from loadgen.redaction import Secrets
from loadgen.untrusted import clean_text

if TYPE_CHECKING:  # rich is imported by the terminal renderers: `loadgen check --help` needs ITEMS only
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "STATUSES",
    "Case",
    "Outcome",
    "overall_status",
    "md_escape",
    "to_junit",
    "to_markdown",
    "to_json",
    "to_table",
    "print_outcome",
    "write_outputs",
]

STATUSES = ("pass", "warn", "fail", "inconclusive", "skip")
_STYLE = {"pass": "green", "warn": "bold yellow", "fail": "bold red", "inconclusive": "yellow", "skip": "dim"}
_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "skip": "SKIP"}
_CLIP = 300
_LONG = 1000  # a message in the files, where a line may be longer than in the terminal
# Characters XML 1.0 forbids even when escaped; an endpoint can send any of them.
_XML_BAD = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
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
    """The result of one `gate` or `check` invocation, ready to render.

    ``secrets``: the run's (API key, header values, URL credentials); every renderer
    removes them from every string (``text``) and every file as a whole.
    """

    kind: str  # "gate" | "check"
    title: str
    status: str
    exit_code: int
    header: list[tuple[str, str]] = field(default_factory=list)  # (label, value), shown above the table
    cases: list[Case] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    columns: tuple[str, ...] = ()
    secrets: Secrets = field(default_factory=Secrets)

    def text(self, value: Any, limit: int = _CLIP) -> str:
        """``value`` as it may be shown: secrets removed first (so no cut leaves part of
        one), then one clean line of at most ``limit`` characters."""
        return clean_text(self.secrets.redact(str(value)), limit)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for c in self.cases:
            out[c.status] += 1
        return out


def overall_status(statuses: Sequence[str]) -> str:
    """Fail beats inconclusive beats warn beats pass; skips alone do not fail anything."""
    for status in ("fail", "inconclusive", "warn"):
        if status in statuses:
            return status
    return "pass"


# --------------------------------------------------------------------------- terminal


def to_table(outcome: Outcome, why: bool = True) -> Table:
    """A rich table; every cell is a ``Text`` so endpoint text is never read as markup."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(outcome.text(outcome.title)), show_edge=False, title_justify="left")
    cols = ("", *outcome.columns, "result", *(("why",) if why else ()))
    for col in cols:
        t.add_column(
            col,
            justify="right" if col in outcome.columns and col != "limit" else "left",
            no_wrap=col not in ("", "why"),
        )
    for c in outcome.cases:
        t.add_row(
            Text(outcome.text(c.name)),
            *(Text(outcome.text(c.cell(col))) for col in outcome.columns),
            Text(_MARK[c.status], style=_STYLE[c.status]),
            *((Text(outcome.text(c.message)),) if why else ()),
        )
    return t


def print_outcome(outcome: Outcome, console: Console | None = None) -> None:
    """Header, table, reasons, notes and the verdict line; with data columns the
    reasons go under the table, one line each, so the table fits a terminal."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    for label, value in outcome.header:
        console.print(Text(f"{outcome.text(label)}: ", style="bold") + Text(outcome.text(value)))
    wide = bool(outcome.columns)
    console.print(to_table(outcome, why=not wide))
    if wide:
        for c in outcome.cases:
            mark = Text(f"{_MARK[c.status]:>12} ", style=_STYLE[c.status])
            console.print(mark + Text(f"{outcome.text(c.name)}: {outcome.text(c.message)}"))
    for note in outcome.notes:
        console.print(Text("note: " + outcome.text(note, 500), style="yellow"))
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
    ``<skipped message>``, a WARN passes with its note first in ``<system-out>``;
    the table cells go to ``<system-out>``. Counts and times are on every suite;
    the root carries those junit-10.xsd allows it (tests, failures, errors, time:
    not ``skipped``).
    """
    root = ET.Element("testsuites", name=_x(f"loadgen {outcome.kind}"))
    suites: dict[str, list[Case]] = {}
    for c in outcome.cases:
        suites.setdefault(c.suite or outcome.kind, []).append(c)
    for suite_name, cases in suites.items():
        _junit_suite(root, outcome, suite_name, cases)
    els = root.findall("testsuite")
    for key in ("tests", "failures"):
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
        name=_x(outcome.text(suite_name)),
        tests=str(len(cases)),
        failures=str(sum(c.status == "fail" for c in cases)),
        errors="0",
        skipped=str(sum(c.status in ("inconclusive", "skip") for c in cases)),
        time=f"{sum(c.time_s for c in cases):.3f}",
    )
    if outcome.header:
        props = ET.SubElement(suite, "properties")
        for label, value in outcome.header:
            ET.SubElement(props, "property", name=_x(outcome.text(label)), value=_x(outcome.text(value, _LONG)))
    for c in cases:
        tc = ET.SubElement(
            suite,
            "testcase",
            name=_x(outcome.text(c.name)),
            classname=_x(outcome.text(f"loadgen.{outcome.kind}.{suite_name}")),
            time=f"{c.time_s:.3f}",
        )
        msg = _x(outcome.text(c.message, _LONG))
        if c.status == "fail":
            el = ET.SubElement(tc, "failure", message=msg, type="FAIL")
            el.text = _x(_details(outcome, c))
        elif c.status in ("inconclusive", "skip"):
            ET.SubElement(tc, "skipped", message=f"{_MARK[c.status]}: {msg}")
        if c.cells or c.status == "warn":
            ET.SubElement(tc, "system-out").text = _x(_details(outcome, c))


def _details(outcome: Outcome, c: Case) -> str:
    lines = [f"{_MARK[c.status]}: {outcome.text(c.message, _LONG)}"]
    lines += [f"{outcome.text(k)}: {outcome.text(v, _LONG)}" for k, v in c.cells]
    return "\n".join(lines)


# --------------------------------------------------------------------------- Markdown


def md_escape(text: Any, limit: int = _CLIP) -> str:
    """Text safe inside a GitHub/GitLab Markdown table cell.

    HTML is escaped (no tag or entity survives), and backslashes go before the
    characters that open links, images, emphasis, code spans, strikethrough or a
    new table cell; line breaks become spaces. Secrets must be gone before: the
    escapes would hide one from redaction (``Outcome.text`` does both, in order).
    """
    return _MD_PUNCT.sub(r"\\\1", html.escape(clean_text(text, limit), quote=False))


def to_markdown(outcome: Outcome) -> str:
    """A job-summary section: heading with the verdict, header lines, one table, notes."""
    icon = {"pass": "✅", "warn": "⚠️", "fail": "❌", "inconclusive": "⚠️"}.get(outcome.status, "")
    n = outcome.counts()
    counts = ", ".join(f"{v} {k}" for k, v in n.items() if v)

    def md(value: Any, limit: int = _CLIP) -> str:
        return md_escape(outcome.text(value, limit), limit)

    lines = [f"### {icon} loadgen {outcome.kind}: {_MARK[outcome.status]} ({counts})", ""]
    lines += [f"- **{md(label)}**: {md(value)}" for label, value in outcome.header]
    if outcome.header:
        lines.append("")
    cols = ("", *outcome.columns, "result", "why")
    lines.append("| " + " | ".join(md_escape(c) for c in cols) + " |")
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for c in outcome.cases:
        row = [md(c.name), *(md(c.cell(col)) for col in outcome.columns), f"**{_MARK[c.status]}**", md(c.message)]
        lines.append("| " + " | ".join(row) + " |")
    if outcome.notes:
        lines.append("")
        lines += [f"> {md(note, 500)}" for note in outcome.notes]
    lines.append("")
    lines.append(f"Exit code {outcome.exit_code}.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- JSON


def to_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome as JSON-able data; every string in it (keys too) as ``Outcome.text`` makes it."""
    cleaned: dict[str, Any] = _clean_json(outcome, _as_json(outcome))
    return cleaned


def _clean_json(outcome: Outcome, value: Any) -> Any:
    if isinstance(value, str):
        return outcome.text(value, _LONG)
    if isinstance(value, dict):
        return {outcome.text(k, _LONG): _clean_json(outcome, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_json(outcome, v) for v in value]
    return value


def _as_json(outcome: Outcome) -> dict[str, Any]:
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
    redact = outcome.secrets.redact_bytes  # once more over each whole file, after its escapes
    if junit:
        _write(Path(junit), redact(to_junit(outcome).encode()))
    if markdown:
        _write(Path(markdown), redact(to_markdown(outcome).encode()))
    elif step_summary and os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "ab") as f:
            f.write(redact(to_markdown(outcome).encode()))
    if json:
        data = orjson.dumps(to_json(outcome), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        _write(Path(json), redact(data))


def _write(path: Path, data: bytes) -> None:
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
