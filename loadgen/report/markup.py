"""The HTML building blocks of loadgen's report pages: escaping, number formats, the page shell.

``page`` wraps a body into one self-contained document that works offline from
file://: the CSS is inlined, there is no script, and a Content-Security-Policy
forbids fetching anything. ``esc`` is the one escape every string from the
endpoint or the user passes through; ``fmt`` / ``fmt_ci`` write numbers the same
way in every table. Kept apart from ``html`` (the run report's sections) because
the comparison page (``compare``) is built from the same blocks.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any

from loadgen.analysis.stats import Dist
from loadgen.specfile import builtin_dir

__all__ = ["page", "esc", "fmt", "fmt_ci", "fmt_bound", "pct_html", "figure_html", "kv_html"]

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_FALLBACK_CSS = "body{font-family:sans-serif;max-width:1180px;margin:auto}table{border-collapse:collapse}"


def esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def fmt(v: float | int | None, digits: int = 3) -> str:
    """A number for a table: 3 significant digits, '-' for missing, '∞' for unbounded."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if isinstance(v, int) or float(v).is_integer() and abs(v) >= 10:
        return f"{int(v):,}"
    a = abs(float(v))
    if a >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def fmt_ci(v: float | None, ci: tuple[float, float] | None, digits: int = 3) -> str:
    text = esc(fmt(v, digits))
    if ci is None or v is None or (isinstance(v, float) and math.isnan(v)):
        return text
    return f'{text} <span class="ci">[{esc(fmt(ci[0], digits))}, {esc(fmt(ci[1], digits))}]</span>'


def fmt_bound(v: float, lower_bound: bool = False) -> str:
    """One figure of a percentile as text: ``≥ x`` when only a lower bound, "unbounded" for an
    open interval end (an infinite value), "-" when missing."""
    if isinstance(v, float) and math.isinf(v):
        return "unbounded"
    text = fmt(v)
    return f"≥ {text}" if lower_bound and text != "-" else text


def pct_html(d: Dist, p: float, ci: bool = False, censored: bool = False) -> str:
    """Percentile ``p`` of ``d`` as a table cell: ``≥ x`` where censored samples make it a lower
    bound, its 95% interval with ``ci`` (an open end "unbounded"), "(k censored)" with ``censored``."""
    if d.n == 0:
        return "-"
    v, lo, hi = d.pct(p)
    f = d.pct_flags(p)
    text = esc(fmt_bound(v, f.value))
    if ci and not math.isnan(v):
        text += f' <span class="ci">[{esc(fmt_bound(lo, f.lo))}, {esc(fmt_bound(hi))}]</span>'
    if censored and d.censored:
        text += f' <span class="cens">({d.censored:,} censored)</span>'
    return text


def _css() -> str:
    path = builtin_dir("reports") / "report.css"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return _FALLBACK_CSS


def page(title: str, body: str) -> str:
    """A complete, self-contained HTML document around ``body`` (already escaped)."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>\n{_css()}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def figure_html(chart_id: str, svg: str, caption: str) -> str:
    return f'<figure class="chart" id="{esc(chart_id)}">\n{svg}\n<figcaption>{caption}</figcaption>\n</figure>'


def kv_html(d: dict[str, Any]) -> str:
    """A definition list of a (flattened) dict; every key and value escaped."""
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(_short(v))}</dd>" for k, v in _flatten(d))
    return f'<dl class="kv">{rows}</dl>'


def _flatten(d: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(d, dict):
        if not d and prefix:
            yield prefix, "{}"
        for k, v in d.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, d


def _short(v: Any, limit: int = 400) -> str:
    s = "null" if v is None else str(v)
    return s if len(s) <= limit else s[:limit] + "…"
