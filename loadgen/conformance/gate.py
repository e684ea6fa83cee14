"""``loadgen gate``: judge a run folder against an SLO profile, and against a baseline run.

Every criterion of the profile is measured at the load points it applies to
(``samples``) with one-sided confidence bounds (``bounds``, which also says why a
verdict needs them); this module turns those into PASS / FAIL / INCONCLUSIVE
cases with their reasons, adds the baseline comparison, and gives the exit code.

Validity is checked before a verdict stands: a PASS or FAIL decided on a suspect point
(client lag, client CPU, an interrupted run, a late simulator, degraded records; DESIGN.md,
"validity is data") becomes INCONCLUSIVE with the reason, and so does a baseline
comparison whose baseline point is suspect. ``few_samples`` is left to the gate's own
sample rules (each bound, and the profile's ``min_samples``). An interrupted run is named
on the first line of the output.

Everything here is a pure function of the records; only ``gate_run`` reads files.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from loadgen.analysis.traffic import workload_key
from loadgen.analysis.validity import (
    Caveat,
    Validity,
    interruption,
    point_caveats,
    run_caveats,
)
from loadgen.conformance.bounds import (
    Measurement,
    compare,
    fmt_num,
    fmt_pct,
    measure,
    verdict,
)
from loadgen.conformance.ci_outputs import Case, Outcome, overall_status
from loadgen.conformance.samples import Point, load_points, select
from loadgen.conformance.slo import Criterion, Profile
from loadgen.errors import ConfigError
from loadgen.redaction import Secrets
from loadgen.workload.pooled import POOLED_APIS

__all__ = [
    "EXIT_PASS",
    "EXIT_FAIL",
    "EXIT_USAGE",
    "EXIT_INCONCLUSIVE",
    "Judgement",
    "judge",
    "gate_run",
    "exit_code",
    "parse_tolerance",
]

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3
_NAN = math.nan
# what only a streamed answer has: undefined for an embeddings or rerank run
TOKEN_METRICS = ("ttft", "ttft_sent", "tpot", "itl", "icl", "per_user_tps", "output_tps")


def exit_code(status: str, inconclusive: str | None = None) -> int:
    """0 pass, 1 fail, 3 inconclusive (or as ``inconclusive`` = "pass" / "fail" maps it)."""
    if status == "fail":
        return EXIT_FAIL
    if status == "inconclusive":
        return {"pass": EXIT_PASS, "fail": EXIT_FAIL}.get(inconclusive or "", EXIT_INCONCLUSIVE)
    return EXIT_PASS


def parse_tolerance(text: str) -> float:
    """``"5%"`` or ``"5"`` -> 0.05 (always percent)."""
    s = str(text).strip().removesuffix("%").strip()
    try:
        v = float(s) / 100.0
    except ValueError:
        raise ConfigError(f"--tolerance {text!r}: give a percentage like 5%") from None
    if not (math.isfinite(v) and 0 <= v < 10):
        raise ConfigError(f"--tolerance {text!r}: must be between 0% and 1000%")
    return v


# --------------------------------------------------------------------------- the gate


def _bounds(m: Measurement) -> str:
    return f"[{fmt_num(m.lo)}, {fmt_num(m.hi)}]"


def _reason(status: str, m: Measurement, c: Criterion) -> str:
    out = _why(status, m, c)
    if status == "inconclusive" and m.censored:
        out += f"; {m.censored} censored (requests never answered)"
    return out


def _why(status: str, m: Measurement, c: Criterion) -> str:
    conf, limit = f"{m.confidence:.0%}", f"{c.bound:g} {c.unit}"
    if m.n == 0 or math.isnan(m.value):
        return "no samples in the window (no successful requests?)"
    if status == "pass":
        return f"{conf} bound {fmt_num(m.hi if c.op == '<=' else m.lo)} {c.op} {limit}"
    if status == "fail":
        return f"{conf} bound {fmt_num(m.lo if c.op == '<=' else m.hi)} {'>' if c.op == '<=' else '<'} {limit}"
    out = f"{conf} bounds {_bounds(m)} straddle {limit}"
    if m.needed is not None and m.over is not None and m.needed > m.n:
        if c.info.kind == "proportion":
            bad = "none failing" if m.over == 0 else f"at most {m.over} failing"
            return out + f"; needs >= {m.needed} requests with {bad}, has {m.n}"
        side = "over" if c.op == "<=" else "under"
        bad = f"none {side} it" if m.over == 0 else f"at most {m.over} {side} it"
        return out + f"; needs >= {m.needed} samples with {bad}, has {m.n}"
    if m.needed is not None and m.needed > m.n:
        return out + f"; about {m.needed} samples at this spread would decide it, has {m.n}"
    if m.n_eff is not None:
        return out + f" (per-token samples counted as {m.n_eff} requests)"
    return out


def _case(
    c: Criterion,
    p: Point,
    suite: str,
    status: str,
    m: Measurement,
    message: str,
    limit: str,
    extra: dict[str, Any] | None = None,
) -> Case:
    name = c.name + (f" @ {p.label}" if p.label else "")
    n = str(m.n) if m.n_eff is None else f"{m.n} ({m.n_eff} req)"
    if m.method.startswith("batch means"):
        n = f"{m.n} slices"
    data = {
        "metric": c.metric,
        "statistic": c.statistic,
        "op": c.op,
        "bound": c.bound,
        "unit": c.unit,
        "point": p.index,
        "value": _finite(m.value),
        "lower_bound": m.lower_bound,
        **_interval("", m.lo, m.hi),
        "n": m.n,
        "censored": m.censored,
        "n_eff": m.n_eff,
        "confidence": m.confidence,
        "method": m.method,
        "over": m.over,
        "needed": m.needed,
        **(extra or {}),
    }
    return Case(
        name=name + (" vs baseline" if suite == "baseline" else ""),
        status=status,
        message=message,
        suite=suite,
        data=data,
        cells=(("measured", _measured(m, c)), ("bounds", _bounds(m)), ("limit", limit), ("n", n)),
    )


def _measured(m: Measurement, c: Criterion) -> str:
    """The estimate, ``>= x`` where censored samples make it only a lower bound."""
    return f"{'>= ' if m.lower_bound else ''}{fmt_num(m.value)} {c.unit}"


def _finite(v: float) -> float | None:
    """A figure as standard JSON: null where it is undefined or infinite."""
    return float(v) if math.isfinite(v) else None


def _interval(prefix: str, lo: float, hi: float) -> dict[str, float | bool | None]:
    """An interval as standard JSON: an unbounded end is null with its ``*_unbounded`` flag set."""
    return {
        f"{prefix}lo": _finite(lo),
        f"{prefix}hi": _finite(hi),
        f"{prefix}lo_unbounded": lo == -math.inf,
        f"{prefix}hi_unbounded": hi == math.inf,
    }


def _too_short(profile: Profile, p: Point) -> str | None:
    s = p.summary()
    if s.requests < profile.min_samples:
        return f"{s.requests} requests in the window < min_samples {profile.min_samples}"
    if s.window_s < profile.min_duration_s:
        return f"{s.window_s:.1f} s window < min_duration_s {profile.min_duration_s:g} s"
    return None


class Judgement(NamedTuple):
    """One criterion at one load point: its verdict, the measurement behind it and the reason."""

    criterion: Criterion
    point: Point
    status: str
    m: Measurement
    reason: str


def judge(profile: Profile, points: list[Point], run_dir: Path, tokenless: str = "") -> list[Judgement]:
    """A judgement for every criterion and every point it applies to; ``tokenless``: the API of a
    run whose answers stream no tokens (embeddings, rerank), for which the token metrics are
    undefined (inconclusive, and said so)."""
    out = []
    for c in profile.criteria:
        for p in select(points, c, run_dir):
            m = measure(c, p, profile.confidence)
            status = verdict(m, c.op, c.bound)
            reason = _reason(status, m, c)
            if tokenless and c.metric in TOKEN_METRICS and m.n == 0:
                reason = (
                    f"undefined for an {tokenless} run: its answers stream no tokens (judge it by e2e, "
                    "success_rate and throughput: a profile without token criteria)"
                )
            short = _too_short(profile, p) if status == "pass" else None
            if short:
                status, reason = "inconclusive", f"would pass ({reason}), but {short}"
            out.append(Judgement(c, p, status, m, reason))
    return out


def gate_run(
    run_dir: Path,
    profile: Profile,
    *,
    baseline: Path | None = None,
    tolerance: float = 0.05,
    inconclusive: str | None = None,
    secrets: Secrets | None = None,
) -> Outcome:
    """Judge ``run_dir`` (and, with ``baseline``, its change from that run) against ``profile``.
    ``secrets``: the command's, removed from every output (an endpoint may have echoed a key
    into a run's error texts)."""
    run_dir, notes = Path(run_dir), []
    meta, points = load_points(run_dir, profile.slo)
    api = str((meta.get("settings") or {}).get("api", ""))
    results = judge(profile, points, run_dir, tokenless=api if api in POOLED_APIS else "")
    valid = _validities(meta, points)
    cases = [
        _suspect_case(_case(c, p, "slo", status, m, reason, c.limit), valid[p.index], "the run")
        for c, p, status, m, reason in results
    ]
    for p in points:
        prefix = f"{p.label}: " if p.label else ""
        notes += [prefix + w for w in ([p.warning] if p.warning else [])]
        notes += [prefix + c.message for c in _point_caveats(meta, p)]
    if any(c.info.clustered for c in profile.criteria):
        notes.append("ITL/ICL samples are clustered by request; their bounds count one sample per request")
    header = _header(run_dir, meta, profile, valid)
    if baseline is not None:
        bmeta, bpoints = load_points(Path(baseline), profile.slo)
        header.append(("baseline", f"{baseline} (tolerance {fmt_pct(tolerance)})"))
        bvalid = _validities(bmeta, bpoints)
        if line := interruption(bmeta):
            header.insert(
                int(header[0][0] == "INTERRUPTED"), ("INTERRUPTED baseline", line.removeprefix("INTERRUPTED: "))
            )
        notes += _comparability(meta, bmeta)
        cases += _baseline_cases(profile, results, bpoints, Path(baseline), tolerance, valid, bvalid)
    status = overall_status([c.status for c in cases])
    return Outcome(
        kind="gate",
        title=f"SLO gate: {profile.name}",
        status=status,
        exit_code=exit_code(status, inconclusive),
        header=header,
        cases=cases,
        notes=notes,
        columns=("measured", "bounds", "limit", "n"),
        secrets=secrets or Secrets(),
    )


def _header(run_dir: Path, meta: dict[str, Any], profile: Profile, valid: dict[int, Validity]) -> list[tuple[str, str]]:
    """The lines above the table: an interrupted run's first, then what was judged and how."""
    header = [("INTERRUPTED", line.removeprefix("INTERRUPTED: "))] if (line := interruption(meta)) else []
    header += [
        ("run", str(run_dir)),
        ("endpoint", str(meta.get("endpoint", "?"))),
        ("model", str(meta.get("model", "?"))),
        ("profile", f"{profile.name} ({profile.source})"),
        ("confidence", f"{profile.confidence:.0%} one-sided per bound"),
    ]
    suspect = {v.why(): v for v in valid.values() if v.withholding.suspect}
    if suspect:
        why = "; ".join(v.withholding.why() for v in suspect.values())
        header.append(("validity", f"suspect: {why}; verdicts it would decide are INCONCLUSIVE"))
    return header


def _point_caveats(meta: dict[str, Any], p: Point) -> list[Caveat]:
    """A point's caveats, from its run.json entry (a sweep's point by index; a single run's client)."""
    entries = meta.get("points")
    if isinstance(entries, list) and entries:
        entry = next((e for e in entries if isinstance(e, dict) and e.get("index", e.get("point")) == p.index), {})
    else:
        entry = {"phase": "run", "client": meta.get("client") or {}}
    return point_caveats(entry, p.summary(), p.lag_limit_ms)


def _validities(meta: dict[str, Any], points: list[Point]) -> dict[int, Validity]:
    """Each point's validity with its run's, by point index."""
    run = Validity.of(run_caveats(meta))
    return {p.index: Validity.of(_point_caveats(meta, p)).merged(run) for p in points}


def _suspect_case(case: Case, v: Validity, whose: str) -> Case:
    """A PASS or FAIL decided on suspect data, made INCONCLUSIVE with the reason (the rest as is)."""
    w = v.withholding
    if not w.suspect:
        return case
    data = {**case.data, "validity": {"state": w.state, "codes": list(w.codes)}}
    if case.status not in ("pass", "fail"):
        return replace(case, message=f"{case.message}; and {whose} is suspect: {w.why()}", data=data)
    message = f"would {case.status} ({case.message}), but {whose} is suspect: {w.why()}"
    return replace(case, status="inconclusive", message=message, data=data)


def _baseline_cases(
    profile: Profile,
    results: list[Judgement],
    bpoints: list[Point],
    baseline: Path,
    tolerance: float,
    valid: dict[int, Validity],
    bvalid: dict[int, Validity],
) -> list[Case]:
    conf2 = 1 - (1 - profile.confidence) / 2  # each side at half the error: a false alarm <= 1 - confidence
    cases = []
    for j in results:
        c, p = j.criterion, j.point
        match = [b for b in bpoints if (b.label == p.label if p.label else True)]
        if c.at is not None:
            try:
                match = select(bpoints, c, baseline)
            except ConfigError:
                match = []
        cur = measure(c, p, conf2)
        if len(match) != 1:
            cases.append(
                _case(c, p, "baseline", "inconclusive", cur, "no matching load point in the baseline", "baseline: -")
            )
            continue
        case = _baseline_case(c, p, cur, measure(c, match[0], conf2), tolerance)
        case = _suspect_case(case, valid[p.index], "the run")
        cases.append(_suspect_case(case, bvalid[match[0].index], "the baseline"))
    return cases


def _baseline_case(c: Criterion, p: Point, cur: Measurement, base: Measurement, tolerance: float) -> Case:
    """The current run's measurement against the baseline's, both at the comparison confidence."""
    status, why = compare(cur, base, c.op, tolerance)
    change = (cur.value - base.value) / abs(base.value) * 100 if base.value else _NAN
    msg = f"{change:+.1f}% vs baseline {fmt_num(base.value)} {c.unit}; {why}" if change == change else why
    limit = f"baseline {fmt_num(base.value)} {_bounds(base)} {'+' if c.op == '<=' else '-'}{fmt_pct(tolerance)}"
    extra = {
        "baseline_value": _finite(base.value),
        "baseline_lower_bound": base.lower_bound,
        **_interval("baseline_", base.lo, base.hi),
        "baseline_n": base.n,
        "baseline_censored": base.censored,
        "change_pct": _finite(change),
        "tolerance": tolerance,
    }
    return _case(c, p, "baseline", status, cur, msg, limit, extra)


def _comparability(meta: dict[str, Any], bmeta: dict[str, Any]) -> list[str]:
    """Differences that make a baseline comparison compare different traffic."""
    out = []
    if workload_key(meta) != workload_key(bmeta):  # its salt aside: a per-run salt is expected to differ
        out.append("the baseline ran a different workload: a change may come from the traffic, not the endpoint")
    a, b = meta.get("settings") or {}, bmeta.get("settings") or {}
    for key in ("arrival", "api", "seed", "ignore_eos", "warmup_s", "cooldown_s"):
        if a.get(key) != b.get(key):
            out.append(f"the baseline's {key} differs ({b.get(key)!r} vs {a.get(key)!r})")
    return out
