"""The common JUnit XML schema, as rules a test can check without an XSD validator.

The rules of Jenkins xunit's junit-10.xsd (the schema CI readers of JUnit XML agree on;
GitHub and GitLab report parsers accept what it accepts): which element may hold which,
which attributes each may carry and which it must, and the form of ``time``. No XSD
library is a dependency of this project, so the rules are written out here, from the
schema's text; ``junit_problems`` lists every breach in a document.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

__all__ = ["junit_problems"]

_TEXT = ("failure", "error", "skipped", "system-out", "system-err")
# element: (allowed children, allowed attributes, required attributes)
_RULES: dict[str, tuple[frozenset[str], frozenset[str], frozenset[str]]] = {
    "testsuites": (frozenset({"testsuite"}), frozenset({"name", "time", "tests", "failures", "errors"}), frozenset()),
    "testsuite": (
        frozenset({"testsuite", "properties", "testcase", "system-out", "system-err"}),
        frozenset(
            {"name", "tests", "failures", "errors", "group", "time", "skipped", "timestamp", "hostname", "id"}
            | {"package", "file", "log", "url"}
        ),
        frozenset({"name", "tests", "failures", "errors"}),
    ),
    "properties": (frozenset({"property"}), frozenset(), frozenset()),
    "property": (frozenset(), frozenset({"name", "value"}), frozenset({"name", "value"})),
    "testcase": (
        frozenset({"skipped", "error", "failure", "system-out", "system-err"})
        | frozenset({"rerunFailure", "rerunError", "flakyFailure", "flakyError"}),
        frozenset({"name", "time", "classname", "group"}),
        frozenset({"name"}),
    ),
    **{t: (frozenset(), frozenset({"type", "message"}), frozenset()) for t in ("failure", "error", "skipped")},
    **{t: (frozenset(), frozenset(), frozenset()) for t in ("system-out", "system-err")},
}
_TIME = re.compile(r"(([0-9]{0,3},)*[0-9]{3}|[0-9]{0,3})*(\.[0-9]*)?")  # the schema's SUREFIRE_TIME
_TIMED = ("testsuites", "testsuite")


def junit_problems(xml: str | bytes) -> list[str]:
    """Every way ``xml`` breaks junit-10.xsd (empty when it validates)."""
    root = ET.fromstring(xml)
    problems = [] if root.tag in ("testsuites", "testsuite") else [f"root element <{root.tag}>"]
    todo = [root]
    while todo:
        el = todo.pop()
        rule = _RULES.get(el.tag)
        if rule is None:
            problems.append(f"unknown element <{el.tag}>")
            continue
        children, allowed, required = rule
        problems += [f"<{el.tag}> may not carry {a!r}" for a in sorted(set(el.attrib) - allowed)]
        problems += [f"<{el.tag}> lacks {a!r}" for a in sorted(required - set(el.attrib))]
        if el.tag in _TIMED and "time" in el.attrib and not _TIME.fullmatch(el.attrib["time"]):
            problems.append(f"<{el.tag}> time {el.attrib['time']!r} is not a SUREFIRE_TIME")
        for child in el:
            if child.tag not in children:
                problems.append(f"<{el.tag}> may not hold <{child.tag}>")
            todo.append(child)
        if el.tag not in _TEXT and (el.text or "").strip():
            problems.append(f"<{el.tag}> holds text")
    return problems
