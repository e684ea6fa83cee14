"""report.html: one self-contained file per run folder (a sweep or a single run).

It works offline from file://: CSS is inlined, charts are inline SVG, there is no
script at all, and a Content-Security-Policy forbids fetching anything. Every
string that came from the endpoint or the user (model names, error text, labels,
configuration values) passes through ``html.escape``. Each chart sits in
``<figure class="chart" id="...">`` with a stable id, so tests and scrapers can
find it. ``pareto.svg`` and ``pareto.png`` are written beside the report.
The building blocks (escaping, number formats, the page shell and its CSP) are
``markup``, shared with the comparison page (``compare``); the charts come from
``html_charts``.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Any

from loadgen.analysis.points import PointFigures, RunAnalysis, analyze_run
from loadgen.analysis.stats import Dist
from loadgen.report.chart_style import to_png, to_svg
from loadgen.report.html_charts import (
    cdf_figure,
    errors_figure,
    goodput_figure,
    latency_figure,
    pareto_caption,
    pareto_figure,
    server_figure,
    timeseries_figure,
)
from loadgen.report.markup import esc, figure_html, fmt, fmt_ci, kv_html, page

__all__ = ["write_report", "render_html", "CHART_IDS"]

CHART_IDS = ("pareto", "goodput", "latency", "cdf-ttft", "cdf-itl", "timeseries", "server", "errors")


def _pct(d: Dist, p: float, ci: bool = False) -> str:
    if d.n == 0:
        return "-"
    v, lo, hi = d.pct(p)
    return fmt_ci(v, (lo, hi)) if ci else esc(fmt(v))


# --------------------------------------------------------------------------- the page


def write_report(run_dir: Path, *, analysis: RunAnalysis | None = None, **analyze: Any) -> Path:
    """Write report.html, pareto.svg and pareto.png into the run folder; returns the report's path."""
    run_dir = Path(run_dir)
    a = analysis if analysis is not None else analyze_run(run_dir, **analyze)
    fig = pareto_figure(a)
    svg = to_svg(fig)
    (run_dir / "pareto.svg").write_text(svg, encoding="utf-8")
    (run_dir / "pareto.png").write_bytes(to_png(fig))
    out = run_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(render_html(a, pareto_svg=svg), encoding="utf-8")
    tmp.replace(out)
    return out


def render_html(a: RunAnalysis, *, pareto_svg: str | None = None) -> str:
    """The whole report as a string (deterministic for the same records and options)."""
    m = a.meta
    title = f"loadgen {'sweep' if a.is_sweep else 'run'} {m.get('run_id', '')}"
    parts = [
        _header(a),
        '<nav><a href="#overview">overview</a><a href="#warnings">warnings</a><a href="#points">points</a>'
        + "".join(f'<a href="#{c}">{c}</a>' for c in CHART_IDS)
        + '<a href="#error-detail">error detail</a><a href="#config">configuration</a>'
        '<a href="#method">method</a></nav>',
        _overview(a),
        _warnings(a),
        _points_table(a),
        _charts(a, pareto_svg),
        _error_detail(a),
        _config(a),
        _method(a),
        f"<footer>loadgen {esc(m.get('tool', {}).get('version', ''))} · generated from "
        f"{esc(a.run_dir.name)}/records.parquet · re-render with <code>loadgen report {esc(a.run_dir.name)}</code>"
        "</footer>",
    ]
    return page(title, "\n".join(parts))


def _charts(a: RunAnalysis, pareto_svg: str | None) -> str:
    """The charts section: every chart of ``CHART_IDS`` with its caption."""
    goodput = (
        "Offered, completed and good (SLO-meeting) requests per second against load, with 95% "
        "intervals; SLO attainment % on the right axis."
        if a.slo
        else "Offered and completed requests per second against load (give --slo for goodput)."
    )
    figures = [
        figure_html("pareto", pareto_svg or to_svg(pareto_figure(a)), pareto_caption(a)),
        figure_html("goodput", to_svg(goodput_figure(a)), goodput),
        figure_html(
            "latency",
            to_svg(latency_figure(a)),
            "Latency percentiles against load; bands are the 95% order-statistic intervals "
            "(an unbounded side is left open).",
        ),
        figure_html(
            "cdf-ttft",
            to_svg(cdf_figure(a, "ttft")),
            "Distribution of TTFT (from the intended send time) per load point.",
        ),
        figure_html(
            "cdf-itl",
            to_svg(cdf_figure(a, "itl")),
            "Distribution of inter-token latency (per token: a chunk of k tokens gives k gaps of g/k).",
        ),
        figure_html(
            "timeseries",
            to_svg(timeseries_figure(a)),
            "The whole run over time; dotted lines mark where each load point started.",
        ),
        figure_html(
            "server",
            to_svg(server_figure(a)),
            "What the server reported over the same time axis (its Prometheus /metrics, scraped every "
            "second): requests running and waiting, and KV-cache use.",
        ),
        figure_html("errors", to_svg(errors_figure(a)), "Requests that did not succeed, per point and status."),
    ]
    return '<section id="charts"><h2>Charts</h2>' + "\n".join(figures) + "</section>"


def _when(ns: Any) -> str:
    if not isinstance(ns, int):
        return ""
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _header(a: RunAnalysis) -> str:
    m = a.meta
    kind = f"sweep of {len(a.points)} load points" if a.is_sweep else "single run"
    sim = " (built-in simulator)" if m.get("simulator") else ""
    return (
        f"<header><h1>loadgen report: {esc(m.get('model', '?'))}</h1>"
        f'<p class="sub">{esc(kind)} against <span class="mono">{esc(m.get("endpoint", "?"))}</span>{esc(sim)}'
        f" · run {esc(m.get('run_id', ''))} · {esc(_when(m.get('started_wall_ns')))}</p></header>"
    )


def _card(key: str, value: str, note: str = "") -> str:
    n = f'<div class="n">{note}</div>' if note else ""
    return f'<div class="card"><div class="k">{esc(key)}</div><div class="v">{value}</div>{n}</div>'


def _overview(a: RunAnalysis) -> str:
    cards = []
    best = max(a.points, key=lambda p: p.y if p.y == p.y else -1, default=None)
    unit = "output tok/s per GPU" if a.gpus else "output tok/s"
    if best is not None:
        cards.append(_card(f"peak {unit}", fmt_ci(best.y, best.y_ci), f"at {esc(best.label)}"))
    if a.slo is not None:
        c = a.capacity
        if c is not None and c.rate is not None:
            cards.append(
                _card(
                    f"capacity at SLO ({a.target_pct:g}% attainment)",
                    f"{esc(fmt(c.rate))} req/s",
                    esc(f"{bracket_text(c.lower, c.upper)}. {c.note}"),
                )
            )
            at = a.point_at(c.rate)
            if at is not None:
                cards.append(
                    _card(
                        "goodput at capacity",
                        fmt_ci(at.summary.goodput_rps, at.goodput_ci) + " req/s",
                        esc(f"SLO: {a.slo}"),
                    )
                )
                for name, cost in at.costs.items():
                    cards.append(_card(f"$/M output tokens at capacity ({name})", esc(fmt(cost))))
        else:
            cards.append(_card("capacity at SLO", "none", esc(c.note if c else "no open-loop point")))
    elif best is not None:
        for name, cost in best.costs.items():
            cards.append(_card(f"$/M output tokens at peak ({name})", esc(fmt(cost))))
    if a.saturation or a.is_sweep:
        cards.append(
            _card(
                "saturation",
                "reached" if a.saturation else "not reached",
                esc(a.saturation or a.search_end or "no point fell behind the offered load"),
            )
        )
    front = ", ".join(a.points[i].short_label for i in a.frontier)
    text = (
        f"<p>Pareto frontier (non-dominated points, ★ in the table): {esc(front) or 'none'}.</p>" if a.is_sweep else ""
    )
    return f'<section id="overview"><h2>Overview</h2><div class="cards">{"".join(cards)}</div>{text}</section>'


def bracket_text(lower: float, upper: float) -> str:
    """Capacity's confidence bracket in words."""
    lo = f"confirmed to meet it at {fmt(lower)} req/s" if lower > 0 else "no rate confirmed to meet it"
    hi = f"confirmed to miss it at {fmt(upper)} req/s" if math.isfinite(upper) else "no rate confirmed to miss it"
    return f"{lo}; {hi}"


def _warnings(a: RunAnalysis) -> str:
    items = [esc(w) for w in a.warnings]
    for p in a.points:
        items += [f"{esc(p.short_label)}: {esc(w)}" for w in p.warnings]
    if not items:
        return (
            '<section id="warnings"><h2>Validity</h2><ul class="warnings none"><li>no validity warnings: '
            "the client kept up, samples suffice, token counts agree</li></ul></section>"
        )
    lis = "".join(f"<li>{w}</li>" for w in items)
    return f'<section id="warnings"><h2>Validity warnings</h2><ul class="warnings">{lis}</ul></section>'


def _points_table(a: RunAnalysis) -> str:
    rows = "".join(_point_row(a, p) for p in a.points)
    th = "".join(
        f'<th class="l">{esc(h)}</th>' if i in (1, 2) else f"<th>{esc(h)}</th>" for i, h in enumerate(_head(a))
    )
    window = esc(a.points[0].summary.window.how) if a.points else ""
    kinds = sorted({p.label.split(" @ ")[0] for p in a.points if p.rate is not None})
    arrival = f" Arrivals: {esc(', '.join(kinds))}." if kinds else ""
    return (
        f'<section id="points"><h2>Load points</h2><p class="sub">Each point counts the requests scheduled in its '
        f"measurement window ({window}); ★ marks the Pareto frontier.{arrival}</p>"
        f'<div class="scroll"><table><thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table></div>'
        "</section>"
    )


def _head(a: RunAnalysis) -> list[str]:
    """The points table's columns, in the order of ``_point_row``'s cells."""
    head = ["#", "load", "phase", "offered req/s", "sent req/s", "completed req/s", "output tok/s [95% CI]"]
    head += ["output tok/s/GPU"] if a.gpus is not None else []
    head += ["total tok/s", "per-user tok/s p50", "per-user p90", "TTFT p50 ms", "TTFT p99 ms [CI]"]
    head += ["TPOT p50 ms", "TPOT p99 ms", "ITL p50 ms", "ITL p99 ms", "E2E p50 ms", "E2E p99 ms [CI]"]
    head += ["goodput req/s [CI]", "SLO attainment % [CI]"] if a.slo else []
    return head + ["lag p99 ms", "ok", "failed", "cancelled"] + [f"$/M out ({p})" for p in a.prices]


def _point_row(a: RunAnalysis, p: PointFigures) -> str:
    """One load point's row of the points table (frontier points marked)."""
    s = p.summary
    cells = [str(p.index), esc(p.short_label), esc(p.phase), esc(fmt(s.offered_rps)), esc(fmt(s.sent_rps))]
    cells += [esc(fmt(s.completed_rps)), fmt_ci(s.output_tps, p.output_tps_ci)]
    cells += [fmt_ci(p.y, p.y_ci)] if a.gpus is not None else []
    cells += [esc(fmt(s.total_tps)), esc(fmt(p.x)), esc(fmt(p.per_user_p90))]
    cells += [_pct(s.ttft, 50), _pct(s.ttft, 99, True), _pct(s.tpot, 50), _pct(s.tpot, 99)]
    cells += [_pct(s.itl, 50), _pct(s.itl, 99), _pct(s.e2e, 50), _pct(s.e2e, 99, True)]
    if a.slo:
        att = p.attainment_ci
        cells += [
            fmt_ci(s.goodput_rps, p.goodput_ci),
            fmt_ci(s.slo_attainment_pct, (att[0] * 100, att[1] * 100) if att else None),
        ]
    cells += [_pct(s.schedule_lag, 99), str(s.ok), str(s.failed), str(s.cancelled)]
    cells += [esc(fmt(p.costs.get(name))) for name in a.prices]
    cls = ' class="frontier"' if p.on_frontier else ""
    tds = "".join(f'<td class="l">{c}</td>' if i in (1, 2) else f"<td>{c}</td>" for i, c in enumerate(cells))
    return f"<tr{cls}>{tds}</tr>"


# --------------------------------------------------------------------------- text sections


def _error_detail(a: RunAnalysis) -> str:
    blocks = []
    for p in a.points:
        s = p.summary
        if not (s.failed or s.cancelled):
            continue
        http = ", ".join(f"HTTP {k}: {v}" for k, v in s.errors_by_http.items())
        status = ", ".join(f"{k}: {v}" for k, v in s.errors_by_status.items())
        ex = "".join(f'<pre class="err">{esc(e)}</pre>' for e in s.error_examples)
        blocks.append(f"<h3>{esc(p.short_label)}</h3><p>{esc(status)}{' · ' + esc(http) if http else ''}</p>{ex}")
    body = "".join(blocks) or "<p>No request failed.</p>"
    return f'<section id="error-detail"><h2>Errors</h2>{body}</section>'


def _config(a: RunAnalysis) -> str:
    m = a.meta
    parts = ["<h3>Settings</h3>", kv_html(m.get("settings", {})), "<h3>Workload</h3>", kv_html(m.get("workload", {}))]
    if m.get("sweep"):
        parts += ["<h3>Sweep</h3>", kv_html(m["sweep"])]
        plan = [
            {
                "point": p.get("index"),
                "arrival": p.get("arrival", {}).get("label"),
                "phase": p.get("phase"),
                "why": p.get("why"),
                "measured s": p.get("duration_s"),
                "salt": p.get("salt"),
            }
            for p in m.get("points", [])
        ]
        rows = "".join("<tr>" + "".join(f'<td class="l">{esc(v)}</td>' for v in r.values()) + "</tr>" for r in plan)
        head = "".join(f'<th class="l">{esc(k)}</th>' for k in (plan[0] if plan else {}))
        parts += ["<h3>Points as planned</h3>", f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"]
    if m.get("simulator"):
        parts += ["<h3>Simulator</h3>", kv_html(m["simulator"])]
    parts += [
        "<h3>Client and host</h3>",
        kv_html(
            {"command": " ".join(map(str, m.get("command", []))), "tool": m.get("tool", {}), "host": m.get("host", {})}
        ),
    ]
    return f'<section id="config"><h2>Run configuration</h2>{"".join(parts)}</section>'


def _method(a: RunAnalysis) -> str:
    if a.point_salt is None:
        salt = "A single run: prompts carry the run's own salt, if any."
    elif a.point_salt:
        salt = (
            "Each load point's prompts carry a point-specific salt (p0, p1, …), so prefix-cache state "
            "cannot carry from one point into the next; the same settings give the same salts, so a bake-off "
            "sends identical traffic to every vendor."
        )
    else:
        salt = (
            "Per-point salting was OFF (--no-point-salt): prompts repeat across load points, so later points "
            "can hit prefix caches warmed by earlier ones."
        )
    slo = (
        (
            f"Goodput counts requests that finished OK inside the window and met every bound of the SLO "
            f"({esc(a.slo)}); attainment = met / scheduled in the window, failures count as misses. Capacity at SLO "
            f"is the highest offered rate whose attainment is at least {a.target_pct:g}%; it is confirmed when the "
            "one-sided 95% Clopper-Pearson lower bound reaches the target."
        )
        if a.slo
        else "No SLO was given, so goodput and capacity at SLO are not computed (use --slo)."
    )
    static = [
        "Open loop: latency is measured from each request's intended send time, so queueing in the endpoint "
        "(or a client that fell behind) cannot hide latency. Schedule lag shows whether the client kept up.",
        "TTFT = first output-carrying chunk − intended send; TPOT = (last − first) / (tokens − 1) per request; "
        "per-user speed = 1000 / TPOT per request (never throughput divided by concurrency).",
        "Percentile intervals are distribution-free 95% order-statistic intervals; an unbounded side is shown as ∞. "
        "Output tok/s intervals are batch means over 8 sub-windows; goodput intervals are exact Poisson.",
        salt,
        "Cost per million output tokens = price per GPU-hour × GPUs / (output tok/s × 3600) × 10⁶.",
    ]
    lis = "".join(f"<li>{esc(i)}</li>" for i in static) + f"<li>{slo}</li>"
    return f'<section id="method"><h2>Method</h2><ul>{lis}</ul></section>'
