"""Length and time distributions of workload specs, sampled from a numpy Generator.

Token counts (prompt, answer, document lengths, turns per session) are integers
>= 1 and times are seconds >= 0, whatever the distribution's tails say: a
negative normal draw or a zero-length prompt would be a request no real client
sends. Every distribution takes optional ``min``/``max`` clipping, because real
length distributions are heavy-tailed and a model's context window is not.

Sampling is vectorised and draws a fixed number of values from the Generator per
call, so a session's lengths depend only on the seed and the session index.

Spec forms (YAML)::

    512                                        # shorthand for fixed
    {type: fixed, value: 512}
    {type: uniform, low: 100, high: 900}       # inclusive
    {type: normal, mean: 512, std: 64}
    {type: lognormal, mean: 512, sigma: 0.8}   # or median: 400 instead of mean
    {type: empirical, values: [12, 80, 512]}   # or file: lengths.txt (numbers, any separator)
    ... and on any of them: min: 16, max: 4096
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.errors import SpecError
from loadgen.specfile import Fields

__all__ = [
    "Distribution",
    "Fixed",
    "Uniform",
    "Normal",
    "LogNormal",
    "Empirical",
    "parse_distribution",
    "read_numbers",
]

TYPES = ("fixed", "uniform", "normal", "lognormal", "empirical")


@dataclass(frozen=True, eq=False)
class Distribution:
    """Base: clipping and the integer/seconds conventions; subclasses only ``_draw``."""

    min: float | None = None
    max: float | None = None
    integer: bool = True  # token counts (>= 1) rather than seconds (>= 0)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        raise NotImplementedError

    def _bounds(self) -> tuple[float, float]:
        floor = 1.0 if self.integer else 0.0
        lo = floor if self.min is None else max(self.min, floor)
        hi = math.inf if self.max is None else self.max
        return lo, hi

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` values: int64 token counts >= 1, or float64 seconds >= 0."""
        x = np.asarray(self._draw(rng, size), dtype=np.float64)
        if self.integer:
            x = np.rint(x)
        lo, hi = self._bounds()
        x = np.clip(x, lo, hi)
        return x.astype(np.int64) if self.integer else x

    def one(self, rng: np.random.Generator) -> Any:
        """A single value, as a Python int (tokens) or float (seconds)."""
        return self.sample(rng, 1)[0].item()

    def mean(self) -> float:
        """The mean before clipping (what the spec says; previews show the sampled one)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        d = {k: v for k, v in self._params().items()}
        for k in ("min", "max"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Fixed(Distribution):
    value: float = 1.0

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.full(size, self.value, dtype=np.float64)

    def mean(self) -> float:
        return float(self.value)

    def _params(self) -> dict[str, Any]:
        return {"type": "fixed", "value": self.value}


@dataclass(frozen=True, eq=False)
class Uniform(Distribution):
    """Uniform on [low, high]; for token counts every integer in it equally likely."""

    low: float = 1.0
    high: float = 1.0

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.integer:
            return rng.integers(math.ceil(self.low), math.floor(self.high), size=size, endpoint=True)
        return rng.uniform(self.low, self.high, size=size)

    def mean(self) -> float:
        return (self.low + self.high) / 2

    def _params(self) -> dict[str, Any]:
        return {"type": "uniform", "low": self.low, "high": self.high}


@dataclass(frozen=True, eq=False)
class Normal(Distribution):
    mu: float = 0.0
    std: float = 0.0

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self.mu + self.std * rng.standard_normal(size)

    def mean(self) -> float:
        return self.mu

    def _params(self) -> dict[str, Any]:
        return {"type": "normal", "mean": self.mu, "std": self.std}


@dataclass(frozen=True, eq=False)
class LogNormal(Distribution):
    """exp(N(mu, sigma)); given by its mean or median, since users know those."""

    mu: float = 0.0
    sigma: float = 0.0

    @classmethod
    def from_mean(cls, mean: float, sigma: float, **kw: Any) -> LogNormal:
        return cls(mu=math.log(mean) - sigma * sigma / 2, sigma=sigma, **kw)

    @classmethod
    def from_median(cls, median: float, sigma: float, **kw: Any) -> LogNormal:
        return cls(mu=math.log(median), sigma=sigma, **kw)

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.exp(self.mu + self.sigma * rng.standard_normal(size))

    def mean(self) -> float:
        return math.exp(self.mu + self.sigma * self.sigma / 2)

    def _params(self) -> dict[str, Any]:
        return {"type": "lognormal", "median": math.exp(self.mu), "mean": self.mean(), "sigma": self.sigma}


@dataclass(frozen=True, eq=False)
class Empirical(Distribution):
    """Resampling (with replacement) from observed values."""

    values: np.ndarray = field(default_factory=lambda: np.ones(1))
    source: str | None = None

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self.values[rng.integers(0, len(self.values), size=size)]

    def mean(self) -> float:
        return float(self.values.mean())

    def _params(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "empirical", "count": int(len(self.values)), "mean": self.mean()}
        if self.source:
            d["file"] = self.source
        else:
            d["values"] = self.values.tolist() if len(self.values) <= 32 else "..."
        return d


_NUMBER_SEP = re.compile(r"[\s,;]+")


def read_numbers(path: Path) -> np.ndarray:
    """Numbers from a text file (any of whitespace , ; between them; ``#`` starts a comment)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror or e}") from None
    out: list[float] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for tok in _NUMBER_SEP.split(line.split("#", 1)[0].strip()):
            if not tok:
                continue
            try:
                v = float(tok)
            except ValueError:
                raise SpecError(f"{path}:{lineno}: not a number: {tok[:40]!r}") from None
            if not math.isfinite(v):
                raise SpecError(f"{path}:{lineno}: not a finite number: {tok!r}")
            out.append(v)
    if not out:
        raise SpecError(f"{path}: no numbers in the file")
    return np.asarray(out, dtype=np.float64)


def parse_distribution(
    parent: Fields, key: str, *, integer: bool = True, default: Distribution | None = None
) -> Distribution:
    """The distribution at ``parent[key]``: a number (fixed) or a ``{type: ...}`` mapping.

    ``integer`` picks token counts (whole, >= 1) over seconds (>= 0). Without a
    ``default`` the key is required.
    """
    if not parent.has(key):
        parent.raw(key, None)  # marks the key read (it may be there as null)
        if default is None:
            raise parent.error(key, "required")
        return default
    floor = 1 if integer else 0
    value = parent.data[key]
    if not isinstance(value, dict):
        v = parent.number(key, integer=integer, ge=floor)
        return Fixed(value=v, integer=integer)
    f = parent.sub(key)
    kind = f.string("type", choices=TYPES)
    lo = f.number("min", None, ge=floor)
    hi = f.number("max", None, ge=floor)
    if lo is not None and hi is not None and lo > hi:
        raise f.error("max", f"must be >= min ({lo:g})")
    kw: dict[str, Any] = {"min": lo, "max": hi, "integer": integer}
    dist: Distribution
    if kind == "fixed":
        dist = Fixed(value=f.number("value", ge=floor), **kw)
    elif kind == "uniform":
        low, high = f.number("low", ge=floor), f.number("high", ge=floor)
        if high < low:
            raise f.error("high", f"must be >= low ({low:g})")
        if integer and math.floor(high) < math.ceil(low):
            raise f.error("high", "no whole number lies between low and high")
        dist = Uniform(low=low, high=high, **kw)
    elif kind == "normal":
        dist = Normal(mu=f.number("mean"), std=f.number("std", ge=0), **kw)
    elif kind == "lognormal":
        sigma = f.number("sigma", ge=0)
        mean, median = f.number("mean", None, gt=0), f.number("median", None, gt=0)
        if (mean is None) == (median is None):
            raise f.error(None, "give exactly one of mean or median")
        if mean is not None:
            dist = LogNormal.from_mean(mean, sigma, **kw)
        else:
            dist = LogNormal.from_median(median, sigma, **kw)
    else:
        dist = _parse_empirical(f, kw)
    f.finish()
    return dist


def _parse_empirical(f: Fields, kw: dict[str, Any]) -> Empirical:
    values, path = f.raw("values", None), f.path("file", None)
    if (values is None) == (path is None):
        raise f.error(None, "give exactly one of values (a list) or file (a path)")
    if path is not None:
        arr = read_numbers(path)
    else:
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        ):
            raise f.error("values", "must be a non-empty list of numbers")
        arr = np.asarray(values, dtype=np.float64)
    if (arr < 0).any():
        where = str(path) if path is not None else f"{f.prefix}values"
        raise f.error("file" if path is not None else "values", f"negative numbers in {where}")
    return Empirical(values=arr, source=str(path) if path is not None else None, **kw)
