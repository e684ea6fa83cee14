"""SLO profiles: which metric, which statistic, which bound, how sure (``loadgen gate``).

A profile is a YAML file (built-in ones live in ``conformance/``) listing
criteria such as "p99 of TTFT <= 200 ms". It is validated in full when loaded,
before any run is judged, and every problem names ``file:line: field``: a gate
that silently skips a misspelt criterion would pass a release it should not.

Bounds carry their unit ("<= 200 ms", ">= 99.5 %", ">= 30 tok/s") and are stored
in the metric's own unit, so "2 s" and "2000 ms" mean the same and "0.99" can
never be mistaken for a percentage.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from loadgen.analysis.metrics import SLO
from loadgen.errors import SpecError
from loadgen.specfile import Fields, LineDict, builtin_dir, load_yaml

__all__ = [
    "MetricInfo",
    "METRICS",
    "At",
    "Criterion",
    "Profile",
    "load_profile",
    "builtin_profiles",
    "parse_bound",
]


@dataclass(frozen=True)
class MetricInfo:
    """What a metric is: its samples' kind, unit and which direction is better.

    ``kind``: "dist" (one sample per request, token or session: percentiles and
    means apply), "rate" (events per second over the window) or "proportion"
    (a share of requests, in %). ``clustered``: samples within a request are not
    independent (ITL, ICL), which the gate accounts for. TTFT, E2E and schedule lag
    count every request of the window, one that never got what they time as a
    right-censored sample (``columns.Latencies``): a percentile on censored samples
    PASSes only if it would with each of them never answered (``bounds``).
    """

    name: str
    kind: str
    unit: str
    better: str  # "lower" | "higher"
    what: str
    clustered: bool = False
    needs_slo: bool = False


METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo(
            "ttft", "dist", "ms", "lower", "time to first token from the intended send time (unanswered: censored)"
        ),
        MetricInfo("ttft_sent", "dist", "ms", "lower", "time to first token from the actual send"),
        MetricInfo("tpot", "dist", "ms", "lower", "per request: (last - first token) / (tokens - 1)"),
        MetricInfo("itl", "dist", "ms", "lower", "inter-token latency, one sample per token", clustered=True),
        MetricInfo("icl", "dist", "ms", "lower", "gaps between output chunks", clustered=True),
        MetricInfo("e2e", "dist", "ms", "lower", "end-to-end latency per request (unfinished: censored)"),
        MetricInfo("schedule_lag", "dist", "ms", "lower", "actual send - intended send (the client's health)"),
        MetricInfo("per_user_tps", "dist", "tok/s", "higher", "1000 / TPOT per request"),
        MetricInfo("session_duration", "dist", "s", "lower", "per session: last turn done - first turn scheduled"),
        MetricInfo("output_tps", "rate", "tok/s", "higher", "output tokens arriving in the window per second"),
        MetricInfo("throughput", "rate", "req/s", "higher", "requests completed ok in the window per second"),
        MetricInfo(
            "goodput", "rate", "req/s", "higher", "requests completed ok and within `slo` per second", needs_slo=True
        ),
        MetricInfo("success_rate", "proportion", "%", "higher", "share of requests in the window that succeeded"),
        MetricInfo(
            "attainment", "proportion", "%", "higher", "share of requests in the window that met `slo`", needs_slo=True
        ),
    )
}

# Units a bound may be written in, per dimension: factor to the base unit named first.
_UNITS: dict[str, dict[str, float]] = {
    "ms": {"ms": 1.0, "s": 1e3, "us": 1e-3, "min": 6e4},
    "s": {"s": 1.0, "ms": 1e-3, "min": 60.0},
    "tok/s": {"tok/s": 1.0},
    "req/s": {"req/s": 1.0},
    "%": {"%": 1.0},
}
_BOUND = re.compile(r"^\s*(<=|>=|<|>|≤|≥)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S.*?)?\s*$")
_PCT = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")
_OPS = {"<=": "<=", "<": "<=", "≤": "<=", ">=": ">=", ">": ">=", "≥": ">="}


@dataclass(frozen=True)
class At:
    """The load point a criterion applies to in a sweep: a rate, a concurrency or an index."""

    rate: float | None = None
    concurrency: int | None = None
    point: int | None = None

    def __str__(self) -> str:
        if self.rate is not None:
            return f"rate {self.rate:g}"
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        return f"point {self.point}"


@dataclass(frozen=True)
class Criterion:
    """One line of a profile: ``statistic(metric) op bound``, e.g. p99(ttft) <= 200 ms."""

    name: str
    metric: str
    statistic: str  # "pNN", "mean" or "value"
    op: str  # "<=" or ">="
    bound: float  # in ``unit``, the metric's own unit
    unit: str
    at: At | None = None
    line: int = 0

    @property
    def info(self) -> MetricInfo:
        return METRICS[self.metric]

    @property
    def percentile(self) -> float | None:
        m = _PCT.match(self.statistic)
        return float(m.group(1)) if m else None

    @property
    def limit(self) -> str:
        return f"{self.op} {self.bound:g} {self.unit}"

    def __str__(self) -> str:
        where = f" at {self.at}" if self.at else ""
        return f"{self.statistic} {self.metric} {self.limit}{where}"


@dataclass(frozen=True)
class Profile:
    """A validated SLO profile. ``confidence`` is the one-sided confidence of each verdict."""

    name: str
    source: str
    criteria: tuple[Criterion, ...]
    description: str = ""
    confidence: float = 0.95
    min_samples: int = 0
    min_duration_s: float = 0.0
    slo: SLO | None = None


def parse_bound(text: str, metric: MetricInfo) -> tuple[str, float]:
    """``"<= 2 s"`` -> ("<=", 2000.0) for a metric in ms. Raises ValueError with the reason.

    ``<`` reads as ``<=``: with continuous latencies the difference has no weight,
    and the gate's arithmetic is the same for both.
    """
    m = _BOUND.match(str(text))
    if not m:
        raise ValueError(f"{text!r}: write a comparison, a number and a unit, e.g. '<= 200 ms' or '>= 99 %'")
    op, number, unit = _OPS[m.group(1)], float(m.group(2)), (m.group(3) or "").strip()
    units = _UNITS[metric.unit]
    if not unit:
        raise ValueError(f"{text!r}: give the unit, e.g. '{m.group(1)} {m.group(2)} {metric.unit}'")
    if unit not in units:
        raise ValueError(f"{text!r}: unit {unit!r} does not fit {metric.name}; use {', '.join(units)}")
    value = number * units[unit]
    if not math.isfinite(value):
        raise ValueError(f"{text!r}: the bound must be a finite number")
    if metric.kind == "proportion" and not 0 <= value <= 100:
        raise ValueError(f"{text!r}: a share must be within 0..100 %")
    return op, value


def builtin_profiles() -> dict[str, Path]:
    """Name -> file of the profiles shipped in ``conformance/``."""
    folder = builtin_dir("conformance")
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def load_profile(name_or_path: str | Path) -> Profile:
    """A profile from a file path, or a built-in one by name (``interactive-chat``)."""
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        found = builtin_profiles().get(str(name_or_path))
        if found is None:
            known = ", ".join(builtin_profiles()) or "none"
            raise SpecError(f"--slo {name_or_path}: no such file or built-in profile (built-in: {known})")
        path = found
    try:
        doc = load_yaml(path)
    except SpecError as e:
        if "chomping" in str(e) or "block scalar" in str(e):  # `bound: >= 95 %` unquoted
            raise SpecError(f"{e} (quote bounds that start with '>': bound: \">= 95 %\")") from None
        raise
    return _profile(doc, str(path))


def _profile(doc: LineDict, file: str) -> Profile:
    f = Fields(doc, file)
    name = f.string("name", Path(file).stem)
    description = f.string("description", "")
    confidence = f.number("confidence", 0.95)
    if not 0.5 < confidence < 1:
        raise f.error("confidence", f"must be strictly between 0.5 and 1 (one-sided), not {confidence!r}")
    min_samples = f.number("min_samples", 0, ge=0, integer=True)
    min_duration = f.number("min_duration_s", 0.0, ge=0)
    slo = _slo(f)
    raw = f.raw("criteria")
    if not isinstance(raw, list) or not raw:
        raise f.error("criteria", "must be a non-empty list of criteria")
    criteria = []
    for i, item in enumerate(raw):
        where = f"criteria[{i}]"
        if not isinstance(item, LineDict):
            raise f.error("criteria", f"{where} must be a mapping with metric, statistic and bound")
        criteria.append(_criterion(Fields(item, file, prefix=f"{where}."), item.line, slo))
    f.finish()
    seen: dict[str, int] = {}
    for c in criteria:
        if c.name in seen:
            raise SpecError(
                f"{file}:{c.line}: criteria: name {c.name!r} is already used on line {seen[c.name]}; "
                "names must be unique"
            )
        seen[c.name] = c.line
    return Profile(
        name=name,
        source=file,
        criteria=tuple(criteria),
        description=description.strip(),
        confidence=float(confidence),
        min_samples=int(min_samples),
        min_duration_s=float(min_duration),
        slo=slo,
    )


def _slo(f: Fields) -> SLO | None:
    sub = f.sub("slo", None)
    if sub is None:
        return None
    values = {k: sub.number(k, None, gt=0) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    sub.finish()
    if all(v is None for v in values.values()):
        raise f.error("slo", "give at least one of ttft_ms, tpot_ms, e2e_ms")
    return SLO(**values)


def _criterion(f: Fields, line: int, slo: SLO | None) -> Criterion:
    metric = f.string("metric", choices=tuple(METRICS))
    info = METRICS[metric]
    default_stat = "value" if info.kind != "dist" else None
    statistic = f.string("statistic", default_stat)
    if statistic is None:
        raise f.error("statistic", f"required for {metric}: a percentile like p99, or mean")
    if info.kind == "dist":
        m = _PCT.match(statistic)
        if statistic != "mean" and not (m and 0 < float(m.group(1)) < 100):
            raise f.error("statistic", f"{statistic!r}: use a percentile (p50, p90, p99, p99.9) or mean")
    elif statistic != "value":
        raise f.error("statistic", f"{statistic!r}: {metric} is a single {info.kind}; use value (or leave it out)")
    if info.needs_slo and slo is None:
        raise f.error("metric", f"{metric} counts requests that meet the profile's `slo:`, which is not given")
    try:
        op, bound = parse_bound(f.raw("bound"), info)
    except ValueError as e:
        raise f.error("bound", str(e)) from None
    at = _at(f)
    name = f.string("name", f"{statistic} {metric}" if statistic != "value" else metric)
    f.finish()
    return Criterion(
        name=name, metric=metric, statistic=statistic, op=op, bound=bound, unit=info.unit, at=at, line=line
    )


def _at(f: Fields) -> At | None:
    sub = f.sub("at", None)
    if sub is None:
        return None
    rate = sub.number("rate", None, gt=0)
    conc = sub.number("concurrency", None, ge=1, integer=True)
    point = sub.number("point", None, ge=0, integer=True)
    sub.finish()
    given = [v for v in (rate, conc, point) if v is not None]
    if len(given) != 1:
        raise f.error("at", "give exactly one of rate, concurrency or point")
    return At(rate=None if rate is None else float(rate), concurrency=conc, point=point)
