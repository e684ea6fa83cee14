"""``loadgen plan``: configurations, the capacity search, pricing and ranking, and the report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from loadgen.analysis.metrics import SLO
from loadgen.cli.main import main
from loadgen.cli.plan_cmd import parse_axis
from loadgen.errors import ConfigError
from loadgen.plan import search
from loadgen.plan.config import load_configs, parse_config_flag
from loadgen.plan.figures import PointFigures, SearchSettings
from loadgen.plan.prices import resolve_pricing
from loadgen.plan.run import price_point
from loadgen.plan.search import find_capacity
from loadgen.workload.base import SyntheticChat


def fig(load: float, attainment: float, out_tps: float = 1000.0, in_tps: float = 3000.0) -> PointFigures:
    return PointFigures(load, 500, attainment, out_tps, in_tps, 50.0, 40.0, 150.0, 20.0, 900.0, {}, 0, 0.01)


def test_configs_from_flags_and_yaml(tmp_path: Path) -> None:
    d = parse_config_flag("gpu=H100,tp=4,dtype=fp8,replicas=2", "llama-3.1-70b")
    assert (d.gpu, d.tp, d.dtype, d.kv, d.gpus, d.label) == ("h100", 4, "fp8", "fp8", 8, "h100 tp4 fp8 x2")
    pd = parse_config_flag("gpu=h200,tp=2,prefills=2,prefill_tp=4,decodes=1", "llama-3.1-70b")
    assert pd.disaggregated and pd.gpus == 2 * 4 + 2 and pd.dtype == "bf16" and pd.kv == "bf16"
    p = tmp_path / "c.yaml"
    p.write_text(
        "model: llama-3.1-70b\ndtype: fp8\nconfigs:\n  - {gpu: b200, tp: 2}\n  - {gpu: h100, tp: 8, name: big}\n"
    )
    assert [c.label for c in load_configs(p)] == ["b200 tp2 fp8", "big"]
    with pytest.raises(ConfigError, match="unknown key 'tpp'"):
        parse_config_flag("gpu=h100,tpp=4", "llama-3.1-70b")
    with pytest.raises(ConfigError, match="does not fit"):
        parse_config_flag("gpu=h100,tp=1", "llama-3.1-70b").check()  # 141 GB of BF16 weights on one GPU
    assert parse_axis("1k,8k,32k", "--input-tokens") == [1024, 8192, 32768]
    with pytest.raises(ConfigError, match="share"):
        parse_axis("0.5,1.5", "--prefix-reuse", fraction=True)


def test_capacity_search_ramps_then_bisects(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[float] = []

    def fake(d: object, w: object, load: float, cfg: SearchSettings) -> PointFigures:
        tried.append(load)
        return fig(load, 100.0 if load <= 21 else 90.0)  # capacity is 21 concurrent

    monkeypatch.setattr(search, "measure", fake)
    cfg = SearchSettings(slo=SLO(ttft_ms=200), target_pct=99.0, start=4.0, refine=4)
    found = find_capacity(parse_config_flag("gpu=h100,tp=8", "llama-3.1-70b"), SyntheticChat(), cfg)
    assert tried == [4, 8, 16, 32, 23, 19, 21, 22]
    assert found.capacity is not None and found.capacity.load == 21
    tried.clear()
    monkeypatch.setattr(search, "measure", lambda d, w, load, cfg: fig(load, 90.0))
    none = find_capacity(parse_config_flag("gpu=h100,tp=8", "llama-3.1-70b"), SyntheticChat(), cfg)
    assert none.capacity is None and [p.load for p in none.points] == [4, 1] and "not met" in none.note


def test_operating_point_priced_for_the_whole_deployment() -> None:
    d = parse_config_flag("gpu=h100,tp=4,dtype=fp8,replicas=3", "llama-3.1-70b")
    q = price_point(d, fig(10, 99.5), resolve_pricing("rental:on-demand"), 4.0)
    assert q.gpus == 12 and q.output_tps == 3000.0 and q.capacity == 30
    hour = 6.16 * 12
    assert q.costs.output_only == pytest.approx(hour / (3000 * 3600) * 1e6)
    assert q.costs.blended == pytest.approx(hour / (12000 * 3600) * 1e6)
    assert q.tokens_per_mw == pytest.approx(3000 / (12 * 0.7 / 1000))  # rental: the GPUs' board power
    owned = price_point(d, fig(10, 99.5), resolve_pricing("ownership"), 4.0)
    assert owned.tokens_per_mw < q.tokens_per_mw  # ownership adds node power and PUE
    assert math.isfinite(owned.costs.input)


def test_plan_command_writes_a_ranked_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--workload", "chat", "--config", "gpu=b200,tp=1,dtype=fp8"]
    args += ["--model", "llama-3.1-8b", "--slo", "ttft=500,tpot=50", "--point-duration", "5", "--warmup", "1"]
    args += ["--drain", "5", "--start", "2", "--min-requests", "0", "--max-points", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ranked by $/M" in out and "b200 tp1 fp8" in out and "the user's" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [e["deployment"]["label"] for e in plan["ranking"]] and plan["pricing"]["label"] == "rental:on-demand"
    html = (tmp_path / "plan.html").read_text()
    assert 'id="pareto"' in html and "Ranking" in html


def test_axes_give_capacity_against_each_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from loadgen.plan.run import run_plan
    from loadgen.report.plan_view import PlanHeader, axis_rows, write_plan

    def fake(d: object, w: SyntheticChat, load: float, cfg: SearchSettings) -> PointFigures:
        size = float(w.describe().get("input_tokens", 1024))  # capacity falls as prompts grow
        return fig(load, 100.0 if load <= 64 * 1024 / size else 50.0)

    monkeypatch.setattr(search, "measure", fake)
    made: list[dict[str, Any]] = []

    def make(axis: dict[str, Any]) -> SyntheticChat:
        made.append(axis)
        return SyntheticChat(input_tokens=int(axis.get("input_tokens", 1024)))

    cfg = SearchSettings(slo=SLO(ttft_ms=200), target_pct=99.0, start=4.0, refine=4)
    deps = [parse_config_flag("gpu=h100,tp=8", "llama-3.1-70b")]
    res = run_plan(deps, make, cfg, resolve_pricing("rental"), axes={"input_tokens": [1024, 8192]})
    assert made == [{}, {"input_tokens": 1024}, {"input_tokens": 8192}]
    caps = [(a.value, a.entries[0].at_slo.capacity if a.entries[0].at_slo else None) for a in res.axes]
    assert caps == [(1024, 64), (8192, 8)]
    header = PlanHeader("chat", "ttft=200", resolve_pricing("rental"), cfg, 4.0)
    assert [r[:4] for r in axis_rows(res, "concurrency")] == [
        ["input-tokens", "1024", "h100 tp8 bf16", "64 concurrent"],
        ["input-tokens", "8192", "h100 tp8 bf16", "8 concurrent"],
    ]
    html = write_plan(tmp_path, res, header).read_text()
    assert 'id="axis-input_tokens"' in html
