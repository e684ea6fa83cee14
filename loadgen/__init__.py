"""loadgen: an open-loop load generator and honest meter for OpenAI-compatible LLM endpoints.

This module is the public API: what a notebook or a CI script needs, every name in
``__all__`` and nothing else (every other module is private and may move). The CLI
is a thin shell over the same functions: ``run_point`` and ``run_sweep`` produce
run folders, ``read_run`` folds a folder's records into its figures, ``gate_run``
and ``compare_runs`` judge them, and ``simulator`` serves the built-in simulated
engine in-process, so any of them works without an endpoint::

    import loadgen

    with loadgen.simulator() as url:
        settings = loadgen.RunSettings(endpoint=url, model=None, arrival=loadgen.Arrival("poisson", rate=4.0),
                                       duration_s=10.0)
        run = loadgen.run_point(settings, "runs/first")
    print(run.points[0].summary.ttft.pct(99))

Importing ``loadgen`` imports nothing heavy and installs nothing (no event-loop
policy, no logging handlers): names are resolved on first use, from the modules
``_HOMES`` names, so ``loadgen --help`` stays fast.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadgen.analysis.compare import Comparison, compare_runs
    from loadgen.analysis.points import RunAnalysis
    from loadgen.client.config import Timeouts
    from loadgen.client.settings import RunSettings
    from loadgen.conformance.ci_outputs import Outcome
    from loadgen.conformance.slo import Profile, load_profile
    from loadgen.errors import LoadgenError
    from loadgen.schedule import Arrival
    from loadgen.sim.answer import SimConfig
    from loadgen.sim.model import FixedModel, TimingModel
    from loadgen.sim.roofline import RooflineModel
    from loadgen.sweep.plan import SweepPlan
    from loadgen.sweep.run import SweepSettings
    from loadgen.sweep.search import AutoSearch
    from loadgen.sweep.sizing import Sizing
    from loadgen.workload.base import SyntheticChat, Workload
    from loadgen.workload.load import load_workload

try:
    __version__ = importlib.metadata.version("loadgen")  # one source: pyproject.toml
except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Arrival",
    "AutoSearch",
    "Comparison",
    "FixedModel",
    "LoadgenError",
    "Outcome",
    "Profile",
    "RooflineModel",
    "RunAnalysis",
    "RunSettings",
    "SimConfig",
    "Sizing",
    "SweepPlan",
    "SweepSettings",
    "SyntheticChat",
    "Timeouts",
    "__version__",
    "compare_runs",
    "gate_run",
    "load_profile",
    "load_workload",
    "read_run",
    "run_point",
    "run_sweep",
    "simulator",
]

# Where each re-exported name lives; the API functions below are this module's own.
_HOMES = {
    "Arrival": "loadgen.schedule",
    "AutoSearch": "loadgen.sweep.search",
    "Sizing": "loadgen.sweep.sizing",
    "Comparison": "loadgen.analysis.compare",
    "FixedModel": "loadgen.sim.model",
    "LoadgenError": "loadgen.errors",
    "Outcome": "loadgen.conformance.ci_outputs",
    "Profile": "loadgen.conformance.slo",
    "RooflineModel": "loadgen.sim.roofline",
    "RunAnalysis": "loadgen.analysis.points",
    "RunSettings": "loadgen.client.settings",
    "SimConfig": "loadgen.sim.answer",
    "SweepPlan": "loadgen.sweep.plan",
    "SweepSettings": "loadgen.sweep.run",
    "SyntheticChat": "loadgen.workload.base",
    "Timeouts": "loadgen.client.config",
    "compare_runs": "loadgen.analysis.compare",
    "load_profile": "loadgen.conformance.slo",
    "load_workload": "loadgen.workload.load",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'loadgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def read_run(run_dir: str | Path, **options: Any) -> RunAnalysis:
    """A run folder's records and every load point's figures over the run's own measurement window.

    The figures are the report's: ``loadgen report`` and report.html are renderings of
    this same analysis. ``options`` (``slo``, ``gpus``, ``prices``, ``lag_limit_ms``, ...)
    override what run.json recorded.
    """
    from loadgen.analysis.points import analyze_run

    return analyze_run(Path(run_dir), **options)


def run_point(
    settings: RunSettings,
    out: str | Path,
    *,
    workload: Workload | None = None,
    api_key: str | None = None,
    sim_flags: Sequence[str] = (),
    force: bool = False,
) -> RunAnalysis:
    """Send one load point and write its run folder at ``out``; returns ``read_run(out)``.

    ``settings.endpoint`` None starts the built-in simulator (``sim_flags`` as for
    ``loadgen sim``) for the run. ``workload`` defaults to chat with 256 input and 128
    output tokens, under a fresh salt (prefix caches start cold). The API key is sent, never
    written. A folder that already holds a run is refused unless ``force``.
    """
    from loadgen.analysis.run_summary import summarize_run
    from loadgen.client.run import execute
    from loadgen.workload.base import SyntheticChat
    from loadgen.workload.salt import new_salt

    folder = Path(out)
    chosen = workload or SyntheticChat(256, 128, salt=new_salt())
    execute(settings, chosen, folder, api_key=api_key, sim_flags=list(sim_flags), force=force)
    summarize_run(folder, lag_limit_ms=settings.lag_limit_ms)  # summary.json, as `loadgen run` writes it
    return read_run(folder)


def run_sweep(
    settings: SweepSettings,
    out: str | Path,
    *,
    workload: str | Path = "chat",
    api_key: str | None = None,
    sim_flags: Sequence[str] = (),
) -> RunAnalysis:
    """Send every load point of ``settings.plan`` (a list, or the automatic search) into one run folder.

    ``workload`` is a built-in spec name or a spec file; each point gets its own salt
    so no point warms another's prefix cache (``SweepSettings.point_salt``).
    """
    from loadgen.sweep.run import run_sweep as send
    from loadgen.workload.load import load_workload

    folder = Path(out)
    seed = settings.base.seed
    send(
        settings,
        lambda salt: load_workload(str(workload), seed=seed, salt=salt),
        folder,
        api_key=api_key,
        sim_flags=list(sim_flags),
    )
    return read_run(folder)


def gate_run(
    run_dir: str | Path,
    slo: str | Path | Profile,
    *,
    baseline: str | Path | None = None,
    tolerance: float = 0.05,
) -> Outcome:
    """PASS / FAIL / INCONCLUSIVE per criterion of the SLO profile (a built-in name, a file or a Profile).

    ``Outcome.exit_code`` is what ``loadgen gate`` exits with: 0 pass, 1 fail, 3 inconclusive.
    """
    from loadgen.conformance.gate import gate_run as judge
    from loadgen.conformance.slo import Profile, load_profile

    profile = slo if isinstance(slo, Profile) else load_profile(slo)
    return judge(Path(run_dir), profile, baseline=Path(baseline) if baseline else None, tolerance=tolerance)


@contextmanager
def simulator(model: TimingModel | None = None, config: SimConfig | None = None) -> Iterator[str]:
    """Serve the simulated OpenAI-compatible engine on loopback in this process; yields its base URL.

    ``model`` defaults to fixed timing (``FixedModel``); ``RooflineModel("h100",
    "llama-3.1-8b")`` models continuous batching on a GPU as ``loadgen sim`` does. The
    server runs on its own thread and event loop and stops when the block ends.
    """
    from loadgen.sim.server import SimServer
    from loadgen.sim.thread import serve_in_thread

    with serve_in_thread(SimServer(model, config)) as url:
        yield url
