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

from loadgen.analysis.point_figures import PointFigures
from loadgen.analysis.points import RunAnalysis, analyze_run
from loadgen.analysis.validity import FIRST_CODES
from loadgen.report.banner import banner_lines, virtual_line
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
from loadgen.report.html_tables import points_section
from loadgen.report.markup import esc, figure_html, fmt, fmt_ci, kv_html, page
from loadgen.report.request_terms import request_terms

__all__ = ["write_report", "render_html", "report_banner", "CHART_IDS"]

CHART_IDS = ("pareto", "goodput", "latency", "cdf-ttft", "cdf-itl", "timeseries", "server", "errors")


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
        _banner(a),
        '<nav><a href="#overview">overview</a><a href="#warnings">warnings</a><a href="#points">points</a>'
        + "".join(f'<a href="#{c}">{c}</a>' for c in CHART_IDS)
        + '<a href="#error-detail">error detail</a><a href="#config">configuration</a>'
        '<a href="#method">method</a></nav>',
        _overview(a),
        _sessions(a),
        _warnings(a),
        points_section(a),
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
            "Distribution of TTFT (from the intended send time) per load point. Requests that never got a "
            "first token (censored: k in the legend) count in each curve's n but are not drawn, so a curve "
            "stops at 1 − k/n.",
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
        f" · run {esc(m.get('run_id', ''))} · {esc(_when(m.get('started_wall_ns')))}</p>"
        f'<p class="sub" id="request-terms">{esc(request_terms(m))}</p></header>'
    )


def report_banner(a: RunAnalysis) -> list[str]:
    """The lines said before any figure: interrupted, suspect (``banner.banner_lines``)."""
    points = [(p.short_label, p.validity) for p in a.points]
    virtual = virtual_line(a.meta)
    return [
        *([virtual] if virtual else []),
        *banner_lines(a.interruption, a.validity, points, "sweep" if a.is_sweep else "run"),
    ]


def _banner(a: RunAnalysis) -> str:
    lines = report_banner(a)
    if not lines:
        return ""
    return '<div class="loud" id="banner">' + "".join(f"<p>{esc(x)}</p>" for x in lines) + "</div>"


def _card(key: str, value: str, note: str = "", *, strong: bool = True) -> str:
    """A headline card; ``strong``: its value is bold (a figure that is confirmed or exact)."""
    n = f'<div class="n">{note}</div>' if note else ""
    cls = "v" if strong else "v weak"
    return f'<div class="card"><div class="k">{esc(key)}</div><div class="{cls}">{value}</div>{n}</div>'


def _meets(a: RunAnalysis, p: PointFigures) -> bool:
    """The point met the SLO at the target attainment (point estimate) and some request succeeded."""
    att = p.summary.slo_attainment_pct
    return p.summary.ok > 0 and att is not None and att == att and att >= a.target_pct


def _confirmed(a: RunAnalysis, p: PointFigures) -> bool:
    return p.attainment_ci is not None and p.attainment_ci[0] * 100 >= a.target_pct


def _peak_card(a: RunAnalysis) -> list[str]:
    """Peak output tok/s: over the trusted points that meet the SLO (with one), else over those
    where a request succeeded; says so instead of a number when none qualifies."""
    unit = "output tok/s per GPU" if a.gpus else "output tok/s"
    trusted = a.trusted
    if a.slo is not None:
        key = f"peak {unit} at SLO ({a.target_pct:g}% attainment)"
        pool = [p for p in trusted if _meets(a, p)]
        if not pool:
            why = "no trusted load point met the SLO" if trusted else "no trusted load point"
            return [_card(key, "none", esc(f"{why} ({a.slo})"), strong=False)]
    else:
        key = f"peak {unit} (no SLO given)"
        pool = [p for p in trusted if p.summary.ok > 0]
        if not pool:
            return [_card(key, "none", "no trusted load point with a successful request", strong=False)]
    best = max(pool, key=lambda p: p.y if p.y == p.y else -1.0)
    note = f"at {best.short_label}"
    if a.slo is not None:
        sure = "confirmed" if _confirmed(a, best) else "not confirmed"
        note += f", {fmt(best.summary.slo_attainment_pct)}% attainment ({sure})"
    cards = [_card(key, fmt_ci(best.y, best.y_ci), esc(note), strong=a.slo is None or _confirmed(a, best))]
    if a.slo is None:
        cards += [_card(f"$/M output tokens at peak ({name})", esc(fmt(cost))) for name, cost in best.costs.items()]
    return cards


def _capacity_cards(a: RunAnalysis) -> list[str]:
    """Capacity at SLO (bold only when confirmed), and goodput and cost there."""
    c = a.capacity
    if c is None or c.rate is None:
        return [_card("capacity at SLO", "none", esc(c.note if c else "no open-loop point"), strong=False)]
    value = f"{esc(fmt(c.rate))} req/s" + ("" if c.confirmed else " (not confirmed)")
    cards = [
        _card(
            f"capacity at SLO ({a.target_pct:g}% attainment)",
            value,
            esc(f"{bracket_text(c.lower, c.upper)}. {c.note}"),
            strong=c.confirmed,
        )
    ]
    at = a.point_at(c.rate)
    if at is not None:
        s = at.summary
        good = fmt_ci(s.goodput_rps, at.goodput_ci) + f" req/s · {esc(fmt(s.goodput_tps))} output tok/s"
        cards.append(_card("goodput at capacity", good, esc(f"SLO: {a.slo}"), strong=c.confirmed))
        for name, cost in at.costs.items():
            cards.append(_card(f"$/M output tokens at capacity ({name})", esc(fmt(cost)), strong=c.confirmed))
    return cards


def _overview(a: RunAnalysis) -> str:
    cards = _peak_card(a) if a.points else []
    if a.slo is not None:
        cards += _capacity_cards(a)
    if a.saturation or a.is_sweep:
        cards.append(_saturation_card(a))
    front = ", ".join(a.points[i].short_label for i in a.frontier)
    text = (
        f"<p>Pareto frontier (non-dominated points, ★ in the tables): {esc(front) or 'none'}.</p>" if a.is_sweep else ""
    )
    return (
        f'<section id="overview"><h2>Overview</h2>{_choices(a)}<div class="cards">{"".join(cards)}</div>'
        f"{text}</section>"
    )


def _sessions(a: RunAnalysis) -> str:
    """Whole-session figures of a single run whose sessions have several turns."""
    s = a.points[0].sessions if len(a.points) == 1 else None
    if s is None or not s.multi_turn:
        return ""
    lines = "".join(f"<p>{esc(line)}</p>" for line in s.lines())
    return f'<section id="sessions"><h2>Sessions</h2>{lines}</section>'


def saturation_words(a: RunAnalysis) -> tuple[str, str]:
    """(reached | not called | not reached, why): the terminal's and the report's one answer."""
    if a.saturation:
        return "reached", a.saturation
    end = a.search_end or ""
    if end.startswith("saturated"):  # the search stopped on a point the analysis does not trust
        return "not called", f"the search stopped ({end}), on a point loadgen does not trust: see the warnings"
    return "not reached", end or "no point fell behind the offered load"


def _saturation_card(a: RunAnalysis) -> str:
    value, why = saturation_words(a)
    return _card("saturation", value, esc(why), strong=value != "not called")


def _choices(a: RunAnalysis) -> str:
    """What the sweep chose for the user (a default SLO, an example price, capped windows), said once."""
    sw = a.meta.get("sweep") or {}
    notes = []
    if sw.get("slo_is_default"):
        slo = (sw.get("slo") or {}).get("name") or "interactive-chat"
        notes.append(f"SLO: {slo} (the default profile; pass --slo PROFILE)")
    if sw.get("price_is_example"):
        notes.append(
            "costs use an example price per GPU-hour (the label on each cost says which): pass "
            "--price-per-gpu-hour, or re-price with loadgen report RUN --price-per-gpu-hour P"
        )
    capped = [str(p.get("index")) for p in a.meta.get("points") or [] if (p.get("sizing") or {}).get("capped")]
    if capped:
        notes.append(
            f"points {', '.join(capped)} hit a time cap before holding the requests a bounded p99 needs "
            "(--max-point-duration, --max-sweep-duration)"
        )
    return "".join(f'<p class="note">{esc(n)}</p>' for n in notes)


def bracket_text(lower: float, upper: float) -> str:
    """Capacity's confidence bracket in words."""
    lo = f"confirmed to meet it at {fmt(lower)} req/s" if lower > 0 else "no rate confirmed to meet it"
    hi = f"confirmed to miss it at {fmt(upper)} req/s" if math.isfinite(upper) else "no rate confirmed to miss it"
    return f"{lo}; {hi}"


def _warnings(a: RunAnalysis) -> str:
    """The run's caveats, then each point's; those that say how to read TTFT and ITL at all first."""
    said = [("", c) for c in a.caveats] + [(f"{p.short_label}: ", c) for p in a.points for c in p.caveats]
    items = [esc(who + c.message) for who, c in sorted(said, key=lambda wc: wc[1].code not in FIRST_CODES)]
    if not items:
        return (
            '<section id="warnings"><h2>Validity</h2><ul class="warnings none"><li>no validity warnings: '
            "the client kept up, samples suffice, token counts agree</li></ul></section>"
        )
    lis = "".join(f"<li>{w}</li>" for w in items)
    return f'<section id="warnings"><h2>Validity warnings</h2><ul class="warnings">{lis}</ul></section>'


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
    source = a.meta.get("salt_source")
    drawn = {
        "fresh": "a salt drawn fresh for this run",
        "given": "the salt given with --salt (a replay)",
        "off": "no salt (--salt none: warm caches on purpose)",
    }.get(str(source), "the run's own salt, if any")
    if a.point_salt is None:
        salt = f"A single run: prompts carry {drawn}, so no earlier run warmed the server's prefix cache for it."
    elif a.point_salt:
        salt = (
            f"Prompts carry {drawn} and a point-specific part (p0, p1, …), so prefix-cache state cannot "
            "carry from one point into the next, nor from an earlier sweep into this one. The traffic "
            "fingerprints in run.json (without the salt) say whether two runs sent the same requests."
        )
    else:
        salt = (
            "Per-point salting was OFF (--no-point-salt): prompts repeat across load points, so later points "
            "can hit prefix caches warmed by earlier ones."
        )
    slo = (
        (
            f"Goodput counts requests that finished OK inside the window and met every bound of the SLO "
            f"({esc(a.slo)}); token goodput is their output tokens per second; attainment = met / scheduled in "
            "the window, failures, cancelled and never-sent requests count as misses. Capacity at SLO "
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
        "per-user speed = 1000 / TPOT per request (never throughput divided by concurrency); its p10 and p1 "
        "are the slowest users. TTFT to content is the first chunk of visible content (not reasoning).",
        "Percentile intervals are distribution-free 95% order-statistic intervals; a side the samples cannot "
        "bound is shown as unbounded. Censoring, not survivorship: every request scheduled in the window "
        "counts; one that never got its first token (or never finished) counts at its wait as a lower bound, "
        "so a percentile that reaches one is shown ≥ x. "
        "Output tok/s intervals are batch means over 8 sub-windows; goodput intervals are exact Poisson.",
        salt,
        "Cost per million output tokens = price per GPU-hour × GPUs / (output tok/s × 3600) × 10⁶.",
        "Cached prompt % = prompt tokens the endpoint reported serving from its cache / prompt tokens it "
        "reported, over the requests that reported both; TTFT is split into cache hits (at least half the "
        "prompt cached) and misses where both occur.",
    ]
    lis = "".join(f"<li>{esc(i)}</li>" for i in static) + f"<li>{slo}</li>"
    return f'<section id="method"><h2>Method</h2><ul>{lis}</ul></section>'
