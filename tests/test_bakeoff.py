"""Fair bake-offs: a fresh salt per run, warm prefix caches detected, and traffic fingerprinted.

A rerun against the same server must not silently gain from the earlier run's prefix cache:
each run salts its prompts afresh (``--salt S`` replays, ``--salt none`` opts out), a cached
fraction above what the workload's own reuse allows is ``cache_warm``, and two runs saw the
same traffic when their salt-free fingerprints agree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from fake_wire import MS, Answer, FakeTransport, Read, run, tail

from loadgen.analysis.prompt_cache import cache_warmth
from loadgen.client.config import Plan
from loadgen.client.fingerprint import Traffic, digest, first_request, later_request, merge_traffic
from loadgen.errors import ConfigError
from loadgen.records import SCHEMA, read_records
from loadgen.workload.base import Workload
from loadgen.workload.load import load_workload
from loadgen.workload.reuse import Reuse, predict_reuse, sent_sessions
from loadgen.workload.salt import Salt, resolve_salt, salt_of
from loadgen.workload.session import Session, Turn

CHAT = """\
kind: chat
system: 48
turns: {turns}
input: 24
output: 3
"""


def chat(tmp_path: Path, salt: str = "", seed: int = 0, turns: int = 1) -> Workload:
    path = tmp_path / f"chat{turns}.yaml"
    path.write_text(CHAT.format(turns=turns))
    return load_workload(str(path), seed=seed, salt=salt)


def prompt(s: Session) -> str:
    """A session's first request's context: its system prompt and first message."""
    return (s.system or "") + s.turns[0].text


# --------------------------------------------------------------------------- the salt


@pytest.mark.parametrize(
    ("value", "text", "source"),
    [("ab12cd", "ab12cd", "given"), ("none", "", "off"), ("OFF", "", "off"), ("p0", "p0", "given")],
)
def test_a_given_salt_is_replayed_and_none_turns_salting_off(value: str, text: str, source: str) -> None:
    salt = resolve_salt(value)
    assert (salt.text, salt.source) == (text, source)
    assert salt.json() == {"salt": text or None, "salt_source": source}


def test_a_workload_built_by_its_caller_records_its_own_salt(tmp_path: Path) -> None:
    assert salt_of(chat(tmp_path, "ab12cd").describe()) == Salt("ab12cd", "given")
    assert salt_of(chat(tmp_path).describe()) == Salt("", "off")


def test_without_a_salt_each_run_draws_a_fresh_one() -> None:
    drawn = {resolve_salt(None).text for _ in range(20)}
    assert len(drawn) == 20
    assert all(len(s) == 6 and int(s, 16) >= 0 for s in drawn)
    assert resolve_salt(None).source == "fresh"


@pytest.mark.parametrize("bad", ["", "two words", "x" * 33, "über", "a\nb"])
def test_a_salt_that_would_not_be_one_word_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="--salt"):
        resolve_salt(bad)


def test_the_same_salt_gives_the_same_bytes_and_another_salt_other_prompts(tmp_path: Path) -> None:
    a, again, b = chat(tmp_path, "ab12cd"), chat(tmp_path, "ab12cd"), chat(tmp_path, "ff00ee")
    for i in range(5):
        assert a.session(i) == again.session(i)
        assert prompt(a.session(i))[:20] != prompt(b.session(i))[:20]


def test_the_salt_is_a_common_prefix_so_the_runs_own_sharing_is_kept(tmp_path: Path) -> None:
    bare, salted = chat(tmp_path), chat(tmp_path, "ab12cd")
    salt = salted.session(0).salt
    assert salt and bare.session(0).salt == ""
    systems = {salted.session(i).system for i in range(6)}
    assert len(systems) == 1  # every session of the run still shares its system prompt
    for i in range(6):
        s = salted.session(i)
        assert s.salt == salt and prompt(s).startswith(salt)
        assert prompt(s)[len(salt) :] == prompt(bare.session(i))


# --------------------------------------------------------------------------- the workload's own reuse


def test_distinct_prompts_predict_no_reuse() -> None:
    from loadgen.workload.base import SyntheticChat

    r = predict_reuse(SyntheticChat(input_tokens=64, salt="ab12cd"), range(50))
    assert (r.requests, r.prompt_tokens, r.reusable_tokens, r.fraction) == (50, 64 * 50, 0, 0.0)


def test_a_shared_system_prompt_predicts_its_share_except_for_the_first_request(tmp_path: Path) -> None:
    w = chat(tmp_path, "ab12cd")
    one = predict_reuse(w, [0])
    assert one.reusable_tokens == 0  # the first request of a shared prefix cannot be cached
    n = 40
    r = predict_reuse(w, range(n))
    system = 48 + 4  # the system prompt and the salt before it
    # whole 64-character blocks of the shared part, in every request but the first
    assert 0.7 * system * (n - 1) < r.reusable_tokens <= system * (n - 1) + 16 * n
    assert r.fraction == pytest.approx(r.reusable_tokens / (n * (system + 24)))


def test_a_later_turn_may_reuse_the_previous_prompt_and_answer(tmp_path: Path) -> None:
    w = chat(tmp_path, turns=3)
    s = w.session(0)
    r = predict_reuse(w, [0])
    (t0, t1, t2) = s.turns
    assert r.requests == 3
    assert r.reusable_tokens == (t0.prompt_tokens + t0.max_tokens) + (t1.prompt_tokens + t1.max_tokens)


def test_the_same_prompt_again_is_all_reusable() -> None:
    same = Session(session=0, turns=(Turn("word " * 100, 4, prompt_tokens=100),))

    class Twice:
        name, size = "twice", None

        def session(self, i: int) -> Session:
            return same

        def offsets_ns(self) -> None:
            return None

        def describe(self) -> dict[str, Any]:
            return {}

    r = predict_reuse(Twice(), [0, 1, 1, 2])  # a session id twice is one session
    assert (r.sessions, r.requests, r.reusable_tokens) == (3, 3, 200)
    assert Reuse.from_json(r.json()) == r
    assert Reuse.from_json({"sessions": "x"}) is None and Reuse.from_json(None) is None


# --------------------------------------------------------------------------- warmth


def table(prompt_tokens: list[int], cached: Sequence[int | None], requested: list[int] | None = None) -> pa.Table:
    n = len(prompt_tokens)
    cols: dict[str, Any] = {
        "session": list(range(n)),
        "t_sched": [i * MS for i in range(n)],
        "t_sent": [i * MS for i in range(n)],
        "t_first": [
            (i + (5 if c and c > p // 2 else 25)) * MS
            for i, (p, c) in enumerate(zip(prompt_tokens, cached, strict=True))
        ],
        "status": ["ok"] * n,
        "prompt_tokens_reported": prompt_tokens,
        "prompt_tokens_requested": requested if requested is not None else prompt_tokens,
        "cached_tokens": cached,
    }
    return pa.table({k: pa.array(v, type=SCHEMA.field(k).type) for k, v in cols.items()})


CHAT_REUSE = Reuse(sessions=100, sessions_sent=100, requests=100, prompt_tokens=10_000, reusable_tokens=1_200)


def test_a_cold_run_within_its_own_reuse_is_not_warm() -> None:
    w = cache_warmth(table([100] * 100, [0] + [10] * 99), CHAT_REUSE, salt="ab12cd", salt_source="fresh")
    assert not w.warm and w.message is None
    assert w.observed == pytest.approx(0.099) and w.predicted == pytest.approx(0.12)


def test_a_run_served_from_an_earlier_runs_cache_is_warm() -> None:
    w = cache_warmth(table([100] * 100, [61] * 100), CHAT_REUSE, salt="ab12cd", salt_source="given")
    assert w.warm and w.code == "cache_warm"
    assert w.message is not None and w.message.startswith(
        "61% of prompt tokens were served from cache; this workload's own reuse predicts at most 12%: "
        "an earlier run warmed the server's prefix cache"
    )
    assert "replayed salt ab12cd" in w.message
    off = cache_warmth(table([100] * 100, [61] * 100), CHAT_REUSE, salt_source="off")
    assert off.message is not None and "--salt none" in off.message


def test_template_tokens_the_workload_did_not_ask_for_are_allowed() -> None:
    # 100 tokens asked, 130 reported: up to 30 of each may be a chat template every request shares
    w = cache_warmth(table([130] * 100, [45] * 100, requested=[100] * 100), CHAT_REUSE)
    assert w.allowance == pytest.approx(30 / 130) and not w.warm
    assert cache_warmth(table([130] * 100, [100] * 100, requested=[100] * 100), CHAT_REUSE).warm


@pytest.mark.parametrize(
    ("cached", "reuse"),
    [([None] * 10, CHAT_REUSE), ([90] * 10, None)],
    ids=["no-request-reported-cached-tokens", "no-prediction"],
)
def test_warmth_is_not_claimed_without_evidence(cached: list[int | None], reuse: Reuse | None) -> None:
    w = cache_warmth(table([100] * 10, cached), reuse)
    assert not w.warm and w.message is None


def test_the_prediction_may_come_from_run_json() -> None:
    meta: dict[str, Any] = {"prefix_reuse": CHAT_REUSE.json(), "salt": "ab12cd", "salt_source": "fresh"}
    w = cache_warmth(table([100] * 20, [97] * 20), meta["prefix_reuse"], salt=meta["salt"], salt_source="fresh")
    assert w.warm and w.message is not None and "fresh salt (ab12cd)" in w.message


# --------------------------------------------------------------------------- traffic fingerprints


def test_fingerprints_do_not_depend_on_order_and_shards_merge_by_adding() -> None:
    digests = [digest(b'{"n":%d}' % i) for i in range(10)]
    whole, backwards, shards = Traffic(), Traffic(), [Traffic(), Traffic(), Traffic()]
    for i, d in enumerate(digests):
        whole.add(d, d ^ 1)
        shards[i % 3].add(d, d ^ 1)
    for d in reversed(digests):
        backwards.add(d, d ^ 1)
    assert whole.health() == backwards.health() == merge_traffic([s.health() for s in shards])
    assert whole.health()["traffic_requests"] == 10
    crashed = merge_traffic([shards[0].health(), {"shard": 1, "crashed": True, "records": 0}])
    assert crashed["traffic_fingerprint"] is None and crashed["traffic_requests"] == 4


def _body(content: str) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})


@pytest.mark.parametrize("salt", ["ab12cd", 'a "quoted"\tsalt'])
def test_a_first_request_without_its_salt_is_the_same_request(salt: str) -> None:
    escaped = orjson.dumps(salt)[1:-1]  # as the body has it
    exact, unsalted = first_request(_body(salt + " rest"), escaped)
    bare_exact, bare = first_request(_body(" rest"), b"")
    assert unsalted == bare == bare_exact  # unsalted, both digests are the body's
    assert exact != unsalted
    other_exact, other = first_request(_body("ffee00 rest"), b"ffee00")
    assert other == unsalted and other_exact != exact
    assert first_request(_body("ab12cd rest"), b"")[0] == digest(_body("ab12cd rest"))


def test_a_later_turn_chains_the_answers_into_its_exact_digest_only() -> None:
    first = first_request(_body("question"), b"")
    yes = later_request(first[0], first[1], 1, 16, "yes", "and then?")
    no = later_request(first[0], first[1], 1, 16, "no", "and then?")
    assert yes[1] == no[1] and yes[0] != no[0]  # the server's answers are not the client's traffic
    assert later_request(first[0], first[1], 1, 16, "yes", "and now?")[1] != yes[1]
    assert later_request(first[0], first[1], 1, 32, "yes", "and then?")[1] != yes[1]


def _answers(word: str) -> Any:
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"%s "}}]}\n\n' % word.encode()
    return lambda ex: Answer(head_ms=5, reads=[Read(0.0, chunk), Read(1.0, chunk), Read(1.0, tail(2))])


def _traffic(tmp_path: Path, workload: Workload, answer_word: str = "yes", n: int = 4) -> dict[str, Any]:
    offs = (np.arange(n) * 50 * MS).astype(np.int64)
    plan = Plan(session=workload.session, offsets_ns=offs, indices=np.arange(n))
    rec, wire, engine = run(tmp_path, lambda c: FakeTransport(c, _answers(answer_word)), plan)
    health = engine.traffic.health()
    assert health["traffic_requests"] == len(wire.wrote) == sum(t is not None for t in rec["t_sent"])
    return health


def test_runs_with_other_salts_and_answers_saw_the_same_traffic_and_other_seeds_did_not(tmp_path: Path) -> None:
    a = _traffic(tmp_path, chat(tmp_path, "aaaaaa", turns=3))
    again = _traffic(tmp_path, chat(tmp_path, "aaaaaa", turns=3))
    other_salt = _traffic(tmp_path, chat(tmp_path, "bbbbbb", turns=3))
    answered_otherwise = _traffic(tmp_path, chat(tmp_path, "aaaaaa", turns=3), answer_word="no")
    other_seed = _traffic(tmp_path, chat(tmp_path, "aaaaaa", seed=1, turns=3))
    assert a["traffic_requests"] == 12 and a == again  # a replay: byte-identical
    for twin in (other_salt, answered_otherwise):  # the client chose the same traffic
        assert twin["traffic_fingerprint_unsalted"] == a["traffic_fingerprint_unsalted"]
        assert twin["traffic_fingerprint"] != a["traffic_fingerprint"]
    assert other_seed["traffic_fingerprint_unsalted"] != a["traffic_fingerprint_unsalted"]


# --------------------------------------------------------------------------- on the simulator


@contextmanager
def prefix_caching_sim() -> Iterator[str]:
    """The roofline simulator (with its prefix cache), served from a thread on loopback."""
    from loadgen.sim.roofline import RooflineModel
    from loadgen.sim.server import SimServer
    from loadgen.sim.thread import serve_in_thread

    with serve_in_thread(SimServer(RooflineModel("h100", "llama-3.1-8b"))) as url:
        yield url


SHARED_SYSTEM = """\
kind: chat
system: 192
input: 64
output: 4
"""


def _sim_run(url: str, out: Path, workload: Workload, salt: str) -> Any:
    from loadgen.client.run import execute
    from loadgen.client.settings import RunSettings
    from loadgen.schedule import Arrival

    settings = RunSettings(
        endpoint=url, model="sim", arrival=Arrival("constant", rate=50.0), duration_s=None, requests=25, drain_s=10.0
    )
    execute(settings, workload, out)
    records = read_records(out)
    return cache_warmth(records, predict_reuse(workload, sent_sessions(records)), salt=salt, salt_source="given")


def test_a_rerun_with_the_same_salt_is_flagged_warm_and_one_with_a_fresh_salt_is_not(tmp_path: Path) -> None:
    from loadgen.workload.base import SyntheticChat

    def synthetic(salt: str) -> Workload:
        return SyntheticChat(input_tokens=256, output_tokens=4, seed=0, salt=salt)

    fresh_salt = resolve_salt(None).text
    with prefix_caching_sim() as url:
        first = _sim_run(url, tmp_path / "first", synthetic("ab12cd"), "ab12cd")
        rerun = _sim_run(url, tmp_path / "rerun", synthetic("ab12cd"), "ab12cd")
        fresh = _sim_run(url, tmp_path / "fresh", synthetic(fresh_salt), fresh_salt)
    assert first.requests == 25 and first.predicted == 0.0
    assert not first.warm and first.observed is not None and first.observed < 0.05
    assert rerun.warm and rerun.observed is not None and rerun.observed > 0.9, rerun
    assert rerun.message is not None and "replayed salt ab12cd" in rerun.message
    assert not fresh.warm and fresh.observed is not None and fresh.observed < 0.05


def test_a_runs_own_shared_system_prompt_is_cached_and_not_mistaken_for_warmth(tmp_path: Path) -> None:
    spec = tmp_path / "shared.yaml"
    spec.write_text(SHARED_SYSTEM)
    with prefix_caching_sim() as url:
        first = _sim_run(url, tmp_path / "first", load_workload(str(spec), salt="ab12cd"), "ab12cd")
        rerun = _sim_run(url, tmp_path / "rerun", load_workload(str(spec), salt="ab12cd"), "ab12cd")
        other = _sim_run(url, tmp_path / "other", load_workload(str(spec), salt="ffee00"), "ffee00")
    # the salt and system prompt (196 of 260 tokens) can be cached from the second request on: 72%,
    # and up to a block more where the first request's text parts from the second's
    for cold in (first, other):
        assert cold.predicted is not None and 0.72 < cold.predicted < 0.8
        assert cold.observed is not None and 0.5 < cold.observed <= cold.predicted and not cold.warm, cold
    assert rerun.warm and rerun.observed is not None and rerun.observed > 0.9, rerun


def test_the_salt_free_fingerprint_leaves_out_the_model_name() -> None:
    """Two vendors serving one model under their own names were sent the same traffic."""
    from loadgen.client.fingerprint import first_request

    def body(model: str, salt: str) -> bytes:
        return b'{"model":"%s","messages":[{"role":"user","content":"%s hello"}]}' % (model.encode(), salt.encode())

    a = first_request(body("llama-8b", "ab12cd"), b"ab12cd", b'"llama-8b"')
    b = first_request(body("meta/Llama-3.1-8B", "ff00ee"), b"ff00ee", b'"meta/Llama-3.1-8B"')
    assert a[1] == b[1] and a[0] != b[0]
    c = first_request(body("llama-8b", "ab12cd").replace(b"hello", b"bye"), b"ab12cd", b'"llama-8b"')
    assert c[1] != a[1]  # what the client chose still counts
