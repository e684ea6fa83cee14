"""What fingerprinting a run's traffic costs the engine per request (client.fingerprint).

The engine counts each request written to the wire in two fingerprints, after its exchange
ended: an 8-byte digest of its body, and of what the client chose (a first turn: the body
with the salt cut out; a later turn: its own text). This times exactly that work
(``SessionRuns._fingerprint``) over real request bodies of a few sizes, and, for scale,
``build_body`` of the same request (the engine builds every body anyway) and one digest
of the whole body (what hashing every body whole would cost).

Run: ``python benchmarks/traffic_fingerprint.py [--repeat 20000]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from loadgen.client.fingerprint import digest  # noqa: E402
from loadgen.client.session_runs import SessionRuns, _Run  # noqa: E402
from loadgen.workload.base import SyntheticChat  # noqa: E402
from loadgen.workload.session import Conversation, Session, Turn, build_body  # noqa: E402


class _Host:
    """Just what ``_fingerprint`` touches of an engine."""

    def __init__(self) -> None:
        from loadgen.client.fingerprint import Traffic

        self.traffic = Traffic()


def _per_call_us(fn: Any, repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=20_000)
    args = p.parse_args()
    runs = SessionRuns(_Host(), {})  # type: ignore[arg-type]  # a stand-in engine: only .traffic is used
    print(f"{'request':36s} {'body':>9s} {'fingerprint':>12s} {'build_body':>11s} {'whole body':>11s}")
    for tokens in (128, 512, 2048, 8192):
        s = SyntheticChat(input_tokens=tokens, output_tokens=128, salt="ab12cd").session(7)
        _case(runs, s, 0, f"first turn, {tokens}-token prompt", args.repeat)
    long = Session(session=0, turns=(Turn("w " * 60, 64), Turn(" tool result" * 100, 64)), salt="")
    conv = Conversation(None)
    for _ in range(40):  # an agent's context after 40 turns
        conv.add_turn(long.turns[1])
        conv.add_answer(" answer" * 200)
    _case(runs, long, 1, "later turn, 40 turns of context", args.repeat, conv)


def _case(runs: SessionRuns, s: Session, k: int, label: str, repeat: int, conv: Conversation | None = None) -> None:
    turn = s.turns[k]
    if conv is None:
        conv = Conversation(s.system)
        conv.add_turn(turn)
    run = _Run(s, 0)
    body = build_body("chat", "model", conv, turn.max_tokens)
    fp = _per_call_us(lambda: runs._fingerprint(run, k, turn, conv, body), repeat)
    build = _per_call_us(lambda: build_body("chat", "model", conv, turn.max_tokens), max(repeat // 10, 100))
    whole = _per_call_us(lambda: digest(body), max(repeat // 10, 100))
    print(f"{label:36s} {len(body) / 1024:7.1f}KB {fp:10.2f}us {build:9.2f}us {whole:9.2f}us")


if __name__ == "__main__":
    main()
