"""compare.html: a bake-off as one self-contained page (same rules as report.html).

Suspect runs and points (and interrupted runs) are shown first, at the top of the
page, then traffic mismatches, in red boxes: a comparison of suspect data or of
different traffic is not a bake-off. Verdicts list every run's value with its
interval and name a winner only where the intervals separate and the figures are
valid ("withheld" where a suspect run or point would decide it).
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from loadgen.analysis.compare import Comparison, Verdict
from loadgen.analysis.stats import Dist
from loadgen.redaction import Secrets
from loadgen.report.chart_style import to_svg
from loadgen.report.charts import Series, overlay_chart, pareto_chart
from loadgen.report.markup import esc, figure_html, fmt, fmt_bound, kv_html, page

__all__ = ["render_compare", "write_compare", "COMPARE_CHART_IDS"]

COMPARE_CHART_IDS = ("pareto", "goodput", "ttft-p99", "tpot-p50")


def _value(v: Verdict, name: str) -> str:
    """One run's figure: ``≥`` where censored samples make it a lower bound, "unbounded" for an open end."""
    if name not in v.values or math.isnan(v.values[name][0]):
        return "-"
    est, lo, hi = v.values[name]
    value_lb, lo_lb = v.lower_bounds.get(name, (False, False))
    ci = f"[{esc(fmt_bound(lo, lo_lb))}, {esc(fmt_bound(hi))}]"
    return f'{esc(fmt_bound(est, value_lb))} <span class="ci">{ci}</span>'


def _verdict_rows(c: Comparison, verdicts: list[Verdict]) -> str:
    rows = []
    for v in verdicts:
        cells = "".join(f"<td>{_value(v, n)}</td>" for n in c.names)
        win = f'<span class="win">{esc(v.winner)}</span>' if v.winner else '<span class="nowin">no clear winner</span>'
        if v.withheld:
            win = '<span class="nowin">withheld (suspect)</span>'
        rows.append(
            f'<tr><td class="l">{esc(v.metric)}</td><td class="l">{esc(v.unit)}</td>{cells}'
            f'<td class="l">{win}</td><td class="l">{esc(v.detail)}</td></tr>'
        )
    head = "".join(f"<th>{esc(n)}</th>" for n in c.names)
    return (
        f'<div class="scroll"><table><thead><tr><th class="l">figure</th><th class="l">unit</th>{head}'
        f'<th class="l">winner</th><th class="l">why</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
    )


def _charts(c: Comparison) -> str:
    """The overlaid Pareto frontiers, then goodput, TTFT p99 and TPOT p50 against load, one line per run."""
    good, ttft, tpot = _overlay_series(c)
    load = c.sides[0].analysis.load_unit
    what = "goodput req/s (met the SLO)" if c.slo is not None else "completed req/s"
    return "\n".join(
        [
            figure_html(
                "pareto",
                to_svg(_pareto(c)),
                "Overlaid Pareto frontiers: output tok/s against per-user speed (median 1/TPOT).",
            ),
            figure_html(
                "goodput",
                to_svg(overlay_chart(good, x_label=load, y_label=what)),
                f"{esc(what.capitalize())} against load, with 95% intervals.",
            ),
            figure_html(
                "ttft-p99",
                to_svg(overlay_chart(ttft, x_label=load, y_label="TTFT p99 ms", log_y=True)),
                "TTFT p99 against load, with 95% order-statistic intervals.",
            ),
            figure_html(
                "tpot-p50",
                to_svg(overlay_chart(tpot, x_label=load, y_label="TPOT p50 ms", log_y=True)),
                "Median TPOT against load, with 95% intervals.",
            ),
        ]
    )


def _pareto(c: Comparison) -> Figure:
    per_gpu = all(s.analysis.gpus is not None for s in c.sides)
    series = []
    for s in c.sides:
        a = s.analysis
        ys = [p.y if per_gpu else p.summary.output_tps for p in a.points]
        front = sorted(a.frontier, key=lambda i: a.points[i].x)
        series.append(Series(s.name, [p.x for p in a.points], ys, front))
    tpot = c.slo.tpot_ms if c.slo is not None else None
    return pareto_chart(
        series,
        y_label="output tok/s per GPU" if per_gpu else "output tok/s (aggregate)",
        x_min_slo=1000.0 / tpot if tpot else None,
    )


_Overlay = dict[str, tuple[list[float], list[float], list[tuple[float, float]]]]
_NAN2 = (math.nan, math.nan)


def _overlay_series(c: Comparison) -> tuple[_Overlay, _Overlay, _Overlay]:
    """Per run, against load: goodput (or completed req/s without an SLO), TTFT p99, TPOT p50, with intervals."""
    good: _Overlay = {}
    ttft: _Overlay = {}
    tpot: _Overlay = {}
    for s in c.sides:
        ps = sorted(s.analysis.points, key=lambda p: p.load)
        x = [p.load for p in ps]
        if c.slo is not None:
            rps = [math.nan if p.summary.goodput_rps is None else p.summary.goodput_rps for p in ps]
            good[s.name] = (x, rps, [p.goodput_ci or _NAN2 for p in ps])
        else:
            good[s.name] = (x, [p.summary.completed_rps for p in ps], [])
        ttft[s.name] = (x, *_pct_series([p.summary.ttft for p in ps], 99))
        tpot[s.name] = (x, *_pct_series([p.summary.tpot for p in ps], 50))
    return good, ttft, tpot


def _pct_series(dists: list[Dist], pct: float) -> tuple[list[float], list[tuple[float, float]]]:
    """A percentile of each distribution and its interval (NaN where it has no samples)."""
    values, cis = [], []
    for d in dists:
        v, lo, hi = d.pct(pct) if d.n else (math.nan, math.nan, math.nan)
        values.append(v)
        cis.append((lo, hi))
    return values, cis


def render_compare(c: Comparison) -> str:
    runs = "".join(
        f'<tr><td class="l">{esc(s.name)}</td><td class="l mono">{esc(s.analysis.meta.get("endpoint", "?"))}</td>'
        f'<td class="l">{esc(s.analysis.meta.get("model", "?"))}</td><td class="l">{esc(s.analysis.run_dir)}</td>'
        f"<td>{len(s.analysis.points)}</td><td>{esc(fmt(s.analysis.gpus))}</td></tr>"
        for s in c.sides
    )
    suspect = ""
    if c.suspects:
        items = "".join(f"<li>{esc(m)}</li>" for m in c.suspects)
        suspect = (
            '<div class="loud" id="suspect"><strong>Some of these runs are suspect; no winner is named on '
            f"their figures:</strong><ul>{items}</ul></div>"
        )
    traffic = ""
    if c.same_traffic is not None:
        cls = "loud" if c.same_traffic.identical is False else "sub"
        traffic = f'<p class="{cls}" id="traffic">{esc(c.same_traffic.line)}</p>'
    mism = ""
    if c.mismatches:
        items = "".join(f"<li>{esc(m)}</li>" for m in c.mismatches)
        mism = (
            f'<div class="loud" id="mismatch"><strong>These runs did not send the same traffic; the comparison '
            f"is not a fair bake-off:</strong><ul>{items}</ul></div>"
        )
    notes = "".join(f"<p>{esc(n)}</p>" for n in c.notes)
    slo = (
        f"SLO: {esc(c.slo)}, target {c.target_pct:g}% attainment."
        if c.slo is not None
        else "No SLO given: capacity and goodput at SLO are not compared (use --slo)."
    )
    head = [v for v in c.verdicts if v.group == "headline"]
    matched = [v for v in c.verdicts if v.group != "headline"]
    warn = "".join(f"<li>{esc(s.name)}: {esc(w)}</li>" for s in c.sides for w in s.analysis.warnings)
    warn += "".join(
        f"<li>{esc(s.name)} {esc(p.short_label)}: {esc(w)}</li>"
        for s in c.sides
        for p in s.analysis.points
        for w in p.warnings
    )
    body = [
        f"<header><h1>loadgen bake-off: {esc(' vs '.join(c.names))}</h1><p class='sub'>{slo}</p></header>",
        suspect,
        traffic,
        mism,
        f'<section id="runs"><h2>Runs</h2><table><thead><tr><th class="l">name</th><th class="l">endpoint</th>'
        f'<th class="l">model</th><th class="l">folder</th><th>points</th><th>GPUs</th></tr></thead>'
        f"<tbody>{runs}</tbody></table>{notes}</section>",
        f'<section id="verdicts"><h2>Verdicts</h2><p class="sub">A winner is named only where its 95% interval '
        f"clears every other run's.</p>{_verdict_rows(c, head)}</section>",
        f'<section id="matched"><h2>At matched load</h2>'
        f"{_verdict_rows(c, matched) if matched else '<p>No load point was measured by every run.</p>'}</section>",
        f'<section id="charts"><h2>Charts</h2>{_charts(c)}</section>',
        f'<section id="warnings"><h2>Validity warnings</h2><ul class="warnings">{warn or "<li>none</li>"}</ul>'
        "</section>",
        '<section id="config"><h2>Workloads</h2>'
        + "".join(f"<h3>{esc(s.name)}</h3>{kv_html(s.analysis.meta.get('workload', {}))}" for s in c.sides)
        + "</section>",
    ]
    return page("loadgen compare: " + " vs ".join(c.names), "\n".join(body))


def write_compare(c: Comparison, out_dir: Path, secrets: Secrets | None = None) -> Path:
    """compare.html in ``out_dir``, with ``secrets`` (the command's) removed from the whole page."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "compare.html"
    path.write_bytes((secrets or Secrets()).redact_bytes(render_compare(c).encode("utf-8")))
    return path
