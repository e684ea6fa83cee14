"""Before any traffic: the model exists and the route and key work, or one line says why not.

``preflight`` settles what a run (or a sweep) sends to, with the run's endpoint options
(headers, key header, TLS, proxy), before the schedule starts:

1. The model. Not given: the first one ``GET /models`` lists (``discover_model``). Given:
   the same request, and a model the endpoint does not list is refused with the names it
   does list (at most ``SHOWN_MODELS`` of them); an answer that is not 200, or lists nothing
   usable, or none at all within the run's connect and first-byte timeouts (10 s at most),
   leaves the model as given (many gateways have no ``/models``).
2. The route and the key. The per-chunk usage probe (``client.usage_probe``, one tiny
   request) is sent anyway when its flag decided without it; a 401, 403 or 404 to it is one
   line (``POST .../chat/completions answered HTTP 404: ...; check --endpoint and --api``)
   instead of a schedule of failures. Any other answer lets the run go on: what the requests
   meet is then the run's to record.

``--no-preflight`` (``RunSettings.preflight`` False) skips both checks, not the discovery of a
model that was not given. The built-in simulator is not checked (it serves any model name). A
pipeline's stage endpoints and models (``--endpoint-embed``, ``--model-rerank``, ...) are checked
as step 1 checks the run's. Each failure is an ``EndpointError``: exit code 2, nothing sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from loadgen.client.config import api_path
from loadgen.client.endpoint import MODELS_TIMEOUT_S, discover_model, endpoint_label, fetch_models, model_ids
from loadgen.client.settings import RunSettings
from loadgen.client.usage_probe import PerChunkUsage, detect, send_probe
from loadgen.errors import EndpointError
from loadgen.redaction import Secrets

__all__ = ["preflight", "check_listed", "check_route", "SHOWN_MODELS"]

SHOWN_MODELS = 10  # of a long list of models, the error line names this many
# The built-in simulator sends one token a chunk unless told otherwise: the final usage then
# gives every chunk's count exactly, and asking for running usage would only cost it (and the
# client) a usage object per token, enough to make it fall behind its own model at a sweep's top.
SIM_CHUNK_FLAG = "--tokens-per-chunk"
SIM_ONE_TOKEN = "the built-in simulator sends one token a chunk: the final usage counts each chunk exactly"
_NO_ROUTE = {404: "check --endpoint and --api"}
_NO_KEY = "check the API key (--api-key-env, --api-key-header) and -H headers"


def preflight(
    settings: RunSettings,
    url: str,
    *,
    is_sim: bool,
    api_key: str | None,
    run_id: str = "",
    secrets: Secrets | None = None,
    sim_flags: Sequence[str] = (),
) -> tuple[str, PerChunkUsage]:
    """The model to send to and the per-chunk usage decision, both checked (module doc)."""
    secrets = secrets if secrets is not None else settings.http.secrets(api_key, url, settings.stage_endpoints.values())
    check = settings.preflight and not is_sim
    model = settings.model
    if model is None:
        model = asyncio.run(discover_model(url, api_key, http=settings.http, secrets=secrets))
    elif check:
        check_listed(settings, url, model, api_key=api_key, secrets=secrets)
    for stage in sorted({*settings.stage_endpoints, *settings.stage_models}) if settings.preflight else ():
        # a pipeline's stages with endpoints or models of their own (client.stages); a stage on the
        # built-in simulator is not checked
        own = settings.stage_endpoints.get(stage)
        if own is not None or not is_sim:
            name = settings.stage_models.get(stage, model)
            check_listed(settings, own or url, name, api_key=api_key, secrets=secrets, flag=f"--model-{stage}")
    if is_sim and settings.per_chunk_usage == "auto" and SIM_CHUNK_FLAG not in sim_flags:
        usage = PerChunkUsage(False, "sim", None, SIM_ONE_TOKEN)
    else:
        usage = detect(settings, url, model, api_key=api_key, run_id=run_id, secrets=secrets)
    if check:
        sent = usage if usage.how == "probe" else None
        if sent is None:
            sent = send_probe(
                settings, url, model, api_key=api_key, run_id=run_id, secrets=secrets, continuous_usage=usage.asked
            )
        check_route(sent, url, settings.api)
    return model, usage


def check_listed(
    settings: RunSettings, url: str, model: str, *, api_key: str | None, secrets: Secrets, flag: str = "--model"
) -> None:
    """Refuse ``model`` (given by ``flag``) when ``/models`` answers with a list of usable names without it."""
    t = settings.timeouts
    bound = min(MODELS_TIMEOUT_S, t.connect + t.first_byte, t.total)
    try:
        status, body = asyncio.run(fetch_models(url, api_key, bound, http=settings.http, secrets=secrets))
    except EndpointError:  # no answer, or too long a one: the tiny request (and then the run) will say
        return
    listed = model_ids(body) if status == 200 else []
    if not listed or model in listed:
        return
    names = ", ".join(listed[:SHOWN_MODELS])
    more = f" and {len(listed) - SHOWN_MODELS:,} more" if len(listed) > SHOWN_MODELS else ""
    raise EndpointError(
        f"{flag} {model}: {endpoint_label(url)}/models does not list it; it lists {names}{more} "
        "(pass one of them, or --no-preflight to send anyway)"
    )


def check_route(answer: PerChunkUsage, url: str, api: str) -> None:
    """Refuse a run whose tiny request was answered 401, 403 or 404."""
    status = answer.status
    if status not in (401, 403, 404):
        return
    said = f": {answer.detail}" if answer.detail else ""
    hint = _NO_ROUTE.get(status, _NO_KEY)
    raise EndpointError(
        f"POST {endpoint_label(url)}{api_path(api)} answered HTTP {status}{said}; {hint} (or pass --no-preflight)"
    )
