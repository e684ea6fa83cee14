"""The flags ``loadgen run`` and ``loadgen sweep`` share: target, traffic, counting, timing, output.

Their defaults are ``RunSettings``'s and ``Timeouts``'s (read from the dataclasses, not
repeated here); each value is checked by its argparse type as the line is parsed, and again
by ``RunSettings`` when it is built (``cli.run_settings``).
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any

from loadgen.cli.endpoint_flags import add_endpoint_options, add_transport_option
from loadgen.cli.flags import bounded_int, finite_float
from loadgen.cli.stage_flags import add_stage_options
from loadgen.cli.virtual_flags import add_virtual_option
from loadgen.client.config import APIS, MAX_INFLIGHT, Timeouts
from loadgen.client.endpoint_options import MAX_TOKENS_FIELDS
from loadgen.client.settings import (
    MAX_DURATION_S,
    MAX_SEED,
    MAX_WORKERS,
    PER_CHUNK_USAGE,
    RunSettings,
)

if TYPE_CHECKING:
    pass


RUN_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(RunSettings) if f.default is not MISSING}
TIMEOUT_DEFAULTS = Timeouts()
MAX_TOKENS = 10_000_000  # prompt or answer length: longer than any model's context
INPUT_TOKENS, OUTPUT_TOKENS = 512, 128  # the synthetic chat sent without --workload
SECONDS = finite_float(0, MAX_DURATION_S, unit=" seconds")
POSITIVE_SECONDS = finite_float(0, MAX_DURATION_S, above=True, unit=" seconds")
LAG_MS = finite_float(0, 3.6e6, above=True, unit=" ms")

EXIT_CODES = """\
exit codes:
  0    done (and the --gate verdict, if any, is PASS)
  1    --gate verdict FAIL
  2    usage error or bad input: nothing was sent
  3    --gate verdict INCONCLUSIVE: a suspect run would decide it
  4    every request failed: one line names the most common failure and its count
  130  stopped by SIGINT (Ctrl-C): sending stopped, answers in flight drained, everything written
  143  stopped by SIGTERM: the same

A second Ctrl-C (or SIGTERM) ends the drain at once: what is still in flight is recorded
as cancelled, what was never sent as not_sent."""


def add_target_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL, "
        "else the built-in simulator started on loopback)",
    )
    g.add_argument("--model", default=None, help="model to ask for (default: the first /v1/models lists)")
    g.add_argument(
        "--api",
        choices=APIS,
        default=RUN_DEFAULTS["api"],
        help="API to call: chat, completions, responses (the Responses API, POST /v1/responses), "
        "embeddings or rerank (one JSON answer: latency and inputs/s, no tokens streamed) (default: %(default)s)",
    )
    g.add_argument(
        "--server-metrics",
        default=RUN_DEFAULTS["server_metrics"],
        metavar="URL|off",
        help="scrape the server's Prometheus metrics every second into server_metrics.jsonl "
        "(default: the endpoint's /metrics, when it answers)",
    )
    g.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="read the API key from $NAME (default $OPENAI_API_KEY); it is never written anywhere",
    )
    g.add_argument(
        "--max-tokens-field",
        choices=MAX_TOKENS_FIELDS,
        default=RUN_DEFAULTS["max_tokens_field"],
        help="the request field of the answer's length; newer OpenAI-style servers want "
        "max_completion_tokens (default: %(default)s)",
    )
    g.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="skip the checks before the schedule (the model is listed by /models, one tiny request "
        "is not refused with HTTP 401, 403 or 404)",
    )
    add_endpoint_options(p)
    add_transport_option(p)
    add_stage_options(p)
    add_virtual_option(p)


def add_traffic_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("traffic")
    g.add_argument(
        "--salt",
        default=None,
        metavar="S",
        help="prompt salt (default: a fresh random one per run, recorded in run.json, so prefix caches "
        "start cold); S replays a run's exact prompts; 'none' sends them unsalted (warm caches on purpose)",
    )
    g.add_argument(
        "--workload",
        default=None,
        metavar="NAME|PATH",
        help="workload spec (built-in name or YAML file); default: fixed-length chat "
        "from --input-tokens/--output-tokens",
    )
    tokens = bounded_int(1, MAX_TOKENS)
    g.add_argument(
        "--input-tokens", type=tokens, default=None, help=f"prompt length in tokens (default {INPUT_TOKENS})"
    )
    g.add_argument(
        "--output-tokens", type=tokens, default=None, help=f"answer length in tokens (default {OUTPUT_TOKENS})"
    )
    g.add_argument(
        "--batch-size",
        type=bounded_int(1, 4096),
        default=None,
        metavar="N",
        help="inputs per request for --api embeddings, documents per query for --api rerank (default 1)",
    )
    g.add_argument(
        "--seed",
        type=bounded_int(0, MAX_SEED),
        default=RUN_DEFAULTS["seed"],
        help="seed of schedule and workload: same seed, same traffic (default: %(default)s)",
    )
    g.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not send ignore_eos (answers may end before the requested length)",
    )
    g.add_argument(
        "--extra-body",
        default=None,
        metavar="JSON",
        help="extra JSON fields merged into every request body (default: none)",
    )


def add_counting_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("token counting")
    g.add_argument(
        "--per-chunk-usage",
        choices=PER_CHUNK_USAGE,
        default=RUN_DEFAULTS["per_chunk_usage"],
        help="ask for running usage on every chunk (stream_options.continuous_usage_stats), which gives "
        "each chunk its exact token count: auto probes the endpoint with one tiny request first (once "
        "per endpoint), on asks without probing, off never asks (default: %(default)s)",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH|builtin|none",
        help="without running usage, count each chunk's text with this tokenizer (a Hugging Face "
        "tokenizer.json or its folder; builtin: loadgen's approximate one); prompts are still built by "
        "the workload's own (default: the workload spec's tokenizer file, if it names one; else none: "
        "the final usage is spread evenly over the chunks)",
    )


def add_timing_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("timeouts and limits")
    t = TIMEOUT_DEFAULTS
    g.add_argument(
        "--connect-timeout",
        type=POSITIVE_SECONDS,
        default=t.connect,
        metavar="S",
        help="longest wait to connect (default: %(default)g s)",
    )
    g.add_argument(
        "--first-byte-timeout",
        type=POSITIVE_SECONDS,
        default=t.first_byte,
        metavar="S",
        help="longest wait for the first output token of an answer, queueing included (SSE comments, "
        "keep-alives, role and tool-call-header chunks do not count) (default: %(default)g s)",
    )
    g.add_argument(
        "--idle-timeout",
        type=POSITIVE_SECONDS,
        default=t.idle,
        metavar="S",
        help="longest gap between two reads of an answer once its body began (any bytes count, "
        "comments included) (default: %(default)g s)",
    )
    g.add_argument(
        "--request-timeout",
        type=POSITIVE_SECONDS,
        default=t.total,
        metavar="S",
        help="total time per request (default: %(default)g s)",
    )
    g.add_argument(
        "--max-inflight",
        type=bounded_int(1, MAX_INFLIGHT),
        default=RUN_DEFAULTS["max_inflight"],
        help="safety cap on requests in flight; reaching it is reported as a distortion "
        "(default: %(default)s requests)",
    )
    g.add_argument(
        "--drain",
        type=SECONDS,
        default=RUN_DEFAULTS["drain_s"],
        metavar="S",
        help="after the last scheduled send (or Ctrl-C), wait this long for answers in flight (default: %(default)g s)",
    )
    g.add_argument(
        "--lag-limit-ms",
        type=LAG_MS,
        default=RUN_DEFAULTS["lag_limit_ms"],
        help="schedule lag p99 above this marks the result suspect (default: %(default)g ms)",
    )
    g.add_argument(
        "--workers",
        type=bounded_int(1, MAX_WORKERS),
        default=RUN_DEFAULTS["workers"],
        help="client processes sharing the schedule, for more load than one core can time "
        "(default: %(default)s process)",
    )


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, metavar="DIR", help="run folder (default runs/<run id>)")
    p.add_argument(
        "--force",
        action="store_true",
        help="let --out replace a run already in that folder (default: refuse)",
    )
    p.add_argument("--no-live", dest="live", action="store_false", help="no live view while running")
    p.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help="write no report.html (records, run.json and summary.json are written; `loadgen report DIR` "
        "makes the report later, from the records alone)",
    )
