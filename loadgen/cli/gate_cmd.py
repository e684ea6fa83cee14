"""``loadgen gate RUN_DIR --slo PROFILE``: PASS / FAIL / INCONCLUSIVE, as an exit code for CI.

Also the hooks ``run`` and ``sweep`` use for ``--slo PROFILE --gate``:
``add_gate_options`` adds the flags, ``gate_profile`` validates them before any
traffic is sent, and ``gate_after_run`` judges the finished run folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen.cli.command_secrets import secrets_of
from loadgen.errors import ConfigError
from loadgen.specfile import builtin_dir

if TYPE_CHECKING:
    from loadgen.analysis.metrics import SLO
    from loadgen.conformance.slo import Profile

EXIT_CODES = (
    "exit code 0 pass, 1 fail, 3 inconclusive (see --inconclusive; also when the run or the baseline "
    "is suspect or was interrupted: a verdict on suspect data is no verdict), 2 usage error"
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "gate",
        help="judge a run folder against an SLO profile (exit code for CI)",
        description="Judge every criterion of an SLO profile with confidence: PASS only when the confidence "
        "bound is inside the limit, FAIL when clearly outside, INCONCLUSIVE otherwise (with the "
        f"samples that would decide it). With --baseline, also fail regressions. {EXIT_CODES}.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run folder written by loadgen run / sweep")
    add_gate_options(p, standalone=True)
    p.set_defaults(func=main)


def add_gate_options(p: argparse.ArgumentParser, standalone: bool = False) -> None:
    """The gate's flags; without ``standalone`` (for run/sweep) also ``--gate``."""
    g = p.add_argument_group("SLO gate")
    names = ", ".join(profile_names()) or "none"
    try:
        g.add_argument(
            "--slo",
            metavar="PROFILE",
            required=standalone,
            default=None,
            help=f"SLO profile: a YAML file or a built-in name ({names}) (default: none: no verdict)",
        )
    except argparse.ArgumentError:
        pass  # the command has its own --slo (sweep: also per-request bounds); the gate reads the same value
    if not standalone:
        g.add_argument(
            "--gate", action="store_true", help=f"after the run, judge it against --slo and set the {EXIT_CODES}"
        )
    g.add_argument(
        "--baseline",
        metavar="RUN_DIR",
        default=None,
        help="also fail when a criterion's metric regressed against this run beyond --tolerance "
        "(default: none: no regression check)",
    )
    g.add_argument(
        "--tolerance",
        default="5%",
        metavar="PCT",
        help="relative change allowed against --baseline (default: %(default)s)",
    )
    g.add_argument(
        "--inconclusive",
        choices=("pass", "fail"),
        default=None,
        help="map an INCONCLUSIVE verdict to exit code 0 (pass) or 1 (fail) instead of 3 (default: none: exit 3)",
    )
    g.add_argument(
        "--junit",
        metavar="FILE",
        default=None,
        help="write JUnit XML, one testcase per criterion (default: not written)",
    )
    g.add_argument(
        "--markdown",
        metavar="FILE",
        default=None,
        help="write a Markdown summary (default: appended to $GITHUB_STEP_SUMMARY when set)",
    )
    g.add_argument("--json", metavar="FILE", default=None, help="write the verdicts as JSON (default: not written)")


def profile_names() -> list[str]:
    """The built-in profiles' names, found as ``slo.builtin_profiles`` finds them, without
    importing ``loadgen.slo`` (and the statistics it brings) to print a help text."""
    folder = builtin_dir("conformance")
    return [p.stem for p in sorted(folder.glob("*.yaml"))] if folder.is_dir() else []


def gate_profile(args: argparse.Namespace) -> Profile | None:
    """Validate the gate flags (profile, tolerance, baseline) before any traffic; None when not gating."""
    if getattr(args, "gate", False) and not getattr(args, "slo", None):
        raise ConfigError("--gate needs --slo PROFILE")
    if not getattr(args, "slo", None):
        return None
    if "=" in args.slo and not Path(args.slo).exists():  # sweep's inline bounds, e.g. ttft=200,e2e=2000
        if getattr(args, "gate", False):
            raise ConfigError(f"--gate needs an SLO profile (a file or built-in name), not inline bounds {args.slo!r}")
        return None
    from loadgen.conformance.gate import parse_tolerance  # the statistics come with it: only when judging
    from loadgen.conformance.slo import load_profile

    profile = load_profile(args.slo)
    parse_tolerance(args.tolerance)
    if args.baseline and not (Path(args.baseline) / "run.json").is_file():
        raise ConfigError(f"--baseline {args.baseline}: not a run folder (no run.json)")
    return profile


def slo_of(args: argparse.Namespace) -> SLO | None:
    """The profile's per-request SLO (for goodput and attainment in reports), if --slo was given."""
    profile = gate_profile(args)
    return profile.slo if profile else None


def gate_after_run(run_dir: Path, args: argparse.Namespace) -> int:
    """Judge a finished run folder; returns the exit code (0 when --gate was not asked for)."""
    if not getattr(args, "gate", True):
        return 0
    profile = gate_profile(args)
    if profile is None:
        return 0
    from loadgen.conformance.ci_outputs import print_outcome, write_outputs
    from loadgen.conformance.gate import gate_run, parse_tolerance

    outcome = gate_run(
        Path(run_dir),
        profile,
        baseline=Path(args.baseline) if args.baseline else None,
        tolerance=parse_tolerance(args.tolerance),
        inconclusive=args.inconclusive,
        secrets=secrets_of(args),  # a key an endpoint echoed into the run's error texts stays out
    )
    print_outcome(outcome)
    write_outputs(outcome, junit=args.junit, markdown=args.markdown, json=args.json)
    return outcome.exit_code


def main(args: argparse.Namespace) -> int:
    from loadgen.records import check_run_folder

    check_run_folder(Path(args.run_dir))  # before the profile and the statistics are loaded
    if gate_profile(args) is None:  # inline bounds: no criteria to judge, and silence must not read as a pass
        raise ConfigError(
            f"--slo {args.slo}: loadgen gate judges an SLO profile (a YAML file or a built-in name: "
            f"{', '.join(profile_names()) or 'none'}), not inline bounds"
        )
    return gate_after_run(Path(args.run_dir), args)
