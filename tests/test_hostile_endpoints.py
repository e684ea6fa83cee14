"""Hostile endpoints: a short real ``loadgen run`` against each behaviour of tests/hostile.py.

For every behaviour (one table row each, some behaviours twice with other flags), a
``loadgen run`` sends 4 requests at 4/s with a recognisable API key, with tight timeouts where a
timeout is what the row expects (roomy ones elsewhere), and
the row holds issue 13's promises:

- the run ends inside its timeouts (a margin for start-up and report on a loaded box; past
  ``KILL_S`` it is killed and called a hang), with no traceback;
- exit code 0 when some request succeeded, 4 with a line naming the most common failure
  when every one failed, 2 and one line when the endpoint cannot be used at all;
- every scheduled request has exactly one record (records.parquet, else records.arrows),
  with a status that tells the truth about the behaviour and an error that says what
  happened; no impossible number, no control, ANSI or bidi character in a record;
- no such character on the terminal or in a JSON or HTML file, no endpoint markup
  unescaped in report.html;
- peak memory (``ru_maxrss`` of the child, from ``wait4``) under ``MAX_RSS_MIB``;
- no secret, raw, URL-encoded or base64 (and fragments), in any file (Parquet and Arrow
  decoded too) nor on stdout or stderr: the API key, and in the ``url-credentials`` row a
  password in the URL's user info and a key in its query;
- the server saw the client stop (no exchange ran into the server's own byte or time cap)
  and nothing arrived after loadgen exited.

Every row runs on the lean wire (the default transport); a representative subset runs again
on aiohttp's (``AIOHTTP_ROWS``, ``--transport aiohttp``), and each row checks that run.json names
the transport it asked for. The checks are in tests/hostile_checks.py. Each run is forked from one interpreter that
imported loadgen once (tests/hostile_runner.py), eight at a time (mostly waiting on the
server or on their timeouts: the seven timeout rows go first, together), which keeps the
table near 25 s on 2 cores;
``LOADGEN_HOSTILE_FORK=0`` starts each as ``python -m loadgen`` instead. The whole table:
``.venv/bin/python tests/test_hostile_endpoints.py [ROW ...]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote, unquote

import orjson
import pytest
from hostile import HostileServer, serve_in_thread
from hostile_behaviours import BEHAVIOURS
from hostile_checks import (
    UNUSABLE,
    RunFiles,
    check_exit,
    check_records,
    check_secrets,
    check_text,
    read_records,
    secret_forms,
)
from hostile_runner import Runner

pytestmark = pytest.mark.timing  # "inside its timeouts" is a real-time bound

SECRET = "hostile-Q7mZ4tWb2Xp9/Lr8+Vn3Ks="  # the API key ($OPENAI_API_KEY)
URL_USER, URL_SECRET = "hostile-user", "urlpass-Z3kQ8/wV+p=9Ty"  # user info in the endpoint URL
QUERY_SECRET = "querykey-Jm4R/e+N8sXc="  # ?api-key= in the endpoint URL
FORMS = secret_forms(SECRET) | {f"url password {k}": v for k, v in secret_forms(URL_SECRET, URL_USER).items()}
FORMS |= {f"url query {k}": v for k, v in secret_forms(QUERY_SECRET).items()}
REQUESTS, RATE = 4, 4.0
TIMEOUTS = ["--connect-timeout", "2", "--first-byte-timeout", "1.5", "--idle-timeout", "1"]
TIMEOUTS += ["--request-timeout", "3", "--drain", "4"]
# A row whose behaviour answers (no timeout expected) runs with roomy timeouts instead: eight runs
# at once beside other tests, the server's one thread was once more than 1.5 s late with a first
# byte, and an "ok" row's request became a first-byte timeout. A client ignoring these is still
# caught by the server's cap (SERVER_CAP_S), past every one of them.
ROOMY = ["--connect-timeout", "5", "--first-byte-timeout", "8", "--idle-timeout", "8"]
ROOMY += ["--request-timeout", "10", "--drain", "4"]
# Every request has ended (or timed out) by its last send + its request timeout (3.75 s; 10.75 s
# under ROOMY, where answers come at once and only a late server reaches it). The
# margin is for start-up, compaction and the report's charts (~1 s of CPU), eight runs at once
# on a 2-core box at load average 8; a client that ignores a timeout is caught exactly, and
# independently of load, by the server's own cap (SERVER_CAP_S) instead.
EXPECTED_S = (REQUESTS - 1) / RATE + 3 + 26
KILL_S = 60.0
MAX_RSS_MIB = 400
SERVER_CAP_S = 15.0  # longer than any client timeout here: reaching it means the client did not stop
PARALLEL = 8


class Case(NamedTuple):
    id: str
    behaviour: str
    statuses: frozenset[str]  # the statuses that tell the truth (UNUSABLE: exit 2, one line, no record)
    error_says: str = ""  # a pattern every failed record's error must match (case-insensitive)
    discovery: bool = False  # no --model: the run asks /v1/models first
    identity: bool = False  # the client must ask for an uncompressed stream
    extra: tuple[str, ...] = ()  # more flags (after TIMEOUTS or ROOMY, so they win)
    must_see: frozenset[str] = frozenset()  # statuses at least one record must have
    url_credentials: bool = False  # the endpoint URL carries a password and a query key, no $OPENAI_API_KEY

    @property
    def tag(self) -> str | None:
        """The row's own path on the server when it shares a behaviour with another row."""
        return None if self.id == self.behaviour else self.id


def _c(
    name: str,
    statuses: str,
    error_says: str = "",
    *,
    behaviour: str | None = None,
    discovery: bool = False,
    identity: bool = False,
    extra: tuple[str, ...] = (),
    must_see: str = "",
    url_credentials: bool = False,
) -> Case:
    return Case(
        name,
        behaviour or name,
        frozenset(statuses.split()),
        error_says,
        discovery,
        identity,
        extra,
        frozenset(must_see.split()),
        url_credentials,
    )


CASES = [
    _c("ok", "ok"),
    _c("usage-huge", "ok", "usage|token|impossible"),
    _c("usage-negative", "ok", "usage|token|impossible"),
    _c("usage-mismatch", "ok"),
    _c("usage-nonint", "ok", "usage|token"),
    _c("usage-decreasing", "ok", "usage|token"),
    _c("nan-infinity", "ok bad_stream", "json|nan|infinity"),
    _c("deep-json", "ok bad_stream", "json|deep|nest"),
    _c("many-choices", "ok bad_stream", "choice"),
    _c("huge-line", "bad_stream", "longer than|line|event"),
    _c("endless-line", "bad_stream", "longer than|line|event"),
    _c("binary-garbage", "bad_stream"),
    _c("gzip", "ok bad_stream", "gzip|compress|encoding", identity=True),
    _c("deflate", "ok bad_stream", "deflate|compress|encoding", identity=True),
    _c("http10-close", "ok"),
    _c("trickle", "timeout", "timeout"),
    _c("trickle-headers", "timeout", "timeout"),
    _c("never-answer", "timeout", "timeout"),
    _c("accept-silent", "timeout", "timeout"),
    _c("reset-connect", "disconnected", "reset|connect|write|closed"),
    _c("reset-mid", "disconnected", "reset|connect|payload"),
    _c("close-after-headers", "disconnected", "payload|closed|disconnect|not complete"),
    _c("close-after-answer", "ok"),
    _c("empty-200", "bad_stream", "no sse|empty|event"),
    _c("short-body", "disconnected", "payload|closed|disconnect|not complete|length"),
    _c("bad-chunked", "disconnected bad_stream", "chunk|payload"),
    _c("no-done", "disconnected", "DONE|finish"),
    _c("done-then-more", "ok"),
    _c("comments-forever", "timeout", "timeout"),
    _c("json-body", "ok bad_stream", "json|content-type|stream"),
    _c("invalid-utf8", "ok"),
    _c("tool-calls", "ok"),
    _c("http429", "http_error", "429"),
    _c("http404-json", "http_error", "does not exist"),
    _c("http500-html", "http_error", "500"),
    _c("redirect-loop", "http_error client_error", "redirect"),
    _c("redirect-echo", "ok http_error client_error"),
    _c("markup", "ok"),
    _c("markup-fields", "ok"),
    _c("long-strings", "ok"),
    _c("markup-error", "http_error", "400"),
    _c("stream-error", "http_error", "error"),
    _c("status-weird", "http_error", "999"),
    _c("header-huge", "http_error client_error bad_stream", "header|8190|too"),
    _c("echo-auth", "ok"),
    _c("echo-auth-error", "http_error", "401"),
    _c("echo-auth-stream-error", "http_error", "error"),
    _c("models-endless", UNUSABLE, discovery=True),
    _c("models-garbage", UNUSABLE, discovery=True),
    _c("models-markup", f"ok {UNUSABLE}", discovery=True),
    _c("metrics-endless", "ok"),
    _c("metrics-markup", "ok"),
    # the same behaviours under other flags
    _c("url-credentials", "ok", behaviour="echo-auth", url_credentials=True),
    _c(
        "queued-at-drain",  # one slot, an answer that never comes: the queued requests are never sent
        "cancelled not_sent",
        "drain|stop|not sent|never sent|max-inflight",
        behaviour="never-answer",
        extra=("--max-inflight", "1", "--first-byte-timeout", "5", "--request-timeout", "5", "--drain", "1"),
        must_see="not_sent",
    ),
]


# The lean wire (the default) runs every row above; aiohttp's transport (--transport aiohttp), a
# representative row of each kind: a good stream, a compressed one, broken framing, a reset, a close
# mid-answer, a timeout, an error status, a huge header, credentials in the URL, a redirect.
# Every row checks in run.json that its transport ran. (The whole table on aiohttp too:
# LOADGEN_HOSTILE_AIOHTTP=all.)
AIOHTTP_ROWS = frozenset(
    ("ok", "gzip", "bad-chunked", "reset-mid", "close-after-headers", "never-answer", "http429")
    + ("header-huge", "url-credentials", "redirect-loop")
)
_ON_AIOHTTP = ("--transport", "aiohttp")


def on_aiohttp(case: Case) -> Case:
    return case._replace(id=f"{case.id}-aiohttp", extra=(*_ON_AIOHTTP, *case.extra))


_EVERY = os.environ.get("LOADGEN_HOSTILE_AIOHTTP") == "all"
CASES += [on_aiohttp(c) for c in CASES if (_EVERY or c.id in AIOHTTP_ROWS) and UNUSABLE not in c.statuses]


@dataclass
class Outcome:
    case: Case
    exit: int | None = None  # None: killed after KILL_S
    wall_s: float = 0.0
    rss_mib: float = 0.0
    records: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)

    def row(self) -> str:
        st = " ".join(f"{k}:{v}" for k, v in sorted(self.statuses.items())) or "-"
        verdict = "ok" if not self.findings else "; ".join(self.findings)
        return (
            f"| {self.case.id} | {self.exit} | {self.wall_s:.1f} | {self.rss_mib:.0f} | "
            f"{self.records}/{REQUESTS} | {st} | {verdict} |"
        )


# -- running one case ------------------------------------------------------------------------
def endpoint(server: HostileServer, case: Case) -> str:
    url = server.url(case.behaviour, case.tag)
    if case.url_credentials:
        scheme, rest = url.split("://", 1)
        url = f"{scheme}://{URL_USER}:{quote(URL_SECRET, safe='')}@{rest}?api-key={quote(QUERY_SECRET, safe='')}"
    return url


def command(server: HostileServer, case: Case, run_dir: Path) -> list[str]:
    """The arguments of ``loadgen`` for this case."""
    cmd = ["run", "--endpoint", endpoint(server, case), "--no-preflight"]  # every behaviour reaches the schedule
    if not case.discovery:
        cmd += ["--model", case.behaviour]
    cmd += ["--requests", str(REQUESTS), "--rate", str(RATE), "--arrival", "constant"]
    timeouts = TIMEOUTS if case.statuses & {"timeout", "cancelled"} else ROOMY
    cmd += ["--input-tokens", "16", "--output-tokens", "8", "--no-live", "--out", str(run_dir), *timeouts]
    if not any(word in case.id for word in REPORTED):  # its report would show nothing the endpoint wrote
        cmd.append("--no-report")
    return [*cmd, *case.extra]


# Rows whose endpoint sends text that a report shows (model ids, error texts, finish reasons, echoed
# keys): their report.html is written and checked. The others' reports (about 0.8 s of CPU each,
# drawing charts) would show only loadgen's own figures; leaving them out keeps the suite short.
REPORTED = ("echo", "markup", "long-strings", "invalid-utf8", "credentials", "ok", "error", "status-weird", "tool")


def run_case(server: HostileServer, case: Case, root: Path, runner: Runner | None) -> Outcome:
    """One ``loadgen run``: forked by ``runner`` (loadgen imported once), else ``python -m loadgen``."""
    out = Outcome(case)
    home = root / case.id
    home.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "GITHUB_STEP_SUMMARY", "OPENAI_API_KEY")}
    if not case.url_credentials:
        env["OPENAI_API_KEY"] = SECRET
    argv = command(server, case, home / "run")
    stdout, stderr = home / "stdout.txt", home / "stderr.txt"
    t0 = time.monotonic()
    if runner is not None:
        rid = runner.start(argv, home, env, stdout, stderr)
        status, rss_kib, killed = runner.wait(rid, t0 + KILL_S)
    else:
        with open(stdout, "wb") as so, open(stderr, "wb") as se:
            proc = subprocess.Popen([sys.executable, "-m", "loadgen", *argv], cwd=home, env=env, stdout=so, stderr=se)
            status, rss_kib, killed = _wait(proc.pid, t0 + KILL_S)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; tells Popen so
    t_exit = time.time_ns()
    out.wall_s = time.monotonic() - t0
    out.rss_mib = rss_kib / 1024
    out.exit = None if killed else os.waitstatus_to_exitcode(status)
    check(out, home, server, t_exit)
    return out


def _wait(pid: int, deadline: float) -> tuple[int, int, bool]:
    """Reap ``pid`` (killing it at ``deadline``): its wait status, peak RSS in KiB, whether killed."""
    killed = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage.ru_maxrss, killed
        if not killed and time.monotonic() >= deadline:
            os.kill(pid, 9)
            killed = True
        time.sleep(0.05)


def check(out: Outcome, home: Path, server: HostileServer, t_exit_ns: int) -> None:
    case, f = out.case, out.findings
    captures = (home / "stdout.txt", home / "stderr.txt")
    stdout, stderr = (p.read_bytes() for p in captures)
    table = read_records(home / "run")
    rows = table.to_pylist() if table is not None else []
    out.records = len(rows)
    out.statuses = Counter(str(r["status"]) for r in rows)
    if out.exit is None:
        f.append(f"hang: still running after {KILL_S:.0f}s, killed")
    elif out.wall_s > EXPECTED_S:
        f.append(f"slow: {out.wall_s:.0f}s (timeouts allow {EXPECTED_S:.0f}s)")
    for name, text in (("stderr", stderr), ("stdout", stdout)):
        if b"Traceback (most recent call last)" in text:
            f.append(f"traceback on {name}: {_last_line(text)}")
    if out.exit is not None:
        f.extend(check_exit(out.exit, rows, stderr, case.statuses))
    f.extend(check_records(rows, REQUESTS, case.statuses, case.error_says, case.must_see))
    files = RunFiles(home)
    f.extend(check_secrets(files, FORMS))
    f.extend(check_text(files, stdout + stderr, captures))
    if out.rss_mib > MAX_RSS_MIB:
        f.append(f"memory: peak RSS {out.rss_mib:.0f} MiB")
    f.extend(_check_server(server, case, t_exit_ns))
    f.extend(_check_transport(home / "run" / "run.json", case))


def _check_transport(run_json: Path, case: Case) -> list[str]:
    """The run went through the transport it asked for, with no fallback (no proxy here)."""
    if UNUSABLE in case.statuses or not run_json.exists():
        return []
    client = orjson.loads(run_json.read_bytes()).get("client", {})
    want = "aiohttp" if case.extra[:2] == _ON_AIOHTTP else "lean"
    got = (client.get("transport"), client.get("transport_fallback"))
    return [] if got == (want, "") else [f"transport: run.json says {got}, not ({want!r}, '')"]


def _last_line(text: bytes) -> str:
    lines = [ln for ln in text.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def _check_server(server: HostileServer, case: Case, t_exit_ns: int) -> list[str]:
    deadline = time.monotonic() + 3
    served = server.served(case.behaviour, case.tag)
    while any(e["end"] is None for e in served) and time.monotonic() < deadline:
        time.sleep(0.05)
        served = server.served(case.behaviour, case.tag)
    found = []
    capped = Counter(f"{e['route']} {e['end']}" for e in served if e["end"] in ("cap bytes", "cap time"))
    if capped:
        found.append(f"client did not stop before the server's cap: {dict(capped)}")
    late = [e for e in served if e["t_wall_ns"] > t_exit_ns]
    if late:
        found.append(f"{len(late)} requests reached the server after loadgen exited")
    if case.identity:
        streams = [e for e in served if e["route"] in ("chat", "completions")]  # not the /metrics scrape
        asked = {v for e in streams for k, v in e["headers"] if k.lower() == "accept-encoding"}
        if asked - {"identity"}:
            found.append(f"asks for Accept-Encoding {sorted(asked)} (not identity)")
    auths = {v for e in served for k, v in e["headers"] if k.lower() == "authorization"}
    if case.url_credentials:  # vacuous unless they travelled: Basic from the user info, the key in the query
        basic = any(a.startswith("Basic ") for a in auths)
        query = any(QUERY_SECRET in unquote(e["target"]) for e in served)
        if served and not (basic and query):
            targets = sorted({e["target"] for e in served})
            found.append(f"vacuous: the server saw Authorization {sorted(auths)} and targets {targets}")
    elif case.behaviour.startswith("echo-auth") and served and auths != {f"Bearer {SECRET}"}:
        found.append(f"vacuous: the server saw Authorization {sorted(auths)}")
    return found


# -- the suite -------------------------------------------------------------------------------
def audit(cases: list[Case], root: Path) -> dict[str, Outcome]:
    """Every case on one hostile server, ``PARALLEL`` at a time, slowest (timeouts) first."""
    order = sorted(cases, key=lambda c: (not c.statuses & {"timeout", "cancelled"}, c.id))
    runner = Runner(root) if os.environ.get("LOADGEN_HOSTILE_FORK", "1") != "0" else None
    try:
        with serve_in_thread(cap_s=SERVER_CAP_S) as server, ThreadPoolExecutor(PARALLEL) as pool:
            done = list(pool.map(lambda c: run_case(server, c, root, runner), order))
    finally:
        if runner is not None:
            runner.close()
    return {o.case.id: o for o in done}


def table(outcomes: dict[str, Outcome]) -> str:
    head = "| row | exit | wall s | RSS MiB | records | statuses | what breaks |\n|---|---|---|---|---|---|---|"
    return "\n".join([head, *(outcomes[c.id].row() for c in CASES if c.id in outcomes)])


def figures(outcomes: dict[str, Outcome]) -> str:
    """Issue 13's figures: rows tried, records lost, secrets found, the peak memory."""
    lost = sum(max(REQUESTS - o.records, 0) for o in outcomes.values() if UNUSABLE not in o.case.statuses)
    leaks = sum(1 for o in outcomes.values() for x in o.findings if x.startswith("key leaked"))
    worst = max(outcomes.values(), key=lambda o: o.rss_mib)
    failing = sum(bool(o.findings) for o in outcomes.values())
    return (
        f"{len(outcomes)} rows ({len({o.case.behaviour for o in outcomes.values()})} behaviours), "
        f"{failing} with findings; records lost {lost}; secret leaks {leaks} (row x form); "
        f"peak RSS {worst.rss_mib:.0f} MiB ({worst.case.id})"
    )


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    return audit(CASES, tmp_path_factory.mktemp("hostile"))


def test_every_behaviour_has_a_row() -> None:
    assert {c.behaviour for c in CASES} == set(BEHAVIOURS)
    assert len({c.id for c in CASES}) == len(CASES)
    assert len(BEHAVIOURS) >= 25


@pytest.mark.timeout(480)  # the first row runs the whole table (~25 s idle)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_hostile_endpoint_loses_nothing_and_leaks_nothing(outcomes: dict[str, Outcome], case: Case) -> None:
    out = outcomes[case.id]
    assert not out.findings, f"{case.id}: " + "; ".join(out.findings)


if __name__ == "__main__":
    chosen = [c for c in CASES if len(sys.argv) < 2 or c.id in sys.argv[1:]]
    t = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        result = audit(chosen, Path(tmp))
    print(table(result))
    print(f"\n{figures(result)}; {time.monotonic() - t:.0f}s")
