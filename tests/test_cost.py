"""The cost arithmetic, pinned by examples worked by hand, and the shipped price files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from loadgen.analysis.cost import HOURS_PER_YEAR, Ownership, Rental, token_costs, tokens_per_mw
from loadgen.errors import ConfigError, SpecError
from loadgen.plan.prices import builtin_price_files, load_prices, resolve_pricing


def owned(**kw: float) -> Ownership:
    base: dict[str, Any] = dict(
        capex_per_gpu_usd=87_660.0,  # 10 $/h over one year of 8766 h
        capex_per_node_usd=0.0,
        gpus_per_node=8,
        amortisation_years=1.0,
        power_per_gpu_kw=1.0,
        power_per_node_kw=8.0,  # 1 kW per GPU as its share
        pue=1.5,
        usd_per_kwh=0.10,
        operations_share=0.2,
    )
    base.update(kw)
    return Ownership(name="t", **base)


def test_ownership_per_gpu_hour_by_hand() -> None:
    o = owned()
    assert o.capital_per_gpu_hour() == pytest.approx(10.0)
    assert o.facility_kw_per_gpu() == pytest.approx(3.0)  # (1 + 8/8) x 1.5
    assert o.energy_per_gpu_hour() == pytest.approx(0.30)
    assert o.gpu_hour_usd() == pytest.approx(12.36)  # (10 + 0.30) x 1.2


def test_node_capex_is_shared_by_its_gpus() -> None:
    o = owned(capex_per_gpu_usd=0.0, capex_per_node_usd=8 * 87_660.0, operations_share=0.0, usd_per_kwh=0.0)
    assert o.gpu_hour_usd() == pytest.approx(10.0)
    assert HOURS_PER_YEAR == 8766.0


def test_token_costs_by_hand() -> None:
    # 4 GPUs at $2/h = $8/h; 1000 input and 250 output tok/s
    c = token_costs(2.0, 4, 1000.0, 250.0, price_ratio=4.0)
    assert c.usd_per_hour == 8.0
    assert c.output_only == pytest.approx(8 / (250 * 3600) * 1e6)  # 8.889
    assert c.blended == pytest.approx(8 / (1250 * 3600) * 1e6)  # 1.778
    assert c.input == pytest.approx(8 / (2000 * 3600) * 1e6)  # 1.111
    assert c.output == pytest.approx(4 * c.input)
    # the split charges exactly the hour's cost
    assert (1000 * 3600 * c.input + 250 * 3600 * c.output) / 1e6 == pytest.approx(8.0)


def test_no_tokens_cost_infinity_and_bad_prices_are_refused() -> None:
    c = token_costs(2.0, 1, 0.0, 0.0)
    assert math.isinf(c.output_only) and math.isinf(c.blended) and math.isinf(c.input)
    with pytest.raises(ConfigError):
        token_costs(-1.0, 1, 1, 1)
    with pytest.raises(ConfigError):
        token_costs(1.0, 0, 1, 1)
    with pytest.raises(ConfigError, match="pue"):
        owned(pue=0.9)
    with pytest.raises(ConfigError, match="usd_per_gpu_hour"):
        Rental("x", float("nan"))


def test_tokens_per_megawatt() -> None:
    assert tokens_per_mw(1000.0, 8, 1.25) == pytest.approx(100_000.0)  # 10 kW = 0.01 MW


def test_shipped_price_files_load_and_say_the_prices_are_the_users() -> None:
    files = builtin_price_files()
    assert {"rental", "ownership"} <= set(files)
    for name, path in files.items():
        pf = load_prices(path, name)
        assert "user" in pf.statement and "set" in pf.statement
        for m in pf.models:
            for cm in m.gpus.values():
                assert cm.gpu_hour_usd() > 0
                assert cm.sources, f"{m.label}: a figure without its source"
    owned_h100 = resolve_pricing("ownership").for_gpu("h100")
    assert 1.0 < owned_h100.gpu_hour_usd() < 3.0
    assert resolve_pricing("rental:committed-1y").for_gpu("b200").gpu_hour_usd() == 5.59


def test_bad_price_file_names_file_line_and_field(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "name: x\nstatement: s\nmodels:\n  - name: a\n    kind: rental\n    gpus:\n      h100: {usd_per_gpu_hour: -2}\n"
    )
    with pytest.raises(SpecError, match=r"p.yaml:7: .*usd_per_gpu_hour"):
        load_prices(p)
    with pytest.raises(ConfigError, match="no model 'nope'"):
        resolve_pricing("rental:nope")
    with pytest.raises(ConfigError, match="no price for GPU 'mi300x'"):
        resolve_pricing("rental").for_gpu("mi300x")
