"""What a seeded run sends is pinned to the byte: the hot-path work (issue 18) changed how the
request bodies and the records are built, never what they are.

The digests below were taken from the code before that work; a change to a body (a field's
order, a space, a prompt's words) fails here, however the bodies are now built.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from hashlib import sha256
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_wire import MS, Answer, FakeTransport, run

from loadgen.client.config import Plan
from loadgen.client.transport import Exchange
from loadgen.workload.base import SyntheticChat
from loadgen.workload.session import Conversation, Session, Turn, build_body


def _run_bodies(tmp_path: Path, plan: Plan, **config: Any) -> tuple[str, dict[str, Any]]:
    """The digest of every body a run sent (in request order) and its traffic fingerprints."""
    bodies: dict[int, bytes] = {}

    def answer(ex: Exchange) -> Answer:
        bodies[ex.seq] = bytes(ex.body)
        return Answer.tokens(3)

    _, _, engine = run(tmp_path, lambda clock: FakeTransport(clock, answer), plan, **config)
    h = sha256()
    for seq in sorted(bodies):
        h.update(b"%d:%d:" % (seq, len(bodies[seq])) + bodies[seq])
    return h.hexdigest()[:16], engine.traffic.health()


def _synthetic(n: int, **kw: Any) -> Plan:
    wl = SyntheticChat(**kw)
    offs = (np.arange(n, dtype=np.float64) * 5 * MS).astype(np.int64)
    return Plan(session=wl.session, offsets_ns=offs, indices=np.arange(n))


def test_a_seeded_synthetic_run_sends_the_same_bytes(tmp_path: Path) -> None:
    plan = _synthetic(12, input_tokens=512, output_tokens=16, seed=7, salt="p3")
    digest, traffic = _run_bodies(tmp_path, plan)
    assert digest == "885913d4f2d6bece"
    assert traffic == {
        "traffic_fingerprint": "c197517f75b28262",
        "traffic_fingerprint_unsalted": "06bb0dad28d412a2",
        "traffic_requests": 12,
    }


def test_a_run_with_every_body_option_sends_the_same_bytes(tmp_path: Path) -> None:
    plan = _synthetic(6, input_tokens=40, output_tokens=5, seed=3)
    extra = {"temperature": 0.5, "stream_options": {"continuous_usage_stats": False}}
    digest, _ = _run_bodies(
        tmp_path, plan, extra_body=extra, continuous_usage=True, max_tokens_field="both", ignore_eos=False
    )
    assert digest == "e503267765938a2f"
    (tmp_path / "c").mkdir()
    digest, _ = _run_bodies(tmp_path / "c", plan, api="completions")
    assert digest == "047ff5749264ceab"


def test_a_conversation_sends_the_same_bytes_turn_after_turn(tmp_path: Path) -> None:
    session = Session(
        session=0,
        system='You are terse. \u00e9\u4e2d "quoted" \\ back',
        turns=tuple(Turn(f"question {k} \u2603", 4, think_ns=MS) for k in range(3)),
    )
    plan = Plan(session=lambda i: session, offsets_ns=np.zeros(1, dtype=np.int64), indices=np.arange(1))
    digest, traffic = _run_bodies(tmp_path, plan)
    assert digest == "e781b459991bfe56"
    assert traffic == {
        "traffic_fingerprint": "3c7094a132d852de",
        "traffic_fingerprint_unsalted": "67e98afdf44d9ca2",
        "traffic_requests": 3,
    }


def _allocated(obj: object) -> int:
    """The bytes glibc's allocator holds for ``obj`` (its usable size), not its length."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc_usable_size.restype = ctypes.c_size_t
    libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
    return int(libc.malloc_usable_size(id(obj)))  # id: the object's address, in CPython


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="reads glibc's malloc_usable_size")
def test_a_body_holds_an_allocation_of_its_own_size() -> None:
    """orjson's bytes keep the buffer it grew (~32 KB for this body): a request must not."""
    conv = Conversation(None)
    conv.add_turn(Turn("w " * 1300, 128))
    body = build_body("chat", "m", conv, 128)
    assert type(body) is bytes and len(body) > 2600
    assert _allocated(body) < len(body) + 256
    assert body.startswith(b'{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":128')


def test_a_synthetic_prompt_is_its_window_of_words_however_it_is_cut() -> None:
    """The prompt text is cut out of blocks decoded once: windows inside one block, across
    blocks, longer than a block, and empty, all read as the window's words decoded."""
    from loadgen.workload.base import _BLOCK, _text, _window
    from loadgen.workload.tokenizer import BUILTIN

    for i in (0, 1, 5, 977, 2**40 + 3):
        for n in (0, 1, 63, 64, 512, _BLOCK + 5, 3 * _BLOCK):
            assert _text(11, i, n) == BUILTIN.decode_words(_window(11, i, n)), (i, n)
