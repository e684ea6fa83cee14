"""loadgen's intervals take their quantiles from scipy.special (analysis.distributions), not
scipy.stats, whose import costs every command about a second: the same values, exactly."""

from __future__ import annotations

import subprocess
import sys

import pytest
from scipy import stats

from loadgen.analysis.distributions import beta_ppf, binom_cdf, binom_ppf, chi2_ppf, norm_ppf, t_ppf

QS = [1e-6, 0.001, 0.005, 0.025, 0.05, 0.1, 0.5, 0.9, 0.95, 0.975, 0.995, 0.999, 1 - 1e-6]


def test_continuous_quantiles_equal_scipy_stats() -> None:
    for q in QS:
        assert norm_ppf(q) == stats.norm.ppf(q)
        for df in (1, 2, 9, 29, 1000, 10**6):
            assert t_ppf(q, df) == stats.t.ppf(q, df)
            assert chi2_ppf(q, 2 * df) == stats.chi2.ppf(q, 2 * df)
            assert chi2_ppf(q, 2 * df + 2) == stats.chi2.ppf(q, 2 * df + 2)
        for a in (1, 7, 500, 99_999):
            for b in (1, 3, 2_000, 10**6):
                assert beta_ppf(q, a, b) == stats.beta.ppf(q, a, b)


@pytest.mark.parametrize("n", [1, 5, 37, 1000, 250_000])
def test_binomial_cdf_and_quantile_equal_scipy_stats_bounds_included(n: int) -> None:
    for p in (0.01, 0.5, 0.9, 0.99, 0.999):
        for k in sorted({-1, 0, 1, n // 3, n // 2, n - 1, n, n + 1}):
            assert binom_cdf(k, n, p) == stats.binom.cdf(k, n, p)
        for q in [0.0, *QS, 1.0]:
            assert binom_ppf(q, n, p) == stats.binom.ppf(q, n, p)


def test_no_loadgen_module_imports_scipy_stats() -> None:
    code = (
        "import sys\n"
        "import loadgen.cli.run_cmd, loadgen.cli.report_cmd, loadgen.cli.gate_cmd, loadgen.cli.compare_cmd\n"
        "import loadgen.analysis.run_summary, loadgen.analysis.points, loadgen.analysis.saturation\n"
        "import loadgen.analysis.attainment, loadgen.conformance.bounds, loadgen.report.html\n"
        "print('scipy.stats' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
