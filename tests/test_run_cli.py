"""`loadgen run` as a user runs it: a process, a run folder, signals, secrets, bad flags."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from aiohttp import web

from loadgen.errors import LoadgenError
from loadgen.records import read_records, read_stream
from loadgen.sim.process import start_sim


def loadgen(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "loadgen", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for_records(path: Path, min_records: int, timeout: float = 40.0) -> None:
    """Wait until a running loadgen has flushed ``min_records`` records that were sent (start-up
    and the preflight take a varying time on a busy box; the file's size says nothing, its schema
    alone is kilobytes)."""
    from loadgen.records import read_stream

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                statuses = read_stream(path).column("status").to_pylist()
            except LoadgenError:  # no whole batch yet
                statuses = []
            if sum(st != "not_sent" for st in statuses) >= min_records:
                return
        time.sleep(0.1)
    raise AssertionError(f"{path} did not hold {min_records} sent requests' records in {timeout} s")


def test_a_run_writes_a_complete_run_folder(fixed_sim, tmp_path):
    out = tmp_path / "run"
    r = loadgen(
        "run",
        "--endpoint",
        fixed_sim.url,
        "--rate",
        "20",
        "--requests",
        "12",
        "--input-tokens",
        "32",
        "--output-tokens",
        "8",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert {"records.parquet", "run.json", "summary.json"} <= {p.name for p in out.iterdir()}
    assert not list(out.glob("*.arrows"))  # compacted
    table = read_records(out)
    assert table.num_rows == 12
    meta = json.loads((out / "run.json").read_text())
    assert meta["model"] == "sim" and meta["settings"]["arrival"]["kind"] == "poisson"
    assert meta["client"]["records"] == 12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["ok"] == 12
    assert "TTFT" in r.stdout
    assert meta["state"] == "complete" and meta.get("interrupted_reason") is None
    refused = loadgen("run", "--endpoint", fixed_sim.url, "--rate", "20", "--requests", "2", "--out", str(out))
    assert refused.returncode == 2 and "--force" in refused.stderr and refused.stderr.count("\n") == 1
    assert read_records(out).num_rows == 12  # the run that was there is untouched
    again = loadgen("report", str(out))  # re-rendered from the records alone
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "summary.json").read_text())["summary"] == summary["summary"]


def test_killing_the_process_keeps_every_finished_request(tmp_path):
    truth = tmp_path / "truth.jsonl"
    out = tmp_path / "run"
    with start_sim(["--ttft-ms", "20", "--itl-ms", "5", "--truth", str(truth)]) as sim:
        proc = spawn(
            "run",
            "--endpoint",
            sim.url,
            "--rate",
            "40",
            "--duration",
            "30",
            "--input-tokens",
            "16",
            "--output-tokens",
            "10",
            "--out",
            str(out),
            "--no-live",
        )
        wait_for_records(out / "records.arrows", min_records=40)
        killed_at = time.perf_counter_ns()
        proc.kill()
        proc.communicate(timeout=10)
    table = read_stream(out / "records.arrows").to_pydict()
    assert len(table["request"]) >= 10
    assert set(table["status"]) == {"ok"}
    have = {f"{run}-{req}" for run, req in zip(table["run_id"], table["request"], strict=False)}
    # every answer the server finished well before the kill (one flush interval and a margin) is on disk;
    # of the run's requests, that is: the per-chunk usage probe before them (rid sim-N) is none of them
    settled = killed_at - 600_000_000
    mine = f"{table['run_id'][0]}-"
    finished = [
        t["rid"]
        for t in map(orjson.loads, truth.read_bytes().splitlines())
        if t["emit_ns"] and t["emit_ns"][-1] < settled and t["rid"].startswith(mine)
    ]
    assert finished and set(finished) <= have


def test_ctrl_c_stops_sending_and_writes_everything(tmp_path):
    out = tmp_path / "run"
    with start_sim(["--ttft-ms", "10", "--itl-ms", "300"]) as sim:
        proc = spawn(
            "run",
            "--endpoint",
            sim.url,
            "--rate",
            "10",
            "--duration",
            "60",
            "--input-tokens",
            "8",
            "--output-tokens",
            "4",
            "--drain",
            "0.5",
            "--out",
            str(out),
            "--no-live",
        )
        wait_for_records(out / "records.arrows", min_records=3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout
    statuses = pq.read_table(out / "records.parquet").column("status").to_pylist()
    assert "ok" in statuses and "cancelled" in statuses
    sent = [st for st in statuses if st != "not_sent"]
    assert len(sent) < 60 < len(statuses)  # sending stopped at the signal; the rest are recorded as never sent
    meta = json.loads((out / "run.json").read_text())
    assert meta["client"]["interrupted"] is True
    assert (meta["state"], meta["interrupted_reason"]) == ("interrupted", "SIGINT")


def _echo_auth_server(port_holder: list[int], stop: asyncio.Event) -> None:
    async def reject(request: web.Request) -> web.Response:
        # a careless server that echoes the key back in its error
        return web.json_response({"error": {"message": f"bad key {request.headers.get('Authorization')}"}}, status=401)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", reject)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_holder.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await runner.cleanup()

    asyncio.run(main())


@pytest.mark.parametrize("where", ["OPENAI_API_KEY", "MY_VENDOR_KEY"])
def test_the_api_key_reaches_no_file_of_the_run_folder(tmp_path, where):
    import threading

    secret = "sk-test-9f8e7d6c5b4a39281706"
    port: list[int] = []
    stop = asyncio.Event()
    t = threading.Thread(target=_echo_auth_server, args=(port, stop), daemon=True)
    t.start()
    while not port:
        time.sleep(0.01)
    out = tmp_path / "run"
    flags = ["--api-key-env", where] if where != "OPENAI_API_KEY" else []
    r = loadgen(
        "run",
        "--endpoint",
        f"http://127.0.0.1:{port[0]}/v1",
        "--model",
        "m",
        "--no-preflight",  # every answer is a 401: the preflight would stop the run before it sent any
        "--rate",
        "20",
        "--requests",
        "5",
        "--out",
        str(out),
        *flags,
        env={where: secret},
    )
    stop.set()
    t.join(5)
    assert r.returncode == 4, r.stderr  # every request failed
    assert r.stderr.splitlines()[-1].startswith('loadgen: every request failed: 5 x http_error "HTTP 401: ')
    errors = read_records(out).column("error").to_pylist()
    assert all("[REDACTED]" in e for e in errors)  # the echo arrived and was scrubbed
    for path in out.rglob("*"):
        assert secret.encode() not in path.read_bytes(), path
    assert secret not in r.stdout + r.stderr


def test_an_endpoint_that_does_not_answer_is_one_line(tmp_path):
    """Bad flags are tests/test_bad_input.py's table; this one can only be found by trying."""
    r = loadgen("run", "--rate", "5", "--duration", "5", "--endpoint", "http://127.0.0.1:9/v1", "--out", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.startswith("loadgen: error: cannot reach http://127.0.0.1:9/v1")
    assert r.stderr.count("\n") == 1  # one line, not a traceback
    assert not (tmp_path / "records.parquet").exists()


def test_run_json_says_what_was_sent(fixed_sim, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text('{"run_id": "an old run"}')  # replaced, because of --force
    (out / "notes.txt").write_text("mine")
    host = fixed_sim.url.split("//")[1]
    endpoint = f"http://me:pw-in-url-5e3c@{host}"
    r = loadgen(
        "run",
        "--force",
        "--endpoint",
        endpoint,
        "--concurrency",
        "3",
        "--requests",
        "9",
        "--output-tokens",
        "4",
        "--input-tokens",
        "16",
        "--seed",
        "7",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    text = (out / "run.json").read_text()
    meta = json.loads(text)
    assert meta["run_id"] != "an old run" and (out / "notes.txt").read_text() == "mine"
    for secret in ("pw-in-url-5e3c", "me:"):
        assert secret not in text and secret not in r.stdout + r.stderr
    assert meta["endpoint"] == meta["settings"]["endpoint"] == fixed_sim.url
    assert meta["state"] == "complete" and meta["pid"] > 0 and meta["command"][0] == "run"
    assert meta["settings"]["arrival"]["label"] == "closed loop, concurrency 3"
    assert meta["settings"]["seed"] == 7
    assert meta["tool"]["name"] == "loadgen"
    assert meta["client"]["clock_anchor"]["wall_ns"] > 0
    assert meta["client"]["event_loop"] in ("uvloop", "asyncio")
    assert read_records(out).num_rows == 9
