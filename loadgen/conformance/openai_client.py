"""The check's two items that go through the official ``openai`` client: can it consume this endpoint?

Kept apart from the battery (``check``) because they speak through another library
rather than the wire: the finding is whether ``openai.AsyncOpenAI`` copes, so any
exception it raises is the evidence. The package is optional; without it the items
skip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadgen.conformance.check_items import item_case
from loadgen.conformance.ci_outputs import Case, clip

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletionMessageParam

__all__ = ["preload_openai", "openai_client_item"]

_MAX_TOKENS = 16


def preload_openai() -> None:
    """Import the client before the battery: importing it mid-battery would stall the event loop."""
    try:
        import openai  # noqa: F401
    except ImportError:
        pass


async def openai_client_item(
    name: str, url: str, api_key: str | None, model: str, timeout_s: float, prompt: str, *, stream: bool
) -> Case:
    """Chat and completions through the official client, streamed or not: pass when both give text and usage."""
    try:
        import openai
    except ImportError:
        return item_case(name, "skip", "the openai package is not installed")
    client = openai.AsyncOpenAI(base_url=url, api_key=api_key or "none", max_retries=0, timeout=timeout_s)
    try:
        if stream:
            text, usage, comp = await _streamed(client, model, prompt)
        else:
            text, usage, comp = await _whole(client, model, prompt)
        ok = bool(text and comp and usage)
        return item_case(name, "pass" if ok else "fail", _evidence(text, usage, comp))
    except Exception as e:  # the point is whether the client copes: any exception is the finding
        return item_case(name, "fail", f"openai client raised {type(e).__name__}: {clip(e, 160)}")
    finally:
        await client.close()


async def _streamed(client: AsyncOpenAI, model: str, prompt: str) -> tuple[str, CompletionUsage | None, str]:
    """(chat text, chat usage, completions text), both streamed with usage asked for."""
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
    comp = await client.completions.create(
        prompt=prompt, model=model, max_tokens=_MAX_TOKENS, stream=True, stream_options={"include_usage": True}
    )
    async for cc in comp:
        ctext += [c.text or "" for c in cc.choices]
    return "".join(parts), usage, "".join(ctext)


async def _whole(client: AsyncOpenAI, model: str, prompt: str) -> tuple[str, CompletionUsage | None, str]:
    """(chat text, chat usage, completions text), not streamed."""
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    r = await client.chat.completions.create(messages=msgs, model=model, max_tokens=_MAX_TOKENS)
    cr = await client.completions.create(prompt=prompt, model=model, max_tokens=_MAX_TOKENS)
    return r.choices[0].message.content or "", r.usage, cr.choices[0].text or ""


def _evidence(text: str, usage: CompletionUsage | None, comp: str) -> str:
    return f"chat {len(text)} chars, usage {'present' if usage else 'missing'}; completions {len(comp)} chars"
