"""``loadgen check``: is the endpoint OpenAI-compatible and honest? Exit 0 when nothing failed
(a WARN passes unless ``--strict``)."""

from __future__ import annotations

import argparse

from loadgen.cli.endpoint_flags import add_endpoint_options, endpoint_options_of, warn_insecure
from loadgen.cli.flags import bounded_int
from loadgen.cli.run_cmd import preflight
from loadgen.cli.run_flags import POSITIVE_SECONDS
from loadgen.cli.run_settings import resolve_endpoint
from loadgen.cli.sim_cmd import add_sim_options, sim_args
from loadgen.conformance.check_items import ITEMS, LEVELS, RESPONSES_ITEMS


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    items = {**ITEMS, **RESPONSES_ITEMS}
    fails = "; ".join(f"{k}: {v}" for k, v in items.items() if LEVELS[k] == "fail")
    warns = "; ".join(f"{k}: {v}" for k, v in items.items() if LEVELS[k] == "warn")
    p = sub.add_parser(
        "check",
        help="check an endpoint's OpenAI compatibility and honesty (stream, usage, limits, errors)",
        description="Send a battery of small requests and report each item pass / warn / fail / skip "
        "(inconclusive when the client was too busy to judge timing) with evidence. "
        "Exit code 0 when nothing failed, 1 when an item failed (or warned, with --strict), 2 on a usage error. "
        f"Items that FAIL (they break measurement or honesty): {fails}. "
        f"Items that WARN (API deviations loadgen measures through): {warns}.",
    )
    g = p.add_argument_group("target")
    g.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="OpenAI base URL (default: $OPENAI_BASE_URL, else the built-in simulator on loopback)",
    )
    g.add_argument("--model", default=None, help="model to ask for (default: the first /v1/models lists)")
    g.add_argument(
        "--api",
        choices=("chat", "responses"),
        default="chat",
        help="the battery: chat (the chat and completions routes) or responses (POST /v1/responses) "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="read the API key from $NAME (default $OPENAI_API_KEY); it is never written anywhere",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="the endpoint's tokenizer.json (or its folder): verifies usage exactly; without it "
        "output chunks are counted, which proves under-reporting but not over-reporting",
    )
    g.add_argument(
        "--timeout", type=POSITIVE_SECONDS, default=60.0, metavar="S", help="limit per request (default: %(default)g s)"
    )
    g.add_argument(
        "--streams",
        type=bounded_int(2, 10_000),
        default=8,
        help="concurrent streams for concurrent-streams (default: %(default)s streams)",
    )
    g.add_argument(
        "--max-tokens",
        type=bounded_int(16, 1_000_000),
        default=64,
        help="answer length asked for, at least 16 to show streaming; ignore-eos expects exactly this many "
        "(default: %(default)s tokens)",
    )
    g.add_argument(
        "--context-len",
        type=bounded_int(1, 100_000_000),
        default=None,
        metavar="TOKENS",
        help="the model's context length, for the over-long prompt (default: asked of the endpoint)",
    )
    g.add_argument(
        "--strict",
        action="store_true",
        help="a WARN (an API deviation) fails the check too, exit code 1 (default: off, a WARN passes)",
    )
    o = p.add_argument_group("outputs")
    o.add_argument(
        "--junit", metavar="FILE", default=None, help="write JUnit XML, one testcase per item (default: not written)"
    )
    o.add_argument(
        "--markdown",
        metavar="FILE",
        default=None,
        help="write a Markdown summary (default: appended to $GITHUB_STEP_SUMMARY when set)",
    )
    o.add_argument("--json", metavar="FILE", default=None, help="write the results as JSON (default: not written)")
    add_endpoint_options(p)
    add_sim_options(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import asyncio
    from dataclasses import replace

    from loadgen.client.run import target
    from loadgen.client.settings import api_key_from_env
    from loadgen.conformance.check import run_check
    from loadgen.conformance.check_client import CheckOptions
    from loadgen.conformance.ci_outputs import print_outcome, write_outputs
    from loadgen.workload.tokenizer import get_tokenizer

    preflight(args)  # the event loop and the simulator's options, before anything is started or sent
    tokenizer = get_tokenizer(args.tokenizer) if args.tokenizer else None
    api_key = api_key_from_env(args.api_key_env)
    http = endpoint_options_of(args)  # header values read now: a missing variable or file, before anything starts
    warn_insecure(http)
    with target(resolve_endpoint(args), sim_args(args)) as (url, is_sim):
        opts = CheckOptions(
            url=url,
            model=args.model,
            api_key=api_key,
            tokenizer=tokenizer,
            timeout_s=args.timeout,
            streams=args.streams,
            max_tokens=args.max_tokens,
            context_len=args.context_len,
            strict=args.strict,
            api=args.api,
            http=replace(http, proxies=False) if is_sim else http,
        )
        outcome = asyncio.run(run_check(opts))
    print_outcome(outcome)
    write_outputs(outcome, junit=args.junit, markdown=args.markdown, json=args.json)
    return outcome.exit_code
