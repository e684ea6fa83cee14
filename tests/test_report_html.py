"""report.html: golden structure, escaping of everything the endpoint sent, determinism, and a real
headless browser (Chrome DevTools Protocol over aiohttp) that must render every chart offline."""

from __future__ import annotations

import asyncio
import base64
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

from loadgen.analysis.points import analyze_run
from loadgen.client.settings import RunSettings, settings_json
from loadgen.records import Record, to_batch
from loadgen.report.html import CHART_IDS, render_html, write_report
from loadgen.report.sweep_view import render_sweep

EVIL = "<script>window.__pwned=1;document.title='pwned'</script>"
SECTIONS = ("overview", "warnings", "points", "charts", "error-detail", "config", "method")


def fake_point(k: int, rate: float, n: int, t0: int, run_id: str, evil: bool) -> list[Record]:
    """n requests at ``rate``: TTFT and TPOT grow with the point index, every 10th fails with a hostile error."""
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
) -> Path:
    """A run folder with made-up records: a sweep (points) or a single run."""
    folder.mkdir(parents=True)
    run_id = "20250101-000000-abcdef"
    records, t0, points = [], 1_000_000_000_000, []
    for k, rate in enumerate(rates if sweep else rates[:1]):
        records += fake_point(k if sweep else 0, rate, n, t0, run_id, evil)
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
    (folder / "run.json").write_bytes(orjson.dumps(meta))
    return folder


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = make_run(tmp_path_factory.mktemp("report") / "sweep")
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
    assert [p["index"] for p in summary["points"]] == [0, 1, 2]
    assert summary["frontier"] and summary["capacity_at_slo"]["rate"] is not None
    assert "point-specific salt" in html  # per-point cache independence is stated


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
                sections: [...document.querySelectorAll('section[id]')].map(s => s.id)})"""
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
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
