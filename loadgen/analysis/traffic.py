"""Whether the runs of a bake-off sent the same traffic, and what differs where they did not.

Two kinds of evidence, the stronger preferred:
- a **fingerprint** of the request bytes, which the client records in run.json's ``client``
  block (a sweep's: each point's). ``traffic_fingerprint_unsalted`` leaves the per-run prompt
  salt out, so runs with different salts (the norm: a salt keeps one run from warming the
  next one's prefix cache) still compare; ``traffic_fingerprint`` includes the salt and so
  compares only runs with the same salt. Equal fingerprints at every part (the run, or each
  sweep point) prove the same requests were sent; different ones prove they were not, unless
  the runs asked for different models: each request body names its model, so a bake-off of
  two servers that name one model differently has different fingerprints by design, and
  there they prove nothing.
- the **settings** that decide the requests: the workload (without its salt), the seed, the
  API and ignore_eos. Equal settings make the same traffic likely but do not prove it
  (``identical`` is None then: a workload may read a file that changed).

Everything read here comes from run folders: every value shown is ``clean_text``'d.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loadgen.analysis.points import RunAnalysis
from loadgen.analysis.validity import VALID, Caveat, Validity
from loadgen.untrusted import clean_text

__all__ = [
    "SAME_TRAFFIC",
    "FINGERPRINT_KEYS",
    "TrafficCheck",
    "check_traffic",
    "fingerprints",
    "settings_differences",
    "workload_key",
    "traffic_mismatches",
]

SAME_TRAFFIC = ("seed", "api", "ignore_eos")  # run.json settings that change the requests sent
FINGERPRINT_KEYS = ("traffic_fingerprint_unsalted", "traffic_fingerprint")  # preferred first
_SHOWN = 8  # hex digits of a fingerprint shown in a line (the JSON holds it whole)


class Named(Protocol):
    """A run as compare holds it: its name and its analysis."""

    @property
    def name(self) -> str: ...

    @property
    def analysis(self) -> RunAnalysis: ...


@dataclass(frozen=True)
class TrafficCheck:
    """Whether every run sent the same requests: ``identical`` True (proven by fingerprints),
    False (fingerprints or settings differ), None (the settings agree, no fingerprint proves it).
    ``basis``: the evidence ("traffic_fingerprint_unsalted", "traffic_fingerprint", "settings");
    ``line``: one line for the terminal; ``differences``: what differs, run pair by run pair."""

    identical: bool | None
    basis: str
    line: str
    fingerprint: str | None = None  # the first part's, when fingerprints proved the traffic the same
    differences: tuple[str, ...] = ()
    validity: Validity = VALID  # traffic_differs when the runs did not send the same requests


def _text(v: object) -> str:
    return "-" if v is None else clean_text(v, 60)


def workload_key(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The workload as run.json describes it, without its salt (per run or per point: expected
    to differ between runs, and the unsalted fingerprint leaves it out too)."""
    w = meta.get("workload")
    out = dict(w) if isinstance(w, Mapping) else {}
    out.pop("salt", None)
    return out


def _settings(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    s = meta.get("settings")
    return s if isinstance(s, Mapping) else {}


def settings_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two run.json dicts in what decides the requests, as "seed 1 vs 2"
    (the salt aside: run.json's ``salt`` and the workload's are expected to differ)."""
    out: list[str] = []
    sa, sb = _settings(a), _settings(b)
    for k in SAME_TRAFFIC:
        if sa.get(k) != sb.get(k):
            out.append(f"{k} {_text(sa.get(k))} vs {_text(sb.get(k))}")
    wa, wb = workload_key(a), workload_key(b)
    for k in sorted(set(wa) | set(wb), key=str):
        if wa.get(k) != wb.get(k):
            line = f"{_text(k)} {_text(wa.get(k))} vs {_text(wb.get(k))}"
            shown = line if k in SAME_TRAFFIC else f"workload {line}"
            if shown not in out:
                out.append(shown)
    return out


def fingerprints(meta: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    """The fingerprint under ``key`` of each part of a run (its client, or each sweep point's),
    None when any part lacks one."""
    points = meta.get("points")
    parts = points if isinstance(points, list) and points else [meta]
    out = []
    for part in parts:
        client = part.get("client") if isinstance(part, Mapping) else None
        fp = client.get(key) if isinstance(client, Mapping) else None
        if not isinstance(fp, str) or not fp:
            return None
        out.append(clean_text(fp, 128))
    return tuple(out)


def _salt(meta: Mapping[str, Any]) -> object:
    w = meta.get("workload")
    return meta.get("salt", w.get("salt") if isinstance(w, Mapping) else None)


def _requests(meta: Mapping[str, Any]) -> int | None:
    """How many requests the fingerprints count (``traffic_requests``, summed over a sweep's points)."""
    points = meta.get("points")
    parts = points if isinstance(points, list) and points else [meta]
    total = 0
    for part in parts:
        client = part.get("client") if isinstance(part, Mapping) else None
        n = client.get("traffic_requests") if isinstance(client, Mapping) else None
        if type(n) is not int:
            return None
        total += n
    return total


def _pair(a: Named, b: Named) -> tuple[bool | None, str, str, tuple[str, ...] | None]:
    """(identical, basis, what differs or "", the fingerprints that decided) for two runs."""
    ma, mb = a.analysis.meta, b.analysis.meta
    diffs = settings_differences(ma, mb)
    for key in FINGERPRINT_KEYS:
        fa, fb = fingerprints(ma, key), fingerprints(mb, key)
        if fa is None or fb is None or len(fa) != len(fb):
            continue
        if key == "traffic_fingerprint" and _salt(ma) != _salt(mb):
            continue  # the salted fingerprints of differently salted runs differ by design
        if fa == fb:
            return True, key, "", fa
        if ma.get("model") != mb.get("model"):
            continue  # each request body names its model: the bytes differ whatever else was the same
        at = next(i for i, (x, y) in enumerate(zip(fa, fb, strict=True)) if x != y)
        where = f"point {at} " if len(fa) > 1 else ""
        why = f"{where}request fingerprint {fa[at][:_SHOWN]}… vs {fb[at][:_SHOWN]}…"
        na, nb = _requests(ma), _requests(mb)
        if na is not None and nb is not None and na != nb:
            why += f" ({na} vs {nb} requests sent)"
        return False, key, "; ".join([why, *diffs]), None
    if diffs:
        return False, "settings", "; ".join(diffs), None
    return None, "settings", "", None


def check_traffic(sides: Sequence[Named]) -> TrafficCheck:
    """Whether every run sent the first run's traffic (each compared with the first)."""
    pairs = [(other.name, *_pair(sides[0], other)) for other in sides[1:]]
    differ = [(name, why) for name, same, _, why, _ in pairs if same is False]
    if differ:
        basis = next(b for _, same, b, _, _ in pairs if same is False)
        many = len(sides) > 2
        line = "; ".join(f"{sides[0].name} vs {name}: {why}" if many else why for name, why in differ)
        caveats = [
            Caveat("traffic_differs", f"{sides[0].name} and {name} sent different traffic ({why})")
            for name, why in differ
        ]
        validity = Validity("suspect", ("traffic_differs",), ("; ".join(c.message for c in caveats),))
        pairs_why = tuple(f"{sides[0].name} vs {name}: {why}" for name, why in differ)
        return TrafficCheck(False, basis, f"traffic differs: {line}", None, pairs_why, validity)
    if pairs and all(same for _, same, _, _, _ in pairs):
        fps = pairs[0][4] or ()
        basis = pairs[0][2] if len({b for _, _, b, _, _ in pairs}) == 1 else "fingerprints"
        first = fps[0] if fps else None
        if len(fps) > 1:
            line = f"same traffic (fingerprints match at all {len(fps)} points; first {(first or '')[:_SHOWN]}…)"
        else:
            line = f"same traffic (fingerprint {(first or '')[:_SHOWN]}…)"
        return TrafficCheck(True, basis, line, first)
    models = list(dict.fromkeys(_text(s.analysis.meta.get("model")) for s in sides))
    fingerprinted = all(fingerprints(s.analysis.meta, FINGERPRINT_KEYS[0]) for s in sides)
    if len(models) > 1 and fingerprinted:
        proof = f"request fingerprints cannot prove it: each request names its model ({' vs '.join(models)})"
    else:
        proof = "no request fingerprint in both runs to prove it"
    return TrafficCheck(None, "settings", f"same traffic settings (workload, seed, API, ignore_eos); {proof}")


# --------------------------------------------------------------------------- warnings


def _points_key(a: RunAnalysis) -> list[str]:
    sweep = a.meta.get("sweep")
    auto = isinstance(sweep, Mapping) and sweep.get("mode") == "auto"
    return ["auto"] if auto else [p.short_label for p in a.points]


def traffic_mismatches(sides: Sequence[Named]) -> list[str]:
    """Differences in what was sent or how it was loaded; each makes a head-to-head comparison
    less fair (shown as warnings; ``check_traffic`` decides whether a winner may be named)."""
    out = []
    ref = sides[0]
    for other in sides[1:]:
        a, b = ref.analysis.meta, other.analysis.meta
        pair = f"{ref.name} and {other.name}"
        wa, wb = workload_key(a), workload_key(b)
        if wa != wb:
            keys = sorted(_text(k) for k in set(wa) | set(wb) if wa.get(k) != wb.get(k))
            out.append(f"{pair} ran different workloads (differ in: {', '.join(keys)})")
        sa, sb = _settings(a), _settings(b)
        for k in SAME_TRAFFIC:
            if sa.get(k) != sb.get(k):
                out.append(f"{pair} differ in {k}: {_text(sa.get(k))} vs {_text(sb.get(k))}")
        if sa.get("extra_body") != sb.get("extra_body"):
            out.append(f"{pair} sent different --extra-body fields (check they are equivalent)")
        if _points_key(ref.analysis) != _points_key(other.analysis):
            out.append(f"{pair} have different load points; only matching loads are compared point by point")
        swa, swb = a.get("sweep"), b.get("sweep")
        salt_a = swa.get("point_salt") if isinstance(swa, Mapping) else None
        salt_b = swb.get("point_salt") if isinstance(swb, Mapping) else None
        if salt_a != salt_b:
            out.append(f"{pair} differ in per-point prompt salting ({_text(salt_a)} vs {_text(salt_b)})")
    return out
