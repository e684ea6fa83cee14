"""``loadgen run --api embeddings|rerank`` end to end against the built-in simulator: each
request sends its batch, gets one JSON answer, and is recorded with its inputs and latency;
the report gives inputs/s where streamed runs give tokens (issue 16)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from loadgen.cli.main import main
from loadgen.conformance.gate import gate_run
from loadgen.conformance.slo import load_profile


@pytest.mark.parametrize(("api", "batch"), [("embeddings", 3), ("rerank", 5)])
def test_a_pooled_run_records_its_inputs_and_reports_inputs_per_second(
    tmp_path: Path, capsys: Any, api: str, batch: int
) -> None:
    out = tmp_path / api
    argv = ["run", "--api", api, "--batch-size", str(batch), "--input-tokens", "32", "--rate", "40"]
    argv += ["--requests", "8", "--sim-ttft-ms", "2", "--no-live", "--no-report", "--out", str(out)]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    recs = pq.read_table(out / "records.parquet").to_pydict()
    assert recs["status"] == ["ok"] * 8 and recs["api"] == [api] * 8
    assert recs["inputs"] == [batch] * 8 and recs["stream_end"] == ["done"] * 8
    assert recs["t_first"] == [None] * 8 and recs["output_tokens"] == [0] * 8  # nothing is generated
    assert all(p is not None and p >= 32 * batch for p in recs["prompt_tokens_reported"])
    assert all(d > s for d, s in zip(recs["t_done"], recs["t_sent"], strict=True))
    assert "inputs: " in printed and " inputs/s, " in printed and "over 8 ok requests" in printed
    pooled = orjson.loads((out / "summary.json").read_bytes())["pooled"]
    assert pooled["requests"] == 8 and pooled["inputs_per_s"] == pytest.approx(batch * pooled["requests_per_s"])
    # an SLO gate judges it by E2E; the token criteria are undefined here, and said so
    cases = {c.data["metric"]: c for c in gate_run(out, load_profile("interactive-chat")).cases}
    assert cases["e2e"].data["n"] == 8 and cases["ttft"].status == cases["tpot"].status == "inconclusive"
    assert f"undefined for an {api} run: its answers stream no tokens" in cases["ttft"].message


def test_a_pooled_workload_needs_its_api(tmp_path: Path, capsys: Any) -> None:
    argv = ["run", "--workload", "embeddings", "--requests", "2", "--no-live", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "its kind is embeddings; run it with --api embeddings" in err and "Traceback" not in err
