"""A bad input is one line and exit code 2, and nothing is sent.

Every case runs the real command (``python -m loadgen ...``) against a loopback
server that counts every request it gets, whatever the path. The form is pinned,
argparse's errors included: exit code 2, exactly one non-empty stderr line, and it
starts ``loadgen: error:`` and says what is wrong (the case's ``says``); no
traceback; and the server saw no request at all (not even ``GET /v1/models``,
which is why the cases give no ``--model``). The cases run in parallel threads,
once per module (a subprocess costs ~0.3-1 s); each case is then its own test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from hostile_runner import Runner

from loadgen.cli.flags import Parser, attach_dash_values
from loadgen.cli.main import build_parser

# ~40 interpreters start in the first test's set-up: ~25 s of CPU, which on a loaded 2-core box
# (load average 8) is several times that in wall time
pytestmark = pytest.mark.timeout(400)

URL = "{url}"  # replaced by the counting server's base URL
OUT = "{out}"  # replaced by a fresh folder for the case
FILES = "{files}"  # replaced by the folder of bad files
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    says: str  # a fragment the error line must contain
    env: dict[str, str] = field(default_factory=dict)


def run(*flags: str) -> tuple[str, ...]:
    """``loadgen run`` against the counting server, with good defaults the case's flags override."""
    base = {"--endpoint": URL, "--rate": "5", "--requests": "3", "--out": OUT}
    argv = list(flags)
    for k, v in base.items():
        if k not in argv:
            argv += [k, v]
    return ("run", *argv)


CASES = [
    Case("unknown event loop", run(), "LOADGEN_LOOP='trio'", env={"LOADGEN_LOOP": "trio"}),
    Case("sim option out of range", run("--sim-tp", "0"), "argument --sim-tp"),
    Case("sim option the model refuses", run("--sim-tp", "3"), "tp=3"),
    Case("sim faults unknown", run("--sim-faults", "bogus"), "--sim-faults: unknown"),
    Case("sim option NaN", run("--sim-kv-util", "nan"), "argument --sim-kv-util"),
    Case("sim profile not text", run("--sim-gpu", f"{FILES}/latin1.yaml"), "not UTF-8"),
    Case("sim option without an endpoint", ("run", "--rate", "5", "--sim-faults", "bogus"), "--sim-faults"),
    Case("negative seed", run("--seed", "-1"), "argument --seed: -1 is out of range"),
    Case("duration NaN", run("--duration", "nan"), "argument --duration: 'nan' is not a finite number"),
    Case("duration huge", run("--duration", "1e308"), "argument --duration: 1e308 is out of range"),
    Case("rate huge", run("--rate", "1e12"), "argument --rate: 1e12 is out of range"),
    Case(
        "rate x duration over the cap", ("run", "--endpoint", URL, "--rate", "1e6", "--duration", "100"), "10,000,000"
    ),
    Case("requests over the cap", run("--requests", "20000000"), "argument --requests"),
    Case("not a number", run("--rate", "abc"), "argument --rate: 'abc' is not a number"),
    Case("rate and concurrency", run("--concurrency", "2"), "not both"),
    Case("neither rate nor concurrency", ("run", "--endpoint", URL, "--duration", "5"), "give --rate"),
    Case("gamma without a cv", run("--arrival", "gamma:0"), "cv > 0"),
    Case("no measurement window", run("--duration", "5", "--warmup", "3", "--cooldown", "3"), "no measurement window"),
    Case("extra body not JSON", run("--extra-body", "{nope"), "--extra-body"),
    Case("API key variable unset", run("--api-key-env", "LOADGEN_TEST_UNSET_VAR"), "LOADGEN_TEST_UNSET_VAR"),
    Case("port out of range", run("--endpoint", "http://127.0.0.1:99999/v1"), "port out of range"),
    Case("unclosed IPv6 literal", run("--endpoint", "http://[::1"), "invalid ipv6 url"),
    Case("endpoint not a URL", run("--endpoint", "localhost:8000"), "--endpoint 'localhost:8000'"),
    Case("server metrics port", run("--server-metrics", "http://127.0.0.1:70000/metrics"), "--server-metrics"),
    Case("workload binary", run("--workload", f"{FILES}/binary.yaml"), "binary.yaml:2: not UTF-8"),
    Case("workload latin-1", run("--workload", f"{FILES}/latin1.yaml"), "latin1.yaml:2: not UTF-8"),
    Case("workload control character", run("--workload", f"{FILES}/nul.yaml"), "not a YAML text file"),
    Case("SLO latin-1", run("--slo", f"{FILES}/latin1.yaml"), "latin1.yaml:2: not UTF-8"),
    Case("--out names a file", run("--out", f"{FILES}/a-file"), "is a file, not a folder"),
    Case("--out under a file", run("--out", f"{FILES}/a-file/run"), "cannot write there"),
    Case("--out unwritable", run("--out", f"{FILES}/read-only"), "cannot write there"),
    Case("report: corrupt records", ("report", f"{FILES}/bad-records"), "records.parquet: unreadable records"),
    Case("report: corrupt run.json", ("report", f"{FILES}/bad-json"), "run.json: not valid JSON"),
    Case("report: run.json a list", ("report", f"{FILES}/list-json"), "run.json: expected a JSON object"),
    Case("report: run.json settings a number", ("report", f"{FILES}/bad-settings"), "settings: expected a JSON object"),
    Case("report: not a run folder", ("report", FILES), "not a run folder"),
    Case("report: window NaN", ("report", f"{FILES}/bad-records", "--warmup", "nan"), "argument --warmup"),
    Case(
        "compare: corrupt records",
        ("compare", f"{FILES}/bad-records", f"{FILES}/bad-records", "--out", OUT),
        "unreadable records",
    ),
    Case("compare: corrupt run.json", ("compare", f"{FILES}/bad-json", f"{FILES}/bad-json", "--out", OUT), "run.json"),
    Case("gate: corrupt records", ("gate", f"{FILES}/bad-records", "--slo", "interactive-chat"), "unreadable records"),
    Case("sweep: rate over the limit", ("sweep", "--endpoint", URL, "--rates", "1,1e12", "--out", OUT), "--rates"),
    Case(
        "sweep: workload not text",
        ("sweep", "--endpoint", URL, "--rates", "1", "--workload", f"{FILES}/binary.yaml"),
        "not UTF-8",
    ),
    Case("check: unknown event loop", ("check", "--endpoint", URL), "LOADGEN_LOOP", env={"LOADGEN_LOOP": "trio"}),
    Case("sim: unknown event loop", ("sim", "--port", "0"), "LOADGEN_LOOP", env={"LOADGEN_LOOP": "trio"}),
    Case("sim: port out of range", ("sim", "--port", "99999"), "argument --port"),
    Case("workloads show: not text", ("workloads", "show", f"{FILES}/latin1.yaml"), "not UTF-8"),
    Case("workloads preview: bad --set", ("workloads", "preview", "chat", "--set", "a=[1"), "--set"),
]


# --------------------------------------------------------------------------- the counting server


class CountingServer:
    """Answers 500 to everything on 127.0.0.1 and counts what it got."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _count(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path}")
        return web.Response(status=500, text="a bad input must not reach the wire")

    async def _main(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._count)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> CountingServer:
        self._thread.start()
        assert self._ready.wait(10), "the counting server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


# --------------------------------------------------------------------------- the bad files


def bad_files(folder: Path) -> Path:
    folder.mkdir()
    (folder / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    (folder / "latin1.yaml").write_bytes("kind: chat\ndescription: caf\u00e9\n".encode("latin-1"))
    (folder / "nul.yaml").write_bytes(b"kind: chat\x00\n")
    (folder / "a-file").write_text("not a folder\n")
    read_only = folder / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root writes through any mode: use a folder no one can create files in
        read_only.rmdir()
        read_only.symlink_to("/proc")
    for name, run_json, records in (
        ("bad-records", b"{}", os.urandom(512)),
        ("bad-json", b"{nope", None),
        ("list-json", b"[1, 2]", None),
        ("bad-settings", b'{"settings": 5}', None),
    ):
        (folder / name).mkdir()
        (folder / name / "run.json").write_bytes(run_json)
        if records is not None:
            (folder / name / "records.parquet").write_bytes(records)
    return folder


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    stderr: str


def _run_case(case: Case, url: str, files: Path, out: Path, runner: Runner | None) -> Result:
    argv = [a.replace(URL, url).replace(OUT, str(out)).replace(FILES, str(files)) for a in case.argv]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "LOADGEN_LOOP")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    if runner is not None:  # a process of its own, forked from one that imported loadgen once
        out.mkdir(parents=True, exist_ok=True)
        rid = runner.start(argv, files.parent, {**env, **case.env}, out / "stdout", out / "stderr")
        status, _, killed = runner.wait(rid, time.monotonic() + 120)
        if killed:
            return Result(argv, -1, "still running after 120 s")
        return Result(argv, os.waitstatus_to_exitcode(status), (out / "stderr").read_text(errors="replace"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "loadgen", *argv],
            capture_output=True,
            text=True,
            env={**env, **case.env},
            cwd=files.parent,  # a default run folder (runs/...) would land here
            timeout=120,  # generous: a loaded box; a case that went on to send or serve fails here
            check=False,
        )
    except subprocess.TimeoutExpired as e:  # it went on to send (or serve): the case fails, the others run
        return Result(argv, -1, f"still running after {e.timeout} s")
    return Result(argv, done.returncode, done.stderr)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Result], list[str], Path]]:
    root = tmp_path_factory.mktemp("bad-input")
    files = bad_files(root / "files")
    # each case a process of its own (its exit code, its stderr), forked from one interpreter that
    # imported loadgen once (tests/hostile_runner.py); LOADGEN_BAD_INPUT_FORK=0 starts each afresh
    runner = Runner(root) if os.environ.get("LOADGEN_BAD_INPUT_FORK", "1") != "0" else None
    try:
        with CountingServer() as server:
            with ThreadPoolExecutor(max_workers=4) as pool:
                futures = {
                    c.id: pool.submit(_run_case, c, server.url, files, root / "out" / str(i), runner)
                    for i, c in enumerate(CASES)
                }
                results = {k: f.result() for k, f in futures.items()}
            yield results, server.requests, root
    finally:
        if runner is not None:
            runner.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_input_is_one_line_and_exit_code_2(
    case: Case, outcome: tuple[dict[str, Result], list[str], Path]
) -> None:
    r = outcome[0][case.id]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, f"{r.argv}: exit code {r.returncode}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, f"{r.argv}: expected one line on stderr, got\n{r.stderr}"
    assert lines[0].startswith("loadgen: error: "), lines[0]
    assert case.says in lines[0], f"{case.says!r} not in {lines[0]!r}"


def test_no_bad_input_sent_anything(outcome: tuple[dict[str, Result], list[str], Path]) -> None:
    results, requests, root = outcome
    assert len(results) == len(CASES)
    assert requests == []
    assert not [p for p in root.rglob("records*") if p.parent.name not in ("bad-records",)]


def test_the_counting_server_counts() -> None:
    """The zero above is worth something: a request that does reach the server is counted."""
    import urllib.error
    import urllib.request

    with CountingServer() as server:
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(server.url + "/models", timeout=10)
        answer.value.close()
    assert server.requests == ["GET /v1/models"]


# --------------------------------------------------------------------------- every numeric flag, in process


def _numeric_flags() -> list[tuple[str, str]]:
    """(command path, flag) for every option of every command that takes a number."""
    out: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}".strip())
            elif action.option_strings and action.type is not None and action.type is not str:
                out.append((path, action.option_strings[0]))

    walk(PARSER, "")
    return out


PARSER = build_parser()
NUMERIC = _numeric_flags()


def test_no_numeric_flag_takes_a_bare_float_or_int() -> None:
    """Bare ``float`` accepts 'nan' and 'inf'; every numeric flag uses flags.finite_float or bounded_int."""
    bare = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}".strip())
            elif action.type in (float, int):
                bare.append(f"{path} {action.option_strings or action.dest}")

    walk(PARSER, "")
    assert bare == []
    assert len(NUMERIC) > 40  # the walk found the flags (run, sweep, sim, check, report, ...)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_numeric_flag_refuses_nan_and_infinity(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    accepted = []
    for path, flag in NUMERIC:
        with pytest.raises(SystemExit) as stop:
            PARSER.parse_args([*path.split(), *_required(path), f"{flag}={value}"])
        err = capsys.readouterr().err
        if stop.value.code != 2 or not err.startswith(f"loadgen: error: argument {flag}") or err.count("\n") != 1:
            accepted.append(f"{path} {flag}={value}: {stop.value.code} {err!r}")
    assert accepted == []


def _required(path: str) -> list[str]:
    """Positional arguments the command needs before the flag is even looked at."""
    return {"report": ["RUN"], "gate": ["RUN", "--slo", "x"], "workloads preview": ["chat"]}.get(path, [])


def test_sub_parsers_are_of_the_one_line_kind() -> None:
    sub = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction))
    assert all(isinstance(p, Parser) for p in sub.choices.values())


# --------------------------------------------------------------------------- bad load flags, in process

# (argv, a fragment of the one error line). Every list flag's error names the flag, the list
# and the value at fault; a value may start with a dash (``--rates -1,2``, see flags.Parser).
BAD_LOAD_FLAGS = [
    (("sweep", "--rates", "1,,2"), "--rates '1,,2': an empty value"),
    (("sweep", "--rates", "1,2,"), "--rates '1,2,': an empty value"),
    (("sweep", "--rates", " "), "--rates ' ': give at least one value"),
    (("sweep", "--rates", "-1,2"), "--rates '-1,2': -1 must be > 0"),
    (("sweep", "--rates=-1,2"), "--rates '-1,2': -1 must be > 0"),
    (("sweep", "--rates", "0,1"), "--rates '0,1': 0 must be > 0"),
    (("sweep", "--concurrency", "0,4"), "--concurrency '0,4': 0 must be > 0"),
    (("sweep", "--concurrency", "-2:8:x2"), "--concurrency '-2:8:x2': need 0 < START"),
    (("sweep", "--concurrency", "1.5,4"), "--concurrency '1.5,4': 1.5 is not a whole number"),
    (("sweep", "--rates", "nan,2"), "--rates 'nan,2': 'nan' is not a finite number"),
    (("sweep", "--rates", "2,inf"), "--rates '2,inf': 'inf' is not a finite number"),
    (("sweep", "--rates", "1:inf:x2"), "--rates '1:inf:x2': 'inf' is not a finite number"),
    (("sweep", "--rates", "1:8:xnan"), "--rates '1:8:xnan': 'nan' is not a finite number"),
    (("sweep", "--rates", "1:1000:+1"), "--rates '1:1000:+1': the range has more than 100 points"),
    (("sweep", "--rates", "1,2,1"), "--rates '1,2,1': 1 is repeated"),
    (("sweep", "--rates", "1.001,1.002"), "1 is repeated"),  # the same point once rounded
    (("sweep", "--rates", "fast"), "--rates 'fast': 'fast' is not a number"),
    (("sweep", "--point-duration", "0"), "argument --point-duration: 0 is out of range"),
    (("sweep", "--drain", "-1"), "argument --drain: -1 is out of range"),
    (("run", "--rate", "-1"), "argument --rate: -1 is out of range"),
    (("run", "--rate", "-1,2"), "argument --rate: '-1,2' is not a number"),
    (("run", "--rate", "nan"), "argument --rate: 'nan' is not a finite number"),
    (("run", "--rate", "inf"), "argument --rate: 'inf' is not a finite number"),
    (("run", "--concurrency", "0"), "argument --concurrency: 0 is out of range"),
    (("run", "--concurrency", "-4"), "argument --concurrency: -4 is out of range"),
    (("run", "--duration", "0"), "argument --duration: 0 is out of range"),
    (("run", "--duration", "-5"), "argument --duration: -5 is out of range"),
    (("run", "--requests", "0"), "argument --requests: 0 is out of range"),
    (("run", "--requests", "-3"), "argument --requests: -3 is out of range"),
    (("run", "--drain", "-1"), "argument --drain: -1 is out of range"),
    (("run", "--max-inflight", "0"), "argument --max-inflight: 0 is out of range"),
]


def _with_defaults(argv: tuple[str, ...], url: str, out: Path) -> list[str]:
    """The case's flags, plus a good endpoint, load and folder where the case gives none."""
    given = {a.split("=", 1)[0] for a in argv}
    extra = ["--endpoint", url, "--out", str(out)]
    if argv[0] == "run" and not given & {"--rate", "--concurrency"}:
        extra += ["--rate", "5"]
    if argv[0] == "run" and not given & {"--requests", "--duration", "--concurrency"}:
        extra += ["--requests", "3"]
    if argv[0] == "sweep" and not given & {"--rates", "--concurrency"}:
        extra += ["--rates", "1"]
    return [*argv, *extra]


@pytest.fixture(scope="module")
def counting() -> Iterator[CountingServer]:
    with CountingServer() as server:
        yield server


@pytest.mark.parametrize(("argv", "says"), BAD_LOAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_LOAD_FLAGS])
def test_a_bad_load_flag_is_one_line_naming_it_and_exit_code_2(
    argv: tuple[str, ...], says: str, counting: CountingServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from loadgen.cli.main import main

    try:
        code = main(_with_defaults(argv, counting.url, tmp_path / "run"))
    except SystemExit as stop:  # argparse's errors
        code = stop.code if isinstance(stop.code, int) else 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("loadgen: error: "), lines
    assert says in lines[0]
    assert counting.requests == []


@pytest.mark.parametrize(
    ("argv", "read_as"),
    [
        (["--rates", "-1,2"], ["--rates=-1,2"]),
        (["run", "--rate", "-.5", "--seed", "3"], ["run", "--rate=-.5", "--seed", "3"]),
        (["--rates", "-2:8:x2"], ["--rates=-2:8:x2"]),
        (["--rates=-1,2"], ["--rates=-1,2"]),  # already one token
        (["--a", "-1", "-2"], ["--a=-1", "-2"]),  # one value per flag
        (["--rates", "-x"], ["--rates", "-x"]),  # a dash and a letter is an option
        (["-o", "-1"], ["-o", "-1"]),  # short options are left to argparse
        (["report", "-1"], ["report", "-1"]),  # after a positional: argparse decides
        (["--", "--rates", "-1"], ["--", "--rates", "-1"]),  # nothing after --
    ],
)
def test_a_value_starting_with_a_dash_and_a_digit_belongs_to_the_flag_before_it(
    argv: list[str], read_as: list[str]
) -> None:
    assert attach_dash_values(argv) == read_as
