"""Cost models as data: what a GPU-hour costs, and what a million tokens cost at a throughput.

Two ways to pay for a GPU, each a frozen, validated dataclass:

* ``Rental``: a tier of a cloud's price list ($ per GPU-hour, on-demand or committed for a term).
* ``Ownership``: buying and running it. Per GPU-hour::

      capital    = (capex per GPU + capex per node / GPUs per node) / (amortisation years x 8766 h)
      energy     = (power per GPU + power per node / GPUs per node) [kW] x PUE x $ per kWh
      $/GPU-hour = (capital + energy) x (1 + operations share)

  The operations share stands for staff, maintenance, space and network operations, as a
  fraction of capital + energy (0.15 adds 15 %). A year is 8766 hours (365.25 days). Every
  hour is counted as used: an owned GPU that idles costs the same, so at a utilisation u the
  figure is this one / u.

Tokens (``token_costs``): a deployment of G GPUs at P $/GPU-hour costs C = P x G per hour and,
at I input (prompt) and O output tokens/s, serves 3600 x I and 3600 x O tokens an hour:

* output-only $/M = C / (3600 O) x 1e6: every dollar charged to output tokens (the sweep's
  figure: ``analysis.pareto.cost_per_million``);
* blended $/M = C / (3600 (I + O)) x 1e6: every token alike;
* input and output $/M split by a price ratio r (output price = r x input price, as list
  prices are quoted): p_in = C / (3600 (I + r O)) x 1e6 and p_out = r x p_in, so that
  I x p_in + O x p_out is exactly C. The ratio is a pricing convention, not a measurement.

Prices are the user's to set: the shipped files under ``prices/`` are dated examples with
their public sources, never a quote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from loadgen.errors import ConfigError

__all__ = [
    "HOURS_PER_YEAR",
    "Rental",
    "Ownership",
    "CostModel",
    "TokenCosts",
    "token_costs",
    "tokens_per_mw",
]

HOURS_PER_YEAR = 8766.0  # 365.25 days


def _check(name: str, value: float, *, positive: bool = False, at_most: float | None = None) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ConfigError(f"{name}: must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    if at_most is not None and value > at_most:
        raise ConfigError(f"{name}: must be <= {at_most:g}, got {value!r}")


@dataclass(frozen=True)
class Rental:
    """One tier of a rental price list: ``usd_per_gpu_hour``, on-demand or committed for a term."""

    name: str
    usd_per_gpu_hour: float
    commitment: str = "on-demand"  # "on-demand", or a term such as "1-year", "3-year"
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(f"{self.name}: usd_per_gpu_hour", self.usd_per_gpu_hour)
        if not self.commitment:
            raise ConfigError(f"{self.name}: commitment must name a term or 'on-demand'")

    @property
    def kind(self) -> str:
        return "rental"

    def gpu_hour_usd(self) -> float:
        return float(self.usd_per_gpu_hour)

    def facility_kw_per_gpu(self) -> float | None:
        return None  # a rental price says nothing of power


@dataclass(frozen=True)
class Ownership:
    """Buying and running GPUs: capex, amortisation, power, PUE, electricity, operations."""

    name: str
    capex_per_gpu_usd: float
    capex_per_node_usd: float
    gpus_per_node: int
    amortisation_years: float
    power_per_gpu_kw: float
    power_per_node_kw: float
    pue: float
    usd_per_kwh: float
    operations_share: float
    sources: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n = self.name
        for k in ("capex_per_gpu_usd", "capex_per_node_usd", "power_per_gpu_kw", "power_per_node_kw", "usd_per_kwh"):
            _check(f"{n}: {k}", getattr(self, k))
        _check(f"{n}: amortisation_years", self.amortisation_years, positive=True)
        _check(f"{n}: operations_share", self.operations_share, at_most=10.0)
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ConfigError(f"{n}: gpus_per_node must be a whole number >= 1, got {self.gpus_per_node!r}")
        _check(f"{n}: pue", self.pue, positive=True)
        if self.pue < 1:
            raise ConfigError(f"{n}: pue must be >= 1 (facility power over IT power), got {self.pue!r}")

    @property
    def kind(self) -> str:
        return "ownership"

    def capital_per_gpu_hour(self) -> float:
        per_gpu = self.capex_per_gpu_usd + self.capex_per_node_usd / self.gpus_per_node
        return per_gpu / (self.amortisation_years * HOURS_PER_YEAR)

    def facility_kw_per_gpu(self) -> float:
        """Facility power per GPU: its own, its share of the node's, times PUE."""
        return (self.power_per_gpu_kw + self.power_per_node_kw / self.gpus_per_node) * self.pue

    def energy_per_gpu_hour(self) -> float:
        return self.facility_kw_per_gpu() * self.usd_per_kwh

    def gpu_hour_usd(self) -> float:
        return (self.capital_per_gpu_hour() + self.energy_per_gpu_hour()) * (1.0 + self.operations_share)


CostModel = Rental | Ownership


@dataclass(frozen=True)
class TokenCosts:
    """$ per million tokens at one operating point (inf where the deployment produced none)."""

    usd_per_hour: float  # the whole deployment's
    output_only: float  # every dollar charged to output tokens
    blended: float  # every token alike
    input: float  # split by the price ratio
    output: float
    price_ratio: float  # output price / input price used for the split


def token_costs(
    usd_per_gpu_hour: float, gpus: float, input_tps: float, output_tps: float, price_ratio: float = 4.0
) -> TokenCosts:
    """$/M tokens for a deployment of ``gpus`` at ``usd_per_gpu_hour`` serving these rates (module doc)."""
    _check("usd_per_gpu_hour", usd_per_gpu_hour)
    _check("gpus", gpus, positive=True)
    _check("price_ratio", price_ratio, positive=True)
    i = input_tps if input_tps > 0 and math.isfinite(input_tps) else 0.0
    o = output_tps if output_tps > 0 and math.isfinite(output_tps) else 0.0
    c = usd_per_gpu_hour * gpus

    def per_m(tokens_per_s: float) -> float:
        return c / (tokens_per_s * 3600.0) * 1e6 if tokens_per_s > 0 else math.inf

    p_in = per_m(i + price_ratio * o)
    return TokenCosts(c, per_m(o), per_m(i + o), p_in, price_ratio * p_in, price_ratio)


def tokens_per_mw(tokens_per_s: float, gpus: float, facility_kw_per_gpu: float) -> float:
    """Tokens/s per megawatt of facility power (``gpus`` x kW each, PUE included)."""
    _check("gpus", gpus, positive=True)
    _check("facility_kw_per_gpu", facility_kw_per_gpu, positive=True)
    return tokens_per_s / (gpus * facility_kw_per_gpu / 1000.0)
