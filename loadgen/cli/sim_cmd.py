"""``loadgen sim``: serve the simulated OpenAI-compatible engine."""

from __future__ import annotations

import argparse
import asyncio
import signal

from ..sim.faults import parse_faults
from ..sim.model import FixedModel, TimingModel
from ..sim.process import READY
from ..sim.server import SimConfig, SimServer


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="serve the built-in simulated inference engine",
                       description="Serve an OpenAI-compatible API whose timing comes from a model.")
    add_sim_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0 picks a free one)")
    p.add_argument("--announce", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=main)


def add_sim_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("simulated engine")
    g.add_argument("--ttft-ms", type=float, default=None,
                   help="fixed-latency model: time to first token (with --itl-ms)")
    g.add_argument("--itl-ms", type=float, default=None, help="fixed-latency model: time between tokens")
    g.add_argument("--served-model-name", default=None, help="model name the server answers to")
    g.add_argument("--truth", default=None, metavar="FILE",
                   help="write one JSON line per request: arrival, queue wait, every token's emission time")
    g.add_argument("--faults", default=None, metavar="SPEC",
                   help="inject faults, e.g. http500=0.05,http429=0.02:1.5,disconnect=0.05,"
                        "stall=0.02:2,malformed=0.01,usage_under=0.5,buffered,ignore_max_tokens")
    g.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per streamed chunk")
    g.add_argument("--max-model-len", type=int, default=131072, help="context length")


def sim_args(args: argparse.Namespace) -> list[str]:
    """The command-line flags that recreate these simulator options in a subprocess."""
    out: list[str] = []
    for flag, value in (
        ("--ttft-ms", args.ttft_ms), ("--itl-ms", args.itl_ms), ("--served-model-name", args.served_model_name),
        ("--truth", args.truth), ("--faults", args.faults), ("--tokens-per-chunk", args.tokens_per_chunk),
        ("--max-model-len", args.max_model_len),
    ):
        if value is not None:
            out += [flag, str(value)]
    return out


def build_server(args: argparse.Namespace) -> SimServer:
    model: TimingModel
    model = FixedModel((args.ttft_ms if args.ttft_ms is not None else 50.0) / 1e3,
                       (args.itl_ms if args.itl_ms is not None else 10.0) / 1e3)
    name = args.served_model_name or "sim"
    cfg = SimConfig(model_name=name, max_model_len=args.max_model_len, tokens_per_chunk=args.tokens_per_chunk,
                    faults=parse_faults(args.faults), truth_path=args.truth)
    return SimServer(model, cfg)


async def serve(args: argparse.Namespace) -> None:
    server = build_server(args)
    url = await server.start(args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.announce:
        print(READY + url, flush=True)
    else:
        print(f"loadgen sim serving {server.config.model_name} at {url} (Ctrl-C to stop)", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0
