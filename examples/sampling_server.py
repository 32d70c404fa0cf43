"""A small MCP server (mcp SDK) whose tools ask the client's model for a completion mid-call.

    python examples/sampling_server.py          # stdio

`summarize(text)` asks for a one-sentence summary; `sample(prompt, ...)` exposes the request's knobs
and returns what came back (text, model, stopReason), which the tests use. Each tool declares its
request with a `Sample` resolver, so the SDK sends it the way the connection allows: a pushed
`sampling/createMessage` on a 2025 session, an input-required round on 2026-07-28. Behind mcpmux,
the request is answered by the local model (or forwarded to the client), under the
`[servers.NAME.sampling]` policy.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer, Resolve, Sample
from mcp_types import (
    CreateMessageResult,
    ImageContent,
    ModelHint,
    ModelPreferences,
    SamplingMessage,
    TextContent,
)

server = MCPServer("sampling-demo")

# A 1x1 transparent PNG: enough to show how an image in a sampling request is handled.
_PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="


def _summary_request(text: str) -> Sample:
    prompt = f"Summarize the following text in one sentence.\n\n{text}"
    return Sample(
        [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
        max_tokens=96,
        system_prompt="You are a concise assistant.",
        temperature=0.0,
    )


@server.tool()
async def summarize(text: str, summary: Annotated[CreateMessageResult, Resolve(_summary_request)]) -> str:
    """Summarize a text in one sentence, using the client's model (sampling)."""
    return summary.content.text if isinstance(summary.content, TextContent) else ""


def _sample_request(
    prompt: str,
    max_tokens: int = 32,
    system: str | None = None,
    temperature: float | None = None,
    stop: list[str] | None = None,
    model_hint: str | None = None,
    seed: int | None = None,
    with_image: bool = False,
) -> Sample:
    content: Any = TextContent(type="text", text=prompt)
    if with_image:
        content = [content, ImageContent(type="image", data=_PIXEL, mime_type="image/png")]
    return Sample(
        [SamplingMessage(role="user", content=content)],
        max_tokens=max_tokens,
        system_prompt=system,
        temperature=temperature,
        stop_sequences=stop,
        metadata={"seed": seed} if seed is not None else None,
        model_preferences=ModelPreferences(hints=[ModelHint(name=model_hint)]) if model_hint else None,
    )


@server.tool()
async def sample(
    prompt: str,
    result: Annotated[CreateMessageResult, Resolve(_sample_request)],
    max_tokens: int = 32,
    system: str | None = None,
    temperature: float | None = None,
    stop: list[str] | None = None,
    model_hint: str | None = None,
    seed: int | None = None,
    with_image: bool = False,
) -> dict[str, Any]:
    """Ask for one completion with these settings; return its text, model and stopReason."""
    text = result.content.text if isinstance(result.content, TextContent) else ""
    return {"text": text, "model": result.model, "stop_reason": result.stop_reason}


if __name__ == "__main__":
    server.run("stdio")
