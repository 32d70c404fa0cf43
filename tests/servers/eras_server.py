"""An upstream that speaks both eras and asks its client only on its 2025 path: `python eras_server.py`.

The conformance suite's reference server is such a server: on a 2025 session its sampling and
elicitation tools ask the client in requests of their own during the call; on its 2026-07-28 path
they ask nothing and end at once with an error. A gateway that reaches it at 2026-07-28 for a 2025
client would hand that client the error where, directly, it would have been asked.

- `sample`: asks the client to sample `Test prompt` (at most 100 tokens); answers `LLM said: <text>`.
- `confirm`: asks the client a form with a `name` field; answers `<action>: <content as JSON>`.
- `era`: answers the protocol revision of the session it came on.

At 2026-07-28, `sample` and `confirm` answer an error result saying they ask only on a 2025 session.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

FORM: types.ElicitRequestedSchema = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Your name"}},
    "required": ["name"],
}


def _text(text: str, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


async def list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    return types.ListToolsResult(
        tools=[types.Tool(name=name, input_schema=schema) for name in ("sample", "confirm", "era")]
    )


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name == "era":
        return _text(ctx.protocol_version)
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return _text(f"{params.name} asks its client only on a 2025 session", error=True)
    if params.name == "sample":
        prompt = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="Test prompt"))
        sampled = await ctx.session.create_message(messages=[prompt], max_tokens=100)
        content = sampled.content
        return _text(f"LLM said: {content.text if isinstance(content, types.TextContent) else content}")
    answer = await ctx.session.elicit_form("Who are you?", FORM)
    return _text(f"{answer.action}: {json.dumps(answer.content, sort_keys=True)}")


async def _serve() -> None:
    server = Server("eras", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options(NotificationOptions()))


if __name__ == "__main__":
    anyio.run(_serve)
