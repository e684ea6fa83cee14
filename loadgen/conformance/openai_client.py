"""The check's items that go through the official ``openai`` client: can it consume this endpoint?

Kept apart from the battery (``check``) because they speak through another library
rather than the wire: the finding is whether ``openai.AsyncOpenAI`` copes, so any
exception it raises is the evidence (the battery removes the check's secrets from it,
as from all evidence). The package is optional; without it the items skip.

The client keeps no idle connection: a server that closes one after each answer
while advertising keep-alive (llama.cpp) would otherwise fail the next request on
the stale one, which is the stale keep-alive race and not the endpoint's fault; the
battery's own requests resend on it, and this client, with its retries off so that
each failure is evidence, never meets it. It asks for uncompressed answers, as every
loadgen request does.

For ``--api responses`` one item (``openai_responses_item``) streams a Responses answer
through ``client.responses.create``: the client must parse every event, end at a terminal
one whose response has usage, and its own ``output_text`` must be the text deltas joined.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from loadgen.client.endpoint_options import EndpointOptions
from loadgen.conformance.check_items import item_case
from loadgen.conformance.ci_outputs import Case
from loadgen.redaction import Secrets
from loadgen.untrusted import clean_text

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.responses import Response

__all__ = ["preload_openai", "openai_client_item", "openai_responses_item"]

_MAX_TOKENS = 16


def preload_openai() -> None:
    """Import the client before the battery: importing it mid-battery would stall the event loop."""
    try:
        import openai  # noqa: F401
    except ImportError:
        pass


def _client(url: str, api_key: str | None, timeout_s: float, options: EndpointOptions) -> tuple[Any, Any]:
    """The official client (and its HTTP client) as the run's endpoint options say: every ``-H``
    header and the key's own header, the TLS verification and the proxy the run uses."""
    import httpx2
    import openai

    http = openai.DefaultAsyncHttpx2Client(
        limits=httpx2.Limits(max_keepalive_connections=0),
        timeout=timeout_s,
        verify=options.ssl_context(),
        proxy=options.proxy_for(url),
        trust_env=False,  # the proxy is the options' (their NO_PROXY honoured), not the environment's again
    )
    client = openai.AsyncOpenAI(
        base_url=url,
        api_key=api_key or "none",
        max_retries=0,
        timeout=timeout_s,
        http_client=http,
        default_headers={**options.request_headers(api_key), "Accept-Encoding": "identity"},
    )
    return client, http


async def openai_client_item(
    name: str,
    url: str,
    api_key: str | None,
    model: str,
    timeout_s: float,
    prompt: str,
    *,
    stream: bool,
    secrets: Secrets,
    options: EndpointOptions,
) -> Case:
    """Chat and completions through the official client, streamed or not: pass when both give text and usage."""
    try:
        import openai  # noqa: F401
    except ImportError:
        return item_case(name, "skip", "the openai package is not installed")
    client, http = _client(url, api_key, timeout_s, options)
    try:
        got = await (_streamed(client, model, prompt) if stream else _whole(client, model, prompt))
        return item_case(name, "pass" if got.ok() else "fail", got.evidence())
    except Exception as e:  # the point is whether the client copes: any exception is the finding
        return item_case(
            name, "fail", f"openai client raised {type(e).__name__}: {clean_text(secrets.redact(str(e)), 600)}"
        )
    finally:
        await client.close()
        await http.aclose()


class _Got(NamedTuple):
    """What the client made of the chat and the completions answer."""

    text: str
    usage: CompletionUsage | None
    comp: str
    comp_usage: CompletionUsage | None

    def ok(self) -> bool:
        """Both answers gave text, or tokens without visible text (random weights do) by usage;
        the chat one with usage."""
        return self.usage is not None and _said(self.text, self.usage) and _said(self.comp, self.comp_usage)

    def evidence(self) -> str:
        chat = f"chat {len(self.text)} chars, usage {_tokens(self.usage)}"
        return f"{chat}; completions {len(self.comp)} chars, usage {_tokens(self.comp_usage)}"


def _said(text: str, usage: CompletionUsage | None) -> bool:
    return bool(text) or (usage is not None and usage.completion_tokens > 0)


def _tokens(usage: CompletionUsage | None) -> str:
    return "missing" if usage is None else f"{usage.completion_tokens} tokens"


async def _streamed(client: AsyncOpenAI, model: str, prompt: str) -> _Got:
    """The chat and the completions answer, both streamed with usage asked for."""
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    parts: list[str] = []
    usage: CompletionUsage | None = None
    chat = await client.chat.completions.create(
        messages=msgs, model=model, max_tokens=_MAX_TOKENS, stream=True, stream_options={"include_usage": True}
    )
    async for ch in chat:
        parts += [c.delta.content or "" for c in ch.choices if c.delta]
        usage = ch.usage or usage
    ctext: list[str] = []
    cusage: CompletionUsage | None = None
    comp = await client.completions.create(
        prompt=prompt, model=model, max_tokens=_MAX_TOKENS, stream=True, stream_options={"include_usage": True}
    )
    async for cc in comp:
        ctext += [c.text or "" for c in cc.choices]
        cusage = cc.usage or cusage
    return _Got("".join(parts), usage, "".join(ctext), cusage)


async def _whole(client: AsyncOpenAI, model: str, prompt: str) -> _Got:
    """The chat and the completions answer, not streamed."""
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    r = await client.chat.completions.create(messages=msgs, model=model, max_tokens=_MAX_TOKENS)
    cr = await client.completions.create(prompt=prompt, model=model, max_tokens=_MAX_TOKENS)
    return _Got(r.choices[0].message.content or "", r.usage, cr.choices[0].text or "", cr.usage)


async def openai_responses_item(
    name: str,
    url: str,
    api_key: str | None,
    model: str,
    timeout_s: float,
    prompt: str,
    *,
    secrets: Secrets,
    options: EndpointOptions,
) -> Case:
    """A streamed Responses answer through the official client: pass when it parses every event,
    ends at response.completed or .incomplete with usage, and its ``output_text`` is the text
    deltas joined."""
    try:
        import openai
    except ImportError:
        return item_case(name, "skip", "the openai package is not installed")
    client, http = _client(url, api_key, timeout_s, options)
    try:
        if not hasattr(client, "responses"):
            return item_case(name, "skip", f"openai {openai.__version__} has no Responses API (1.66 or later has)")
        stream = await client.responses.create(
            model=model, input=[{"role": "user", "content": prompt}], max_output_tokens=_MAX_TOKENS, stream=True
        )
        from openai.types.responses import ResponseCompletedEvent, ResponseIncompleteEvent, ResponseTextDeltaEvent

        kinds: list[str] = []
        deltas: list[str] = []
        final = None
        async for event in stream:
            kinds.append(event.type)
            if isinstance(event, ResponseTextDeltaEvent):
                deltas.append(event.delta)
            elif isinstance(event, ResponseCompletedEvent | ResponseIncompleteEvent) and final is None:
                final = event.response
        return item_case(name, *_responses_verdict(kinds, "".join(deltas), final))
    except Exception as e:  # the point is whether the client copes: any exception is the finding
        return item_case(
            name, "fail", f"openai client raised {type(e).__name__}: {clean_text(secrets.redact(str(e)), 600)}"
        )
    finally:
        await client.close()
        await http.aclose()


def _responses_verdict(kinds: list[str], text: str, final: Response | None) -> tuple[str, str]:
    seen = f"{len(kinds)} events, {kinds.count('response.output_text.delta')} text deltas"
    if final is None:
        ended = kinds[-1] if kinds else "nothing"
        return "fail", f"{seen}, but no response.completed or .incomplete (the last: {clean_text(ended, 60)!r})"
    usage = final.usage
    if usage is None:
        return "fail", f"{seen}, response.{final.status} without usage"
    if final.output_text != text:
        return (
            "fail",
            f"{seen}: the client's output_text ({len(final.output_text)} chars) is not the deltas ({len(text)})",
        )
    if not text and usage.output_tokens <= 0:
        return "fail", f"{seen}: no text and usage says {usage.output_tokens} output tokens"
    return (
        "pass",
        f"{seen}, response {final.status}, usage {usage.output_tokens} output tokens, output_text as the deltas",
    )
