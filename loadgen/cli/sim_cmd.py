"""``loadgen sim``: serve the simulated OpenAI-compatible engine.

The same options are offered by ``run``, ``sweep`` and ``check`` (prefixed
``--sim-``) for the simulator they start when given no endpoint.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen.cli.flags import PORT, bounded_int, finite_float
from loadgen.errors import ConfigError

if TYPE_CHECKING:
    from loadgen.sim.answer import SimConfig
    from loadgen.sim.model import TimingModel
    from loadgen.sim.server import SimServer

_HOUR_MS = 3.6e6
_COUNT = bounded_int(1, 100_000_000)  # sequences, tokens: far beyond any engine, near enough to catch a typo
_CHUNK_MAX = 4096  # tokens in one chunk: far beyond any stream interval or draft length
_SHAPES = ("vllm", "sglang", "llamacpp")  # loadgen.sim.tool_calls.TOOL_SHAPES (not imported: --help stays fast)


def _chunk_range(text: str) -> str:
    """An argparse ``type``: ``N`` or ``LO-HI`` tokens per chunk (1 <= LO <= HI), as its normal form."""
    lo_text, _, hi_text = text.partition("-")
    try:
        lo, hi = int(lo_text), int(hi_text or lo_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or LO-HI tokens, e.g. 1 or 2-4") from None
    if not 1 <= lo <= hi <= _CHUNK_MAX:
        raise argparse.ArgumentTypeError(f"{text}: give 1 <= LO <= HI <= {_CHUNK_MAX} tokens")
    return str(lo) if lo == hi else f"{lo}-{hi}"


_chunk_range.__name__ = "tokens"

# (flag without prefix, dest suffix, type, default, help); every help states its default and unit
# (tests/test_help_defaults.py), and "--" in it names the same command's flag (--sim- under run)
_OPTIONS: tuple[tuple[str, str, Callable[[str], Any], object, str], ...] = (
    ("gpu", "gpu", str, "h100", "GPU profile: h100, h200, b200, mi300x, a100 or a YAML file (default: %(default)s)"),
    (
        "model",
        "model",
        str,
        "llama-3.1-8b",
        "model profile: llama-3.1-8b, llama-3.1-70b, mixtral-8x7b, deepseek-v3, gpt-oss-120b or a YAML file "
        "(default: %(default)s)",
    ),
    ("tp", "tp", bounded_int(1, 1024), 1, "tensor-parallel degree (default: %(default)s GPU)"),
    ("max-num-seqs", "max_num_seqs", _COUNT, 256, "most sequences running at once (default: %(default)s sequences)"),
    (
        "max-batch-tokens",
        "max_batch_tokens",
        _COUNT,
        8192,
        "token budget per engine step, chunked prefill (default: %(default)s tokens)",
    ),
    (
        "kv-util",
        "kv_util",
        finite_float(0, 1, above=True),
        0.9,
        "fraction of GPU memory for weights + KV cache (default: %(default)s of the memory)",
    ),
    ("prefix-cache", "prefix_cache", str, "on", "prefix caching: on | off (default: %(default)s)"),
    ("weight-dtype", "weight_dtype", str, None, "bf16 | fp8 | fp4 (default: the model profile's)"),
    ("kv-dtype", "kv_dtype", str, "bf16", "KV cache type: bf16 | fp8 (default: %(default)s)"),
    (
        "ttft-ms",
        "ttft_ms",
        finite_float(0, _HOUR_MS),
        None,
        "fixed-latency model instead of the roofline: time to first token, ms "
        "(default: off; 50 ms when only --itl-ms is given)",
    ),
    (
        "itl-ms",
        "itl_ms",
        finite_float(0, _HOUR_MS),
        None,
        "fixed-latency model: time between tokens, ms (default: off; 10 ms when only --ttft-ms is given)",
    ),
    (
        "served-model-name",
        "served_model_name",
        str,
        None,
        "model name the server answers to (default: the model profile's; sim for the fixed-latency model)",
    ),
    (
        "truth",
        "truth",
        str,
        None,
        "write one JSON line per request to this file: arrival, queue wait, each token's time (default: off)",
    ),
    (
        "faults",
        "faults",
        str,
        None,
        "inject faults, e.g. http500=0.05,http429=0.02:1.5,disconnect=0.05,"
        "stall=0.02:2,malformed=0.01,usage_under=0.5,buffered,ignore_max_tokens (default: none)",
    ),
    (
        "tokens-per-chunk",
        "tokens_per_chunk",
        _chunk_range,
        "1",
        "tokens per streamed chunk: N, or LO-HI for a size drawn per chunk as speculative decoding "
        "produces (default: %(default)s token)",
    ),
    (
        "tool-calls",
        "tool_calls",
        finite_float(0, 1),
        0.0,
        "share of chat answers that are a tool call (their words are its arguments), chosen per "
        "request (default: %(default)s of the answers)",
    ),
    (
        "tool-call-shape",
        "tool_call_shape",
        str,
        "vllm",
        "whose stream a tool call has the shape of: vllm | sglang | llamacpp (default: %(default)s)",
    ),
    (
        "max-model-len",
        "max_model_len",
        _COUNT,
        None,
        "context length, tokens (default: the model's, capped by the KV cache)",
    ),
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sim",
        help="serve the built-in simulated inference engine",
        description="Serve an OpenAI-compatible API whose timing comes from a roofline model "
        "of continuous batching on a named GPU and model.",
    )
    add_sim_options(p, prefix="")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument(
        "--port", type=PORT, default=8000, help="port to listen on; 0 picks a free one (default: %(default)s)"
    )
    p.add_argument("--announce", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--replicas",
        type=bounded_int(1, 256),
        default=1,
        help="independent simulated engines, one process each, behind the one port (SO_REUSEPORT: the kernel "
        "spreads connections at random, as a data-parallel deployment); each reports its own ground truth "
        "and metrics (default: %(default)s replica)",
    )
    # a replica of `--replicas` (sim/replicas.py): shares the port, listens on one of its own too
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=main)


def add_sim_options(p: argparse.ArgumentParser, prefix: str = "sim-") -> None:
    title = "simulated engine" + (" (used when no --endpoint is given)" if prefix else "")
    g = p.add_argument_group(title)
    for flag, dest, kind, default, text in _OPTIONS:
        choices = {"prefix_cache": ("on", "off"), "tool_call_shape": _SHAPES}.get(dest)
        shown = text.replace("--", f"--{prefix}")  # the other fixed-latency flag, as this command spells it
        g.add_argument(
            f"--{prefix}{flag}",
            dest=f"sim_{dest}",
            type=kind,
            default=default,
            choices=choices,
            metavar=None if choices else dest.upper(),
            help=shown,
        )
    p.set_defaults(sim_prefix=prefix)


def sim_args(args: argparse.Namespace) -> list[str]:
    """The ``loadgen sim`` flags that recreate these options in a subprocess."""
    out: list[str] = []
    for flag, dest, _, default, _ in _OPTIONS:
        value = getattr(args, f"sim_{dest}", default)
        if value is not None and value != default:
            out += [f"--{flag}", str(value)]
    return out


def check_sim_options(args: argparse.Namespace) -> None:
    """Refuse bad simulator options in this process, before a simulator is started (or anything
    sent): its own failure to start would come back only as the child's stderr."""
    if sim_args(args):  # the defaults are good
        sim_config(args)


def build_model(args: argparse.Namespace) -> tuple[TimingModel, str, int]:
    """The timing model, its served name and context length, from parsed options."""
    from loadgen.sim.model import FixedModel

    if args.sim_ttft_ms is not None or args.sim_itl_ms is not None:
        ttft = 50.0 if args.sim_ttft_ms is None else args.sim_ttft_ms
        itl = 10.0 if args.sim_itl_ms is None else args.sim_itl_ms
        return FixedModel(ttft / 1e3, itl / 1e3), "sim", 131072
    from loadgen.sim.roofline import RooflineModel

    try:
        model = RooflineModel(
            args.sim_gpu,
            args.sim_model,
            tp=args.sim_tp,
            max_num_seqs=args.sim_max_num_seqs,
            max_batch_tokens=args.sim_max_batch_tokens,
            kv_util=args.sim_kv_util,
            prefix_cache=args.sim_prefix_cache == "on",
            weight_dtype=args.sim_weight_dtype,
            kv_dtype=args.sim_kv_dtype,
        )
    except UnicodeDecodeError as e:  # a profile file that is not text (the error names no file)
        p = args.sim_prefix
        raise ConfigError(
            f"--{p}gpu {args.sim_gpu} / --{p}model {args.sim_model}: a profile is not UTF-8 text ({e.reason})"
        ) from None
    except ValueError as e:  # the model's own checks on its numbers (tp, kv_util, ...); profile errors are SpecErrors
        raise ConfigError(str(e)) from None
    return model, model.model.name, model.max_model_len


def sim_config(args: argparse.Namespace) -> tuple[TimingModel, SimConfig]:
    """The timing model and what the server answers with, from parsed options; ConfigError if they are bad."""
    from loadgen.sim.answer import SimConfig
    from loadgen.sim.faults import FaultSpecError, parse_faults

    model, name, max_len = build_model(args)
    try:
        faults = parse_faults(args.sim_faults)
    except FaultSpecError as e:  # it names --faults; here the flag may be --sim-faults
        raise ConfigError(str(e).replace("--faults", f"--{args.sim_prefix}faults", 1)) from None
    if args.sim_max_model_len is not None:
        max_len = min(max_len, args.sim_max_model_len)
    truth = args.sim_truth
    if truth is not None and (Path(truth).is_dir() or not Path(truth).parent.is_dir()):
        raise ConfigError(f"--{args.sim_prefix}truth {truth}: needs a file path in an existing folder")
    lo, _, hi = str(args.sim_tokens_per_chunk).partition("-")
    cfg = SimConfig(
        model_name=args.sim_served_model_name or name,
        max_model_len=max_len,
        tokens_per_chunk=int(lo),
        tokens_per_chunk_max=int(hi or lo),
        faults=faults,
        truth_path=truth,
        tool_calls=args.sim_tool_calls,
        tool_call_shape=args.sim_tool_call_shape,
    )
    return model, cfg


def build_server(args: argparse.Namespace) -> SimServer:
    from loadgen.sim.server import SimServer

    return SimServer(*sim_config(args))


async def serve(args: argparse.Namespace) -> None:
    import asyncio
    import signal

    from loadgen.sim.process import READY

    server = build_server(args)
    url = await server.start(args.host, args.port, reuse_port=args.reuse_port)
    own = await server.also_listen(args.host) if args.reuse_port else ""  # a replica's own address
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.announce:
        print(READY + url + (f" {own}" if own else ""), flush=True)
    else:
        print(f"loadgen sim serving {server.config.model_name} at {url} (Ctrl-C to stop)", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
        stats = server.model.stats()
        if stats.get("late_steps_total"):
            print(
                f"loadgen sim: the simulator fell behind its own model on {int(stats['late_steps_total'])} "
                f"steps (up to {stats.get('max_lateness_seconds', 0) * 1e3:.1f} ms late)",
                file=sys.stderr,
            )


def main(args: argparse.Namespace) -> int:
    # the client's loop (clock.py): uvloop where installed, LOADGEN_LOOP to force one; what it
    # changes for the simulator's capacity is in docs/simulator.md §7
    from loadgen import clock

    clock.loop_name()  # LOADGEN_LOOP is valid (a LoopError otherwise), before the coroutine is made
    if args.replicas > 1:
        from loadgen.sim.replicas import serve_replicas

        check_sim_options(args)  # refused here, once, before N processes start
        flags = sim_args(argparse.Namespace(**{**vars(args), "sim_truth": None}))  # each replica's truth is its own
        return serve_replicas(
            args.replicas, flags, host=args.host, port=args.port, truth=args.sim_truth, announce=args.announce
        )
    clock.run(serve(args))
    return 0
