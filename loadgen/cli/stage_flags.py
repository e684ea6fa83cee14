"""The flags of a pipeline's stage endpoints (the rag-pipeline workload), shared by ``run`` and ``sweep``.

``--endpoint-embed``/``--endpoint-rerank`` send a stage to a service of its own (an OpenAI-style
base URL, as ``--endpoint``), ``--model-embed``/``--model-rerank`` name its model; a stage left
without sends to the run's endpoint and model (client.stages).
"""

from __future__ import annotations

import argparse

__all__ = ["add_stage_options", "stages_of"]

_STAGES = ("embed", "rerank")


def add_stage_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pipeline stages (--workload rag-pipeline)")
    for stage, api in (("embed", "/embeddings"), ("rerank", "/rerank")):
        g.add_argument(
            f"--endpoint-{stage}",
            metavar="URL",
            help=f"base URL of the {stage} stage's service (its requests go to URL{api}; default: --endpoint)",
        )
        g.add_argument(f"--model-{stage}", metavar="NAME", help=f"the {stage} stage's model (default: --model)")


def stages_of(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """The stages given endpoints and models of their own: (stage -> URL, stage -> model)."""
    urls = {s: v for s in _STAGES if (v := getattr(args, f"endpoint_{s}", None))}
    models = {s: v for s in _STAGES if (v := getattr(args, f"model_{s}", None))}
    return urls, models
