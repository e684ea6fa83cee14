"""The traffic a run sent, as fingerprints: did two runs send the same requests?

Each request written to the wire adds an 8-byte digest (of SHA-256) to a sum modulo 2**64.
A sum is order-independent (it fingerprints the multiset of requests), so the fingerprint
does not depend on which request went first, on how requests were numbered, or on how the
schedule was split over worker processes: shards merge by adding (``merge_traffic``). A
request number is deliberately left out of what is hashed: it is given in the order
requests are sent, which for sessions of several turns depends on how fast the server
answered, not on what was sent.

Two fingerprints, because two runs of the same workload differ in two ways that say nothing
about the traffic the client chose:

- ``traffic_fingerprint``: the request bodies exactly as sent (``stream_options`` aside, see
  below). Equal only for a replay with the same salt (and, for sessions of several turns, the
  same answers).
- ``traffic_fingerprint_unsalted``: the traffic the client chose. A session's first
  request counts as its body with the run's salt and the model name cut out (the salt is a known string at the
  start of the session's context, found once, JSON-escaped as the body has it); a later
  turn counts as what the client added to the conversation (its text and ``max_tokens``,
  keyed by the session's first request), not the server's earlier answers that its body
  repeats. Two runs with different salts, or against servers that answered differently,
  that sent the same workload at the same settings have equal ones.

Both leave a body's ``stream_options`` out (``without_stream_options``): it asks how the answer's
token counts are reported (``include_usage``, ``continuous_usage_stats`` where the endpoint offers
per-chunk usage), not what is generated, so a run that asked for per-chunk usage and one that did
not sent the same traffic, and compare says so.

A request's exact digest is a function of exactly its body, without hashing every body
whole: a first request's is that of its salt-free body, its salt and where the salt was
(``first_request``: one pass over the body gives both digests); a later turn's body is
the previous request's body with the answer and the new message appended (and its own
``max_tokens``), so its digest chains the previous one's with those (``later_request``).
Hashing each turn's growing context whole would cost a session quadratic time (0.2-0.5 ms
for one 100 KB agent context here); this costs each request only its new bytes, after its
exchange ended, never between its instant and its write (benchmarks/traffic_fingerprint.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from hashlib import sha256
from typing import Any

__all__ = ["Traffic", "digest", "first_request", "later_request", "merge_traffic", "without_stream_options", "KEYS"]

_MASK = (1 << 64) - 1
KEYS = ("traffic_fingerprint", "traffic_fingerprint_unsalted", "traffic_requests")


def digest(data: bytes) -> int:
    """The first 8 bytes of ``data``'s SHA-256, as an integer. (SHA-256 rather than BLAKE2b:
    CPUs with SHA extensions, most x86 and ARM servers now, hash 2.5x faster with it; here
    a 2.6 KB body took 5 us against 14.)"""
    return int.from_bytes(sha256(data).digest()[:8], "little")


def without_stream_options(body: bytes) -> bytes:
    """``body`` (compact JSON, as ``build_body`` writes it) without its ``"stream_options"`` member.

    The first ``"stream_options":`` in the bytes is the top-level key: those bytes cannot occur
    inside a JSON string (its quotes would be escaped), and ``build_body`` puts the member third,
    after ``model`` and ``stream``, so no earlier value can hold such a key."""
    at = body.find(_STREAM_OPTIONS)
    if at < 0:
        return body
    i = at + len(_STREAM_OPTIONS)
    for known in _BUILT:  # what build_body writes, nearly always: no scan (~5 us a request)
        if body.startswith(known, i):
            end = i + len(known)
            break
    else:
        end = _value_end(body, i)
    if body[end : end + 1] == b",":
        end += 1  # the comma after it goes with it...
    elif body[at - 1 : at] == b",":
        at -= 1  # ...or, for the last member, the one before
    return body[:at] + body[end:]


_STREAM_OPTIONS = b'"stream_options":'
# The stream_options objects build_body writes: each a whole JSON object, so one that starts
# the value is the value (what _value_end would find).
_BUILT = (b'{"include_usage":true}', b'{"include_usage":true,"continuous_usage_stats":true}')


def _value_end(body: bytes, i: int) -> int:
    """Where the JSON value that starts at ``body[i]`` ends (one past it): an object or array up
    to its closing bracket (strings inside skipped, escapes honoured), else up to the next
    ``,``, ``}`` or ``]``. A value a few dozen bytes long: a loop over it costs nothing."""
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(body)):
        c = body[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:  # quote
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x7B, 0x5B):  # { [
            depth += 1
        elif c in (0x7D, 0x5D):  # } ]
            if depth == 0:
                return j  # the end of the enclosing object: a scalar value ended here
            depth -= 1
            if depth == 0:
                return j + 1
        elif c == 0x2C and depth == 0:  # ,
            return j
    return len(body)


def first_request(body: bytes, salt: bytes, model: bytes = b"") -> tuple[int, int]:
    """(exact, salt-free) digests of a session's first request; ``salt`` is the salt's
    JSON-escaped bytes, cut out where it first occurs. ``model`` (its JSON string, quotes
    included) is left out of the salt-free digest too: two vendors serve one model under
    their own names, and the name is not traffic the client chose. Neither digest sees the
    body's ``stream_options`` (``without_stream_options``)."""
    body = without_stream_options(body)
    at = body.find(salt) if salt else -1
    chosen = body if at < 0 else body[:at] + body[at + len(salt) :]
    if model:
        chosen = chosen.replace(b'"model":' + model, b'"model":', 1)
    unsalted = digest(chosen)
    if at < 0:
        return digest(body), unsalted
    return digest(b"%d|%d|" % (digest(body[:at] + body[at + len(salt) :]), at) + salt), unsalted


def later_request(previous: int, first: int, turn: int, max_tokens: int, answer: str, text: str) -> tuple[int, int]:
    """(exact, salt-free) digests of turn ``turn`` > 0 of a session: ``previous`` is the exact
    digest of the session's previous request, ``first`` the salt-free one of its first;
    ``answer`` the previous answer its body repeats, ``text`` the message it adds."""
    head = b"%d|%d|" % (turn, max_tokens)
    added = text.encode()
    exact = digest(b"%d|" % previous + head + answer.encode() + b"|" + added)
    return exact, digest(b"%d|" % first + head + added)


class Traffic:
    """The running fingerprints of one engine's requests."""

    __slots__ = ("sent", "unsalted", "requests")

    def __init__(self) -> None:
        self.sent = 0
        self.unsalted = 0
        self.requests = 0

    def add(self, exact: int, unsalted: int) -> None:
        """Count one request by its two digests."""
        self.sent = (self.sent + exact) & _MASK
        self.unsalted = (self.unsalted + unsalted) & _MASK
        self.requests += 1

    def health(self) -> dict[str, Any]:
        """For the run's client health (run.json ``client``)."""
        return {
            "traffic_fingerprint": f"{self.sent:016x}",
            "traffic_fingerprint_unsalted": f"{self.unsalted:016x}",
            "traffic_requests": self.requests,
        }


def merge_traffic(clients: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The fingerprints of a run sent by several worker processes: the sums of theirs. When a
    worker did not report its own (it crashed), the run's traffic is unknown: null fingerprints."""
    if not clients or any(not all(k in c for k in KEYS) for c in clients):
        return {
            "traffic_fingerprint": None,
            "traffic_fingerprint_unsalted": None,
            "traffic_requests": sum(int(c.get("traffic_requests", 0)) for c in clients),
        }
    return {
        "traffic_fingerprint": f"{sum(int(c['traffic_fingerprint'], 16) for c in clients) & _MASK:016x}",
        "traffic_fingerprint_unsalted": (
            f"{sum(int(c['traffic_fingerprint_unsalted'], 16) for c in clients) & _MASK:016x}"
        ),
        "traffic_requests": sum(int(c["traffic_requests"]) for c in clients),
    }
