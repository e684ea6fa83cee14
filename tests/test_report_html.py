"""report.html: golden structure, escaping of everything the endpoint sent, determinism, and a real
headless browser (Chrome DevTools Protocol over aiohttp) that must render every chart offline."""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console

from loadgen.analysis.metrics import SLO
from loadgen.analysis.points import analyze_run
from loadgen.cli import report_cmd
from loadgen.client.settings import RunSettings, settings_json
from loadgen.records import Record, to_batch
from loadgen.report.charts import Series, pareto_chart
from loadgen.report.detail_charts import errors_chart, timeseries_chart
from loadgen.report.html import CHART_IDS, render_html, write_report
from loadgen.report.html_charts import cdf_figure, latency_figure, server_figure, timeseries_figure
from loadgen.report.sweep_view import render_sweep

EVIL = "<script>window.__pwned=1;document.title='pwned'</script>"
SECTIONS = ("overview", "warnings", "points", "charts", "error-detail", "config", "method")


def fake_point(k: int, rate: float, n: int, t0: int, run_id: str, evil: bool, tokens: bool = False) -> list[Record]:
    """n requests at ``rate``: TTFT and TPOT grow with the point index, every 10th fails with a hostile error;
    with ``tokens``, a reasoning model behind a prefix cache (2 reasoning chunks first, every other prompt cached)."""
    out = []
    for i in range(n):
        ts = t0 + int(i / rate * 1e9)
        if evil and i % 10 == 9:
            out.append(
                Record(
                    run_id=run_id,
                    point=k,
                    request=i,
                    session=i,
                    model=EVIL,
                    t_sched=ts,
                    t_sent=ts + 100_000,
                    t_done=ts + 5_000_000,
                    status="http_error",
                    http_status=500,
                    error=f"boom {EVIL}",
                    output_tokens_requested=16,
                )
            )
            continue
        ttft = int((20 + 15 * k + (i % 7)) * 1e6)
        gap = int((5 + 3 * k + (i % 3)) * 1e6)
        chunks = [ts + ttft + j * gap for j in range(16)]
        out.append(
            Record(
                run_id=run_id,
                point=k,
                request=i,
                session=i,
                model=EVIL,
                t_sched=ts,
                t_sent=ts + 100_000,
                t_headers=ts + 1_000_000,
                t_first=chunks[0],
                t_last=chunks[-1],
                t_done=chunks[-1] + 100_000,
                chunk_ns=chunks,
                chunk_tokens=[1] * 16,
                prompt_tokens_requested=64,
                prompt_tokens_reported=64,
                output_tokens_requested=16,
                output_tokens_reported=16,
                output_tokens=16,
                output_tokens_source="usage",
                finish_reason="length",
                status="ok",
                output_text=EVIL if evil else None,
                t_first_content=chunks[2] if tokens else None,
                reasoning_tokens=2 if tokens else None,
                cached_tokens=(48 if i % 2 else 0) if tokens else None,
            )
        )
    return out


def make_run(
    folder: Path,
    rates: tuple[float, ...] = (2.0, 4.0, 8.0),
    n: int = 60,
    *,
    evil: bool = True,
    sweep: bool = True,
    gpus: float | None = 2.0,
    slo: dict[str, Any] | None = None,
    tokens: bool = False,
    extra: tuple[Record, ...] = (),
    meta_extra: dict[str, Any] | None = None,
) -> Path:
    """A run folder with made-up records: a sweep (points) or a single run (``extra``: more records;
    ``meta_extra``: run.json keys to add or replace)."""
    folder.mkdir(parents=True)
    run_id = "20250101-000000-abcdef"
    records, t0, points = [], 1_000_000_000_000, []
    for k, rate in enumerate(rates if sweep else rates[:1]):
        records += fake_point(k if sweep else 0, rate, n, t0, run_id, evil, tokens)
        label = f"poisson @ {rate:g} req/s"
        points.append(
            {
                "index": k,
                "arrival": {"kind": "poisson", "rate": rate, "cv": None, "concurrency": None, "label": label},
                "phase": "list",
                "why": "given",
                "duration_s": n / rate,
                "warmup_s": 0.0,
                "cooldown_s": 0.0,
                "salt": f"p{k}",
                "client": {"cpu_utilisation": 0.1, "loop_lag_max_ms": 1.0},
            }
        )
        t0 += int((n / rate + 5) * 1e9)
    records += extra
    pq.write_table(pa.Table.from_batches([to_batch(records)]), folder / "records.parquet")
    # what the server said meanwhile, one scrape a second (as server_metrics.py writes it)
    start = 1_000_000_000_000
    scrapes = [
        {
            "t_ns": start + i * 1_000_000_000,
            "running": float(i % 7),
            "waiting": float(i % 3),
            "kv_cache_usage": (i % 10) / 10,
        }
        for i in range((t0 - start) // 1_000_000_000)
    ]
    (folder / "server_metrics.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in scrapes) + b"\n")
    settings = settings_json(RunSettings(endpoint="http://vendor.example/v1", model=EVIL))
    meta: dict[str, Any] = {
        "run_id": run_id,
        "tool": {"name": "loadgen", "version": "test"},
        "command": ["sweep", EVIL],
        "endpoint": "http://vendor.example/v1",
        "simulator": None,
        "model": EVIL,
        "settings": settings,
        "workload": {"name": "synthetic-chat", "input_tokens": 64, "output_tokens": 16, "seed": 0, "salt": ""},
        "host": {"python": "3"},
        "started_wall_ns": 1_700_000_000_000_000_000,
    }
    if sweep:
        meta["sweep"] = {
            "mode": "rates",
            "slo": slo or {"name": "t", "ttft_ms": 60.0, "tpot_ms": 12.0, "e2e_ms": None, "target_pct": 85.0},
            "gpus": gpus,
            "prices": {"spot": 2.0},
            "point_salt": True,
            "salt": "",
        }
        meta["points"] = points
    else:
        meta["client"] = points[0]["client"]
    meta.update(meta_extra or {})
    (folder / "run.json").write_bytes(orjson.dumps(meta))
    return folder


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = make_run(tmp_path_factory.mktemp("report") / "sweep", tokens=True)
    render_sweep(run)
    return run


# --------------------------------------------------------------------------- golden structure


def test_sweep_report_structure(sweep_dir: Path) -> None:
    html = (sweep_dir / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>")
    for sid in SECTIONS:
        assert f'id="{sid}"' in html, sid
    for cid in CHART_IDS:
        m = re.search(rf'<figure class="chart" id="{cid}">(.*?)</figure>', html, re.S)
        assert m and "<svg" in m.group(1), cid
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    # offline: nothing to fetch (the SVG namespace URIs are identifiers, not fetches)
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "@import" not in html and not re.search(r"url\((?!#)", html)  # url(#clip) is in-document
    for name in ("pareto.svg", "pareto.png", "summary.json"):
        assert (sweep_dir / name).stat().st_size > 1000
    assert (sweep_dir / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = orjson.loads((sweep_dir / "summary.json").read_bytes())
    assert [p["index"] for p in summary["points"]] == [0, 1, 2] and summary["schema_version"] == "2"
    assert summary["frontier"] and summary["capacity_at_slo"]["rate"] is not None
    assert "a point-specific part (p0, p1, …)" in html  # per-point cache independence is stated
    import pyarrow.parquet as pq

    # each point's window is in the records themselves, for a one-line query (docs/metrics.md)
    assert {"in_window", "ttft_ms", "ttft_censored"} <= set(pq.read_schema(sweep_dir / "records.parquet").names)


def test_everything_the_endpoint_sent_is_escaped(sweep_dir: Path) -> None:
    html = (sweep_dir / "report.html").read_text()
    assert "<script" not in html.lower()
    assert "&lt;script&gt;window.__pwned=1" in html  # the model name and the error text, shown as text
    assert "boom &lt;script&gt;" in html


def test_report_is_deterministic(sweep_dir: Path) -> None:
    a = analyze_run(sweep_dir)
    assert render_html(a) == render_html(analyze_run(sweep_dir))


def test_single_run_report(tmp_path: Path) -> None:
    run = make_run(tmp_path / "single", sweep=False, evil=False)
    path = write_report(run)
    html = path.read_text()
    for cid in CHART_IDS:
        assert f'id="{cid}"' in html
    assert "single run" in html and (run / "pareto.svg").exists()
    assert "No request failed." in html


def test_figures_match_the_records(sweep_dir: Path) -> None:
    a = analyze_run(sweep_dir)
    assert [p.rate for p in a.points] == [2.0, 4.0, 8.0]
    # TPOT grows with the point index (5, 8, 11 ms + jitter): per-user speed falls, throughput rises
    xs = [p.x for p in a.points]
    assert xs == sorted(xs, reverse=True)
    assert a.frontier == [2, 1, 0]
    p = a.points[0]
    assert p.summary.failed == 6 and p.summary.ok == 54
    assert p.costs["spot"] == pytest.approx(2.0 * 2 / (p.summary.output_tps * 3600) * 1e6)
    assert p.y == pytest.approx(p.summary.output_tps / 2)
    # SLO: TTFT <= 60 ms, TPOT <= 12 ms; point 2 has TTFT ~50-56 ms and TPOT ~11-13 ms -> some misses
    assert a.points[0].summary.slo_attainment_pct == pytest.approx(90.0)  # only the failures miss


# --------------------------------------------------------------------------- a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
if CHROMIUM is None and Path("/usr/bin/chromium").exists():
    CHROMIUM = "/usr/bin/chromium"


class DevTools:
    """The smallest CDP client: one websocket, flat sessions, events collected as they come."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = orjson.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        self.next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        await self.ws.send_str(orjson.dumps(msg).decode())  # DevTools reads text frames only
        data = await asyncio.wait_for(fut, 30)
        assert "error" not in data, data
        return data["result"]

    async def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for e in self.events:
                if e.get("method") == method:
                    return e
            await asyncio.sleep(0.05)
        raise TimeoutError(method)


async def browse(chromium: str, page: Path, shot: Path) -> dict[str, Any]:
    user_data = tempfile.mkdtemp(prefix="loadgen-chromium-")
    proc = subprocess.Popen(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            f"--user-data-dir={user_data}",
            "--remote-debugging-port=0",
            "--window-size=1280,1800",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = Path(user_data) / "DevToolsActivePort"
        end = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            assert proc.poll() is None, "chromium exited before listening"
            assert time.monotonic() < end, "chromium did not open its DevTools port"
            await asyncio.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0) as ws,
        ):
            cdp = DevTools(ws)
            target = (await cdp.call("Target.createTarget", {"url": "about:blank"}))["targetId"]
            session = (await cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                await cdp.call(f"{domain}.enable", session=session)
            url = page.resolve().as_uri()
            await cdp.call("Page.navigate", {"url": url}, session=session)
            await cdp.wait_event("Page.loadEventFired")
            js = """JSON.stringify({
                charts: [...document.querySelectorAll('figure.chart')].map(f => ({
                    id: f.id, svgs: f.querySelectorAll('svg').length,
                    width: f.querySelector('svg') ? f.querySelector('svg').getBoundingClientRect().width : 0,
                    marks: f.querySelectorAll('svg path, svg use, svg text').length})),
                title: document.title, pwned: typeof window.__pwned !== 'undefined',
                scripts: document.scripts.length, literal: document.body.innerText.includes("<script>"),
                sections: [...document.querySelectorAll('section[id]')].map(s => s.id),
                page_width: document.documentElement.scrollWidth,
                viewport: window.innerWidth,
                tables: [...document.querySelectorAll('table')].map(t => ({
                    id: t.id, width: t.scrollWidth, room: t.parentElement.clientWidth,
                    cols: t.querySelectorAll('thead th').length}))})"""
            res = await cdp.call("Runtime.evaluate", {"expression": js, "returnByValue": True}, session=session)
            dom = orjson.loads(res["result"]["value"])
            png = await cdp.call(
                "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session
            )
            shot.write_bytes(base64.b64decode(png["data"]))
            await asyncio.sleep(0.2)  # late console messages
            events = [e for e in cdp.events if e.get("sessionId") == session]
            await cdp.call("Browser.close")
            cdp.reader.cancel()
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(user_data, ignore_errors=True)
    errors = [
        e
        for e in events
        if e["method"] == "Runtime.exceptionThrown"
        or (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    requests = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    return {"dom": dom, "errors": errors, "requests": requests, "url": url}


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="chromium is not installed (CI installs it)")
def test_report_in_a_headless_browser(sweep_dir: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None, "CI must have chromium: the report is tested in a real browser"
    shot = tmp_path / "report.png"
    got = asyncio.run(browse(CHROMIUM, sweep_dir / "report.html", shot))
    assert got["errors"] == [], got["errors"]
    assert got["requests"] == [got["url"]], f"only the report itself may be loaded: {got['requests']}"
    dom = got["dom"]
    assert [c["id"] for c in dom["charts"]] == list(CHART_IDS)
    for c in dom["charts"]:
        assert c["svgs"] >= 1 and c["width"] > 100 and c["marks"] > 5, c
    assert not dom["pwned"] and dom["scripts"] == 0
    assert dom["title"].startswith("loadgen sweep")
    assert dom["literal"], "the hostile text is shown as text"
    assert set(SECTIONS) <= set(dom["sections"])
    # the points tables fit a 1280-px window, the widest variant (GPUs, prices, SLO, cached and
    # reasoning columns) included: nothing scrolls sideways, neither the page nor a table in it
    assert dom["viewport"] == 1280 and dom["page_width"] <= 1280, dom["page_width"]
    points = [t for t in dom["tables"] if t["id"].startswith("points-")]
    ids = ["points-throughput", "points-outcomes", "points-latency", "points-users", "points-client"]
    assert [t["id"] for t in points] == ids
    assert max(t["cols"] for t in points) >= 11
    for t in dom["tables"]:
        assert t["width"] <= t["room"], t
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


# --------------------------------------------------------------------------- honest figures


def cancelled_waiting(k: int, t0: int, n: int, wait_ms: float, run_id: str = "20250101-000000-abcdef") -> list[Record]:
    """n requests of point k cut at the end of the point after ``wait_ms`` without a first token."""
    return [
        Record(
            run_id=run_id,
            point=k,
            request=10_000 + i,
            session=10_000 + i,
            t_sched=t0 + i * 1_000_000,
            t_sent=t0 + i * 1_000_000 + 100_000,
            t_done=t0 + i * 1_000_000 + int(wait_ms * 1e6),
            status="cancelled",
            output_tokens_requested=16,
        )
        for i in range(n)
    ]


def _section(html: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', html, re.S)
    assert m, sid
    return m.group(1)


def _cards(html: str) -> dict[str, tuple[str, str]]:
    """Each headline card: its key -> (value's class, value's text)."""
    got = re.findall(r'<div class="k">(.*?)</div><div class="(v[^"]*)">(.*?)</div>', _section(html, "overview"))
    return {k: (cls, re.sub(r"<[^>]+>", "", v)) for k, cls, v in got}


def test_censored_requests_show_as_lower_bounds(tmp_path: Path) -> None:
    """20 requests of the single point waited 1.5 s for a first token and were cut: TTFT p99 is
    at least 1.5 s, its upper end unbounded; the CDF says they are not drawn; no "inf" in JSON."""
    run = make_run(
        tmp_path / "s", rates=(4.0,), evil=False, extra=tuple(cancelled_waiting(0, 1_000_000_000_000, 20, 1500.0))
    )
    render_sweep(run)
    html = (run / "report.html").read_text()
    latency = re.search(r'<table class="points" id="points-latency">.*?</table>', html, re.S)
    assert latency
    assert "≥ 1,500" in latency.group(0) and "(20 censored)" in latency.group(0) and "unbounded" in latency.group(0)
    assert "≥ x: a lower bound; requests never answered count at their wait" in html
    assert "20 censored)" in _section(html, "charts")  # the TTFT CDF's legend: counted, not drawn
    text = (run / "summary.json").read_text()
    assert '"inf"' not in text and "Infinity" not in text
    doc = orjson.loads(text)
    p99 = doc["points"][0]["summary"]["ttft"]["percentiles"]["p99"]
    assert (p99["lower_bound"], p99["hi"], p99["hi_unbounded"]) == (True, None, True)
    cap = doc["capacity_at_slo"]
    assert (cap["upper"], cap["upper_unbounded"]) == (4.0, False)  # the point missed the SLO: a confirmed miss
    assert doc["points"][0]["output_tps_ci"]["lo_unbounded"] is False


def test_headline_cards_come_from_points_that_meet_the_slo(sweep_dir: Path) -> None:
    """8 req/s has the most output tok/s but only 60% attainment (target 85%): the peak card is
    4 req/s's, and capacity (4 req/s, not confirmed at 60 requests a point) is not bold."""
    html = (sweep_dir / "report.html").read_text()
    cards = _cards(html)
    peak = cards["peak output tok/s per GPU at SLO (85% attainment)"]
    a = analyze_run(sweep_dir)
    assert peak[1].startswith(f"{a.points[1].y:.3g}") and a.points[2].y > a.points[1].y
    assert "at 4 req/s, 90% attainment (not confirmed)" in _section(html, "overview")
    cls, value = cards["capacity at SLO (85% attainment)"]
    assert (cls, value) == ("v weak", "4 req/s (not confirmed)")
    # an SLO no point meets: no number, and no card from a point with 0% attainment
    strict = render_html(analyze_run(sweep_dir, slo=SLO(ttft_ms=1.0)))
    assert _cards(strict)["peak output tok/s per GPU at SLO (85% attainment)"] == ("v weak", "none")


def test_a_confirmed_capacity_is_bold(tmp_path: Path) -> None:
    run = make_run(tmp_path / "s", rates=(2.0, 4.0), n=400, evil=False)
    render_sweep(run)
    html = (run / "report.html").read_text()
    cls, value = _cards(html)["capacity at SLO (85% attainment)"]
    assert (cls, value) == ("v", "4 req/s")
    assert _cards(html)["peak output tok/s per GPU at SLO (85% attainment)"][0] == "v"
    cap = orjson.loads((run / "summary.json").read_bytes())["capacity_at_slo"]
    assert (cap["upper"], cap["upper_unbounded"], cap["confirmed"]) == (None, True, True)  # no miss seen: null + flag


def test_slow_users_token_goodput_reasoning_and_cache_are_shown(sweep_dir: Path) -> None:
    html = (sweep_dir / "report.html").read_text()
    users = _section(html, "points")
    for head in ("p10 (slow)", "p1 (slowest)", "goodput output tok/s", "TTFT to content p50 ms"):
        assert f"<th>{head}</th>" in users, head
    assert "cached prompt %" in users and "reasoning tokens" in users and "per-user p90" not in users
    doc = orjson.loads((sweep_dir / "summary.json").read_bytes())
    p = doc["points"][0]
    assert p["per_user_tps_p10"] < p["per_user_tps_p50"] and "per_user_tps_p90" not in p
    s = p["summary"]
    # the 54 ok requests report 64 prompt tokens each; the 24 odd ones of them had 48 cached
    assert s["cached_prompt_fraction"] == pytest.approx(24 * 48 / (54 * 64))
    assert s["ttft_ms_cached"]["n"] == 24 and s["ttft_ms_uncached"]["n"] == 30
    assert s["reasoning_tokens"] == 2 * 54 and s["goodput_tps"] > 0
    assert s["ttft_content"]["percentiles"]["p50"]["value"] > s["ttft"]["percentiles"]["p50"]["value"]


def test_reasoning_and_cache_columns_only_where_reported(tmp_path: Path) -> None:
    points = _section(write_report(make_run(tmp_path / "single", sweep=False, evil=False)).read_text(), "points")
    assert "TTFT to content" not in points and "cached prompt %" not in points and "reasoning tokens" not in points
    assert "<th>p10 (slow)</th>" in points


def test_an_interrupted_sweep_says_so_first(tmp_path: Path) -> None:
    run = make_run(tmp_path / "s", meta_extra={"state": "interrupted", "interrupted_reason": "SIGINT"})
    meta = orjson.loads((run / "run.json").read_bytes())
    meta["points"][2].update(state="interrupted", interrupted_reason="SIGINT")
    (run / "run.json").write_bytes(orjson.dumps(meta))
    buf = io.StringIO()
    render_sweep(run).print(Console(file=buf, width=200))
    first = buf.getvalue().splitlines()[0]
    assert first.startswith("INTERRUPTED: this sweep was interrupted (SIGINT); point 2"), first
    html = (run / "report.html").read_text()
    banner = re.search(r'<div class="loud" id="banner">(.*?)</div>', html, re.S)
    assert banner and "INTERRUPTED: this sweep was interrupted" in banner.group(1)
    assert html.index('id="banner"') < html.index("<nav>") < html.index('id="overview"')
    assert orjson.loads((run / "summary.json").read_bytes())["interruption"].startswith("INTERRUPTED")


def test_loadgen_report_on_an_interrupted_or_suspect_run_says_so_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(warmup=None, cooldown=None, lag_limit_ms=None)
    cut = make_run(
        tmp_path / "cut", sweep=False, evil=False, meta_extra={"state": "interrupted", "interrupted_reason": "SIGTERM"}
    )
    assert report_cmd.main(argparse.Namespace(run_dir=str(cut), **vars(args))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("INTERRUPTED: this run was interrupted (SIGTERM)"), lines[:3]
    assert "INTERRUPTED" in (cut / "report.html").read_text().split("<nav>")[0]
    late = {"simulator": {"late_steps": 146, "steps": 853, "max_lateness_ms": 23.1}}
    sus = make_run(tmp_path / "sus", sweep=False, evil=False, meta_extra=late)
    report_cmd.main(argparse.Namespace(run_dir=str(sus), **vars(args)))
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("SUSPECT (sim_late"), first
    assert 'id="banner"' in (sus / "report.html").read_text()


# --------------------------------------------------------------------------- charts: labels and legends


def _overlaps(fig: Figure, texts: list[Any]) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts whose drawn boxes overlap (drawn with Agg)."""
    canvas = FigureCanvasAgg(fig)
    r = canvas.get_renderer()
    fig.draw(r)
    shown = [t for t in texts if t.get_visible() and t.get_text()]
    boxes = [t.get_window_extent(r) for t in shown]
    return [
        (shown[i].get_text(), shown[j].get_text())
        for i in range(len(shown))
        for j in range(i + 1, len(shown))
        if boxes[i].overlaps(boxes[j])
    ]


def test_pareto_point_labels_do_not_overlap() -> None:
    """30 points crowded at high load (the usual shape of a sweep past its knee)."""
    xs = [100.0 - i for i in range(10)] + [40.0 - 0.2 * i for i in range(20)]
    ys = [10.0 * i for i in range(10)] + [300.0 + i for i in range(20)]
    s = Series("run", xs, ys, list(range(30)), [f"{i * 2}" for i in range(30)])
    fig = pareto_chart([s], y_label="output tok/s")
    texts = fig.axes[0].texts
    assert 5 <= len(texts) < 30  # the crowded labels left out, the spread-out ones kept
    assert _overlaps(fig, list(texts)) == []


def test_error_chart_ticks_and_timeseries_marks_do_not_overlap() -> None:
    labels = [f"{r} req/s" for r in range(1, 61)]
    fig = errors_chart(labels, [{"ok": 5, "timeout": i % 4} for i in range(60)])
    ticks = fig.axes[0].get_xticklabels()
    assert 5 < sum(1 for t in ticks if t.get_text()) < 60
    assert _overlaps(fig, list(ticks)) == []
    rows = [{"t_s": float(t), "output_tps": 1.0, "in_flight": 1.0, "errors": 0, "completed": 1} for t in range(120)]
    fig = timeseries_chart(rows, marks=[(2.0 * i, f"#{i}") for i in range(60)])
    assert _overlaps(fig, list(fig.axes[0].texts)) == []


def test_legends_carry_units(sweep_dir: Path) -> None:
    a = analyze_run(sweep_dir)
    for fig in (latency_figure(a), timeseries_figure(a), server_figure(a), cdf_figure(a, "ttft")):
        for ax in fig.axes:
            legend = ax.get_legend()
            for t in legend.get_texts() if legend else []:
                text = t.get_text()
                assert re.search(r"\((ms|tok/s|requests|%)\)|req/s|ms\b|lower bound", text), text
