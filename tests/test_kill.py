"""Killing loadgen: whatever ends the parent, no worker or simulator goes on, and nothing served is lost.

Real processes over loopback. A run with ``--workers 2`` is sent to a small streaming
server in this process that logs every request it served (arrival and end, on the
system-wide monotonic clock, which the workers share), and its parent is sent SIGKILL,
SIGTERM or SIGINT (to its PID alone). A run against the built-in simulator gets the same
three signals (the simulator counting what it finished on its /metrics), and is Ctrl-C'd
through its whole process group, as a terminal does, once and twice.

The runs of one test (its three signals, its two Ctrl-Cs) go side by side, each with its own
server, folder and processes: each spends most of its seconds waiting (start-up, the server's
answers, the drain), so together they take about the time of the slowest instead of the sum.

After SIGKILL: no request arrives (or is sent) more than 1 s after the kill, no process of
the run remains, and every request the server finished before the last flush interval is on
disk. After SIGINT/SIGTERM: exit 130/143, run.json says interrupted, and every request
the server served is in the records.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pyarrow as pa
import pytest
from aiohttp import web

from loadgen.records import read_records, read_stream

pytestmark = pytest.mark.timing

KILL_WINDOW_NS = 1_000_000_000  # nothing may be sent later than this after the kill
FLUSH_MARGIN_NS = 600_000_000  # the engine's flush interval (0.2 s) and a margin for a busy box


# -- a server that logs what it served ------------------------------------------------------
@dataclass
class Served:
    seq: int
    t_ns: int  # perf_counter_ns at arrival (CLOCK_MONOTONIC: the same clock as every process's)
    end_ns: int | None = None
    complete: bool = False


class LoggingServer:
    """Streams ``tokens`` chunks ``gap_s`` apart to every chat request, and logs each one."""

    def __init__(self, tokens: int = 5, gap_s: float = 0.05) -> None:
        self.tokens, self.gap_s = tokens, gap_s
        self.log: list[Served] = []
        self.url = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        entry = Served(int(request.headers.get("X-Loadgen-Seq", "-1")), time.perf_counter_ns())
        if "X-Loadgen-Probe" not in request.headers:  # the per-chunk usage probe is not a scheduled request
            self.log.append(entry)
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await resp.prepare(request)
            for i in range(self.tokens):
                chunk = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                await asyncio.sleep(self.gap_s)
            done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": self.tokens}}
            for event in (done, usage):
                await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            entry.complete = True  # the whole answer is written (the client may close before the EOF)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            entry.end_ns = time.perf_counter_ns()
        return resp

    def settled(self, t_ns: int) -> set[int]:
        """The requests answered whole before the last flush interval before ``t_ns``, once both
        workers (odd and even sequence numbers) have had some."""
        done = {s.seq for s in self.log if s.complete and s.end_ns and s.end_ns < t_ns - FLUSH_MARGIN_NS}
        return done if len({seq % 2 for seq in done}) == 2 else set()

    def after(self, t_ns: int) -> list[Served]:
        return [s for s in self.log if s.t_ns > t_ns]


class _Serving:
    """A LoggingServer on 127.0.0.1 in a daemon thread with its own event loop."""

    def __init__(self, srv: LoggingServer) -> None:
        self.srv = srv
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.done: asyncio.Event | None = None

    async def main(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.srv.chat)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.srv.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        self.loop, self.done = asyncio.get_running_loop(), asyncio.Event()
        self.ready.set()
        await self.done.wait()
        await runner.cleanup()

    def stop(self) -> None:
        if self.loop is not None and self.done is not None:
            self.loop.call_soon_threadsafe(self.done.set)


@contextmanager
def logging_server() -> Iterator[LoggingServer]:
    serving = _Serving(LoggingServer())
    t = threading.Thread(target=asyncio.run, args=(serving.main(),), daemon=True)
    t.start()
    assert serving.ready.wait(10)
    try:
        yield serving.srv
    finally:
        serving.stop()
        t.join(5)


Case = TypeVar("Case")


def side_by_side(
    check: Callable[[Case, Path], None], cases: Sequence[Case], root: Path
) -> dict[Case, BaseException | None]:
    """``check(case, folder)`` for every case at once, each in a thread and a folder of its own;
    what each raised (None when it passed), for the test of that case to raise."""
    folders = {case: root / str(case) for case in cases}
    for folder in folders.values():
        folder.mkdir()
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {case: pool.submit(check, case, folders[case]) for case in cases}
    return {case: future.exception() for case, future in futures.items()}


def raise_what(outcome: BaseException | None) -> None:
    if outcome is not None:
        raise outcome


# -- processes --------------------------------------------------------------------------------
def spawn(*args: str) -> subprocess.Popen[str]:
    """``loadgen ARGS`` as a terminal would start it, in a session (process group) of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "loadgen", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session) of a live process, None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[3])


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def processes_of(parent: int) -> list[int]:
    """Every live process of a run: its session's (workers, multiprocessing's helpers) and its
    simulator (a session of its own, found by the lifeline command naming the parent's PID)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == parent:
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if st[2] == parent or (b"loadgen.lifeline" in argv and str(parent).encode() in argv):
            found.append(pid)
    return found


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what} not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - start


def gone_within(parent: int, timeout: float) -> float:
    """Seconds until no process of the run remains (an AssertionError naming them otherwise)."""
    try:
        return wait_until(lambda: not processes_of(parent), timeout, "every process of the run gone")
    except AssertionError:
        left = processes_of(parent)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"orphans left after {timeout} s: {left}") from None


def worker_run(server: LoggingServer, out: Path) -> subprocess.Popen[str]:
    return spawn(
        "run",
        "--endpoint",
        server.url,
        "--model",
        "m",
        "--rate",
        "40",
        "--duration",
        "60",
        "--workers",
        "2",
        "--drain",
        "5",
        "--out",
        str(out),
        "--no-live",
        "--no-report",
    )


def record_columns(out: Path) -> dict[str, list[Any]]:
    """The run's records as columns, from records.parquet or, after a kill, the raw streams."""
    if (out / "records.parquet").exists():
        return read_records(out).to_pydict()
    streams = sorted(out.glob("records*.arrows"))
    assert streams, f"no record stream in {out}"
    return pa.concat_tables([read_stream(p) for p in streams]).to_pydict()


def records_on_disk(out: Path) -> dict[int, str]:
    """request -> status."""
    t = record_columns(out)
    return dict(zip(t["request"], t["status"], strict=True))


# -- the tests --------------------------------------------------------------------------------
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
SIGNAL_IDS = [signal.Signals(sig).name for sig in SIGNALS]


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, BaseException | None]:
    return side_by_side(signal_the_parent_of_two_workers, SIGNALS, tmp_path_factory.mktemp("workers"))


@pytest.mark.parametrize("sig", SIGNALS, ids=SIGNAL_IDS)
def test_a_signal_to_the_parent_of_two_workers_stops_both(
    worker_runs: dict[int, BaseException | None], sig: int
) -> None:
    raise_what(worker_runs[sig])


def signal_the_parent_of_two_workers(sig: int, tmp_path: Path) -> None:
    """The test above for one signal: its run against a server of its own, and every check."""
    with logging_server() as server:
        out = tmp_path / "run"
        proc = worker_run(server, out)
        try:
            wait_until(lambda: len(server.settled(time.perf_counter_ns())) >= 10, 60, "both workers sending")
        except AssertionError:
            proc.kill()
            raise AssertionError(proc.communicate(timeout=10)[1][-2000:]) from None
        killed = time.perf_counter_ns()
        os.kill(proc.pid, sig)  # the PID alone, not its group
        stdout, stderr = proc.communicate(timeout=30)
        stopped_s = (time.perf_counter_ns() - killed) / 1e9
        gone_within(proc.pid, 3.0)
        time.sleep(max(0.0, 1.3 - stopped_s))  # past the kill window, in case anything were still sending
        assert server.after(killed + KILL_WINDOW_NS) == [], "a request was sent more than 1 s after the signal"
        last = (max(s.t_ns for s in server.log) - killed) / 1e6
        print(
            f"{signal.Signals(sig).name}: {len(server.after(killed))} requests arrived after it, the last {last:.0f} ms"
        )
        have = records_on_disk(out)
        if sig == signal.SIGKILL:
            finished = server.settled(killed)
            assert finished and finished <= set(have), "a request finished before the last flush is not on disk"
            return
        assert proc.returncode == 128 + sig, stderr
        assert f"interrupted ({signal.Signals(sig).name})" in stdout
        assert {s.seq for s in server.log} <= set(have), "a request the server saw is missing from the records"
        assert all(have[s.seq] == "ok" for s in server.log if s.complete)
        meta = orjson.loads((out / "run.json").read_bytes())
        assert meta["state"] == "interrupted" and meta["interrupted_reason"] == signal.Signals(sig).name


def sim_run(out: Path, *, itl_ms: int) -> subprocess.Popen[str]:
    return spawn(
        "run",
        "--sim-ttft-ms",
        "10",
        "--sim-itl-ms",
        str(itl_ms),
        "--rate",
        "20",
        "--duration",
        "60",
        "--input-tokens",
        "8",
        "--output-tokens",
        "10",
        "--drain",
        "20",
        "--out",
        str(out),
        "--no-live",
        "--no-report",  # the terminal's summary and run.json are what these tests read
    )


def sim_of(parent: int) -> int:
    """The PID of the run's simulator (the one process of the run in a session of its own)."""

    def sims() -> list[int]:
        return [p for p in processes_of(parent) if (_stat(p) or ("", 0, parent))[2] != parent]

    wait_until(lambda: bool(sims()), 30, "the simulator started")
    return sims()[0]


class SimCounter:
    """Reads the run's simulator's ``/metrics`` every 50 ms, keeping (when, requests it finished)."""

    def __init__(self, url: str) -> None:
        self.url = url.removesuffix("/v1") + "/metrics"
        self.seen: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            try:
                with urllib.request.urlopen(self.url, timeout=1) as resp:
                    text = resp.read().decode()
            except OSError:
                continue  # the simulator is gone (or busy): the last reading stands
            t = time.perf_counter_ns()
            for line in text.splitlines():
                if line.startswith("vllm:request_success_total"):
                    self.seen.append((t, int(float(line.rsplit(" ", 1)[1]))))

    def finished_before(self, t_ns: int) -> int:
        return max((n for at, n in self.seen if at < t_ns), default=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture(scope="module")
def simulator_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, BaseException | None]:
    return side_by_side(signal_the_parent_of_a_simulator_run, SIGNALS, tmp_path_factory.mktemp("simulator"))


@pytest.mark.parametrize("sig", SIGNALS, ids=SIGNAL_IDS)
def test_a_signal_to_the_parent_of_a_simulator_run_stops_it_and_loses_nothing(
    simulator_runs: dict[int, BaseException | None], sig: int
) -> None:
    """The parent's PID alone. run.json says ``running`` while the run goes on; after the signal
    nothing is sent more than 1 s later and the simulator is gone. SIGKILL: every request the
    simulator finished before the last flush interval is on disk, and ``report`` and ``gate`` of
    the folder say first that the run did not finish. SIGTERM/SIGINT: the simulator serves
    through the drain, every scheduled request is one record, and run.json says why it ended."""
    raise_what(simulator_runs[sig])


def signal_the_parent_of_a_simulator_run(sig: int, tmp_path: Path) -> None:
    """The test above for one signal: its run, the signal, and every check."""
    out = tmp_path / "run"
    proc = sim_run(out, itl_ms=20)  # 10 tokens 20 ms apart: ~0.2 s answers, ~4 in flight at 20 req/s
    sim = sim_of(proc.pid)
    wait_until(lambda: (out / "run.json").exists(), 60, "run.json written")
    meta = orjson.loads((out / "run.json").read_bytes())
    assert (meta["state"], meta["pid"]) == ("running", proc.pid)
    counter = SimCounter(meta["endpoint"])
    try:
        wait_until(lambda: counter.finished_before(time.perf_counter_ns()) >= 20, 60, "the simulator serving")
    except AssertionError:
        proc.kill()
        raise AssertionError(proc.communicate(timeout=10)[1][-2000:]) from None
    killed = time.perf_counter_ns()
    os.kill(proc.pid, sig)
    stdout, stderr = proc.communicate(timeout=30)
    wait_until(lambda: not alive(sim), 3.0, "the simulator gone")
    counter.stop()
    gone_within(proc.pid, 3.0)
    t = record_columns(out)
    sent = [x for x in t["t_sent"] if x is not None]
    late = [(x - killed) / 1e6 for x in sent if x > killed + KILL_WINDOW_NS]
    print(f"{signal.Signals(sig).name}: {sum(x > killed for x in sent)} requests sent after it, {len(late)} past 1 s")
    assert late == [], f"requests sent {late} ms after the signal"
    ok = t["status"].count("ok")
    if sig == signal.SIGKILL:
        finished = counter.finished_before(killed - FLUSH_MARGIN_NS)
        print(f"  the simulator finished {finished} requests before the last flush interval; {ok} are on disk")
        assert finished > 0 and ok >= finished, f"the simulator finished {finished} before the last flush; {ok} on disk"
        assert orjson.loads((out / "run.json").read_bytes())["state"] == "running"  # nobody lived to finalise it
        for command, code in ((["report", str(out)], 0), (["gate", str(out), "--slo", "interactive-chat"], 3)):
            argv = [sys.executable, "-m", "loadgen", *command]
            said = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            first = said.stdout.splitlines()[0] if said.stdout else said.stderr
            assert first.startswith("INTERRUPTED: this run was interrupted (the run's process ended"), (command, first)
            assert said.returncode == code, (command, said.stderr[-500:])  # the gate decides nothing: inconclusive
        return
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, stderr
    assert f"interrupted ({name})" in stdout
    assert "disconnected" not in t["status"], "the simulator stopped before the drain ended"
    assert ok >= counter.finished_before(time.perf_counter_ns()) > 0
    assert sorted(t["request"]) == list(range(len(t["request"])))  # every request once, none twice
    assert set(t["status"]) <= {"ok", "not_sent"} and t["status"].count("not_sent") > 500  # the rest of 60 s
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["state"] == "interrupted" and meta["interrupted_reason"] == name


@pytest.fixture(scope="module")
def ctrl_c_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, BaseException | None]:
    return side_by_side(ctrl_c_a_simulator_run, (1, 2), tmp_path_factory.mktemp("ctrl-c"))


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_drains_against_a_simulator_that_keeps_serving(
    ctrl_c_runs: dict[int, BaseException | None], presses: int
) -> None:
    """A terminal's Ctrl-C reaches the whole process group: the simulator must not die of it.
    Once: the answers in flight finish (ok, not disconnected). Twice: the drain is cut short."""
    raise_what(ctrl_c_runs[presses])


def ctrl_c_a_simulator_run(presses: int, tmp_path: Path) -> None:
    """The test above for one number of presses: its run, the Ctrl-Cs, and every check."""
    out = tmp_path / "run"
    proc = sim_run(out, itl_ms=(100, 300)[presses - 1])  # 1 s answers (3 s when the drain is cut): ~20-60 in flight
    sim = sim_of(proc.pid)
    wait_until(lambda: (out / "run.json").exists(), 60, "the run sending")
    time.sleep(1.0)  # some answers in flight, some done
    os.killpg(proc.pid, signal.SIGINT)
    if presses == 2:
        time.sleep(0.3)
        assert alive(sim), "the simulator died of the terminal's Ctrl-C"
        os.killpg(proc.pid, signal.SIGINT)
    pressed = time.perf_counter_ns()
    stdout, stderr = proc.communicate(timeout=40)
    assert proc.returncode == 130, stderr
    statuses = list(records_on_disk(out).values())
    last_done = max(read_records(out).column("t_done").drop_null().to_pylist())
    assert "disconnected" not in statuses, "the simulator was killed under the drain"
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["state"] == "interrupted"
    if presses == 1:
        assert statuses.count("ok") > 0 and "cancelled" not in statuses
        assert meta["interrupted_reason"] == "SIGINT"
    else:
        assert "second interrupt: drain cut short;" in stdout and "cancelled" in statuses
        n = int(stdout.split("drain cut short; ")[1].split()[0])
        assert n == statuses.count("cancelled") and n > 0
        assert meta["interrupted_reason"] == "second SIGINT: drain cut short"
        # the answers take 3 s; cut, the drain ends at once (with a margin for a busy box)
        assert last_done < pressed + 1_500_000_000, f"the cut drain went on {(last_done - pressed) / 1e9:.1f} s"
    gone_within(proc.pid, 3.0)
    assert not alive(sim)
