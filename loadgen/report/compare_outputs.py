"""What ``compare`` hands to machines and to pull requests: compare.json and compare.md.

compare.json (``SCHEMA_VERSION``) holds the runs (id, endpoint label, model, state, validity
as ``{state, codes, warnings: [{code, message}]}``, traffic fingerprints), whether they sent
identical traffic (``identical_traffic``: true when fingerprints prove it, false when
fingerprints or settings differ, null when only the settings agree; with the reason), and
each verdict: the figure, each run's value and interval with the unit in the key names
(``value_ms``, ``lo_rps``, ...), the lower-bound flags censored samples set, the winner or
null and why it was withheld. Standard JSON only: an unbounded interval end is null with
``lo_unbounded`` / ``hi_unbounded`` true, never an "inf" string.

compare.md puts what withholds a verdict first (interrupted and suspect runs, then the
traffic line and warnings), then the verdict tables.

Everything read from a run folder is untrusted: every string passes ``Secrets.redact`` (the
secrets the command was given), then ``clean_text``, and in Markdown ``md_escape``; each
file is redacted once more as a whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadgen.analysis.compare import Comparison, Side, Verdict
from loadgen.analysis.points import slo_to_json
from loadgen.analysis.traffic import FINGERPRINT_KEYS
from loadgen.analysis.validity import Caveat, ValidityJson, run_state, validity_json
from loadgen.conformance.ci_outputs import md_escape
from loadgen.redaction import Secrets
from loadgen.report.markup import fmt, fmt_bound
from loadgen.run_folder import json_bytes
from loadgen.untrusted import clean_text

__all__ = ["SCHEMA_VERSION", "UNIT_KEYS", "compare_json", "compare_markdown", "cell_text", "write_compare_outputs"]

SCHEMA_VERSION = 1
# a verdict's unit, as the suffix of its value keys
UNIT_KEYS = {
    "ms": "ms",
    "req/s": "rps",
    "tok/s": "tok_per_s",
    "output tok/s": "tok_per_s",
    "output tok/s per GPU": "tok_per_s_per_gpu",
    "$": "usd_per_m_output_tokens",
}
_LONG = 1000


def _unit_key(unit: str) -> str:
    return UNIT_KEYS.get(unit) or "".join(ch if ch.isalnum() else "_" for ch in unit).strip("_") or "value"


def _num(v: float | None) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


# --------------------------------------------------------------------------- JSON


def _values(c: Comparison, v: Verdict) -> list[dict[str, Any]]:
    """Each run's value of one figure, interval and flags, the unit in the key names."""
    u, out = _unit_key(v.unit), []
    for name in c.names:
        est, lo, hi = v.values.get(name, (math.nan, math.nan, math.nan))
        value_lb, lo_lb = v.lower_bounds.get(name, (False, False))
        out.append(
            {
                "run": name,
                "measured": name in v.values and not math.isnan(est),
                f"value_{u}": _num(est),
                "lower_bound": value_lb,
                f"lo_{u}": _num(lo),
                "lo_lower_bound": lo_lb,
                "lo_unbounded": lo == -math.inf,
                f"hi_{u}": _num(hi),
                "hi_unbounded": hi == math.inf,
            }
        )
    return out


def _verdict_json(c: Comparison, v: Verdict) -> dict[str, Any]:
    return {
        "figure": v.key,
        "metric": v.metric,
        "group": v.group,
        "at": v.at or None,
        "unit": v.unit,
        "better": v.better,
        "values": _values(c, v),
        "winner": v.winner,
        "withheld": bool(v.withheld),
        "withheld_why": v.withheld or None,
        "why": v.detail,
    }


def _entry(meta: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    """A sweep point's run.json entry by index (a single run: the run.json itself)."""
    entries = meta.get("points")
    if not isinstance(entries, list) or not entries:
        return meta
    for e in entries:
        if isinstance(e, Mapping) and e.get("index", e.get("point")) == index:
            return e
    return {}


def _fingerprints(part: Mapping[str, Any]) -> dict[str, str | int | None]:
    client = part.get("client")
    client = client if isinstance(client, Mapping) else {}
    out: dict[str, str | int | None] = {
        k: (v if isinstance(v := client.get(k), str) and v else None) for k in FINGERPRINT_KEYS
    }
    n = client.get("traffic_requests")
    out["traffic_requests"] = n if type(n) is int else None
    return out


def _run_validity(s: Side) -> ValidityJson:
    """A run's validity with every point's (a sweep's point caveats named by their point)."""
    a = s.analysis
    caveats = list(a.caveats)
    for p in a.points:
        caveats += [Caveat(w.code, f"{p.short_label}: {w.message}" if a.is_sweep else w.message) for w in p.caveats]
    return validity_json(caveats)


def _run_json(s: Side) -> dict[str, Any]:
    a, meta = s.analysis, s.analysis.meta
    state, reason = run_state(meta)
    points = [
        {
            "index": p.index,
            "label": p.short_label,
            "validity": validity_json(p.caveats, also=a.validity),
            "withholds_winners": a.point_validity(p).withholding.suspect,
            **_fingerprints(_entry(meta, p.index)),
        }
        for p in a.points
    ]
    return {
        "name": s.name,
        "id": meta.get("run_id"),
        "folder": str(a.run_dir),
        "endpoint": meta.get("endpoint"),
        "model": meta.get("model"),
        "state": state,
        "interrupted_reason": reason,
        "sweep": a.is_sweep,
        "gpus": a.gpus,
        "validity": _run_validity(s),
        "withholds_winners": a.validity.withholding.suspect or any(p["withholds_winners"] for p in points),
        **(_fingerprints(meta) if not a.is_sweep else dict.fromkeys((*FINGERPRINT_KEYS, "traffic_requests"))),
        "points": points,
    }


def _clean(value: Any, secrets: Secrets) -> Any:
    """Every string (keys too) redacted, then one clean line; numbers, bools and nulls as they are."""
    if isinstance(value, str):
        return clean_text(secrets.redact(value), _LONG)
    if isinstance(value, Mapping):
        return {_clean(str(k), secrets): _clean(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v, secrets) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def compare_json(c: Comparison, secrets: Secrets | None = None) -> dict[str, Any]:
    """The comparison as standard JSON data (see the module docstring)."""
    t = c.same_traffic
    slo_name = c.sides[0].analysis.slo_name if c.sides else ""
    data = {
        "tool": "loadgen",
        "kind": "compare",
        "schema_version": SCHEMA_VERSION,
        "title": " vs ".join(c.names),
        "identical_traffic": t.identical if t is not None else None,
        "identical_traffic_reason": t.line if t is not None else "not checked",
        "traffic": {
            "identical": t.identical if t is not None else None,
            "basis": t.basis if t is not None else None,
            "fingerprint": t.fingerprint if t is not None else None,
            "differences": list(t.differences) if t is not None else [],
        },
        "slo": slo_to_json(c.slo, slo_name, c.target_pct),
        "target_pct": c.target_pct,
        "suspects": list(c.suspects),
        "mismatches": list(c.mismatches),
        "notes": list(c.notes),
        "runs": [_run_json(s) for s in c.sides],
        "verdicts": [_verdict_json(c, v) for v in c.verdicts],
    }
    cleaned: dict[str, Any] = _clean(data, secrets or Secrets())
    return cleaned


# --------------------------------------------------------------------------- Markdown


def cell_text(v: Verdict, name: str) -> str:
    """One run's figure as text: ``estimate [lo, hi]``, ``≥`` where censored samples make a
    figure a lower bound, "unbounded" for an open interval end, "-" where not measured."""
    if name not in v.values:
        return "-"
    est, lo, hi = v.values[name]
    value_lb, lo_lb = v.lower_bounds.get(name, (False, False))
    if math.isnan(est):
        return "-"
    return f"{fmt_bound(est, value_lb)} [{fmt_bound(lo, lo_lb)}, {fmt_bound(hi)}]"


def _table(c: Comparison, verdicts: list[Verdict], md: Any) -> list[str]:
    cols = ["figure", "unit", *c.names, "winner", "why"]
    lines = ["| " + " | ".join(md(x) for x in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for v in verdicts:
        win = "withheld (suspect)" if v.withheld else (f"**{md(v.winner)}**" if v.winner else "no clear winner")
        row = [md(v.metric), md(v.unit), *(md(cell_text(v, n)) for n in c.names), win, md(v.detail, 500)]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def compare_markdown(c: Comparison, secrets: Secrets | None = None) -> str:
    """A pull-request or job-summary section: what withholds verdicts first, then the tables."""
    sec = secrets or Secrets()

    def md(value: Any, limit: int = 300) -> str:
        return md_escape(sec.redact(str(value)), limit)

    lines = [f"### loadgen compare: {md(' vs '.join(c.names))}", ""]
    first = [*c.suspects]
    if c.same_traffic is not None:
        first.append(c.same_traffic.line)
    first += [f"WARNING: {m}" for m in c.mismatches]
    lines += [f"- {md(line, 500)}" for line in first]
    lines += [f"- note: {md(n, 500)}" for n in c.notes]
    slo = f"SLO: {c.slo}, target {c.target_pct:g}% attainment." if c.slo is not None else "No SLO given."
    lines += ["", md(slo), "", "A winner is named only where its 95% interval clears every other run's.", ""]
    head = [v for v in c.verdicts if v.group == "headline"]
    matched = [v for v in c.verdicts if v.group != "headline"]
    lines += _table(c, head, md)
    if matched:
        lines += ["", "#### At matched load", ""] + _table(c, matched, md)
    lines += ["", "| run | endpoint | model | points |", "|---|---|---|---|"]
    for s in c.sides:
        meta = s.analysis.meta
        row = [md(s.name), md(meta.get("endpoint", "?")), md(meta.get("model", "?")), fmt(len(s.analysis.points))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- files


def write_compare_outputs(
    c: Comparison, *, json_path: Path | None, markdown_path: Path | None, secrets: Secrets | None = None
) -> list[Path]:
    """Write compare.json and compare.md where asked (each redacted once more as a whole); the paths written."""
    sec, out = secrets or Secrets(), []
    if json_path is not None:
        _write(json_path, sec.redact_bytes(json_bytes(compare_json(c, sec))))
        out.append(json_path)
    if markdown_path is not None:
        _write(markdown_path, sec.redact_bytes(compare_markdown(c, sec).encode()))
        out.append(markdown_path)
    return out


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
