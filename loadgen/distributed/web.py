"""Locust's web UI on a loadgen master (``--web``), fed through Locust's own request events.

Each worker fires one Locust ``request`` event per record it sends home (``request_events``):
request type ``E2E`` (``t_done - t_sched``) and, for a request that got a first token,
``TTFT`` (``t_first - t_sched``), named by model, with the output tokens as the response
length and a failed request's status as its exception. Locust's stats reporting carries
them to the master, whose web UI shows live request counts, failures and latency
percentiles per model. These are Locust's approximations, for watching a run; every
figure of record is computed from the records. Imported only by the master's and the
workers' control processes (it imports Locust).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from locust.env import Environment

__all__ = ["start_web", "request_events"]


def start_web(env: Environment, host: str, port: int) -> Any:
    """Serve Locust's web UI for ``env``'s master on ``host:port`` (loopback unless told otherwise)."""
    return env.create_web_ui(host=host, port=port)


def request_events(env: Environment, batch: pa.RecordBatch) -> None:
    """Fire Locust request events for the records of ``batch`` (see the module's note)."""
    cols = ("model", "status", "t_sched", "t_first", "t_done", "output_tokens")
    d = batch.select(cols).to_pydict()
    fire: Any = env.events.request.fire  # Locust's EventHook.fire is unannotated
    for model, status, t_sched, t_first, t_done, tokens in zip(*(d[c] for c in cols), strict=True):
        failure = None if status == "ok" else Exception(status)
        if t_done is not None:
            fire(
                request_type="E2E",
                name=model,
                response_time=(t_done - t_sched) / 1e6,
                response_length=tokens or 0,
                exception=failure,
                context={},
            )
        elif status != "ok":
            fire(request_type="E2E", name=model, response_time=0.0, response_length=0, exception=failure, context={})
        if t_first is not None:
            fire(
                request_type="TTFT",
                name=model,
                response_time=(t_first - t_sched) / 1e6,
                response_length=0,
                exception=None,
                context={},
            )
