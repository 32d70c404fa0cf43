"""A real MCP server (mcp SDK) for the tests: `python demo_server.py NAME [stdio|http PORT]`.

Tools that let a test observe what a user would: `echo`, `add`, `sleep` (with progress),
`count` (how many calls this process has served, per tool), `log`, `crash` (the process dies),
`garbage` (writes junk to stdout, then answers), `fail` (an isError result), `raise_error` (a
JSON-RPC error), `add_tool` (registers a new tool: list_changed), and a resource and a prompt.
"""

from __future__ import annotations

import collections
import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import _claims as stdio_claims
from mcp_types import Completion, ToolAnnotations

NAME = sys.argv[1] if len(sys.argv) > 1 else "demo"
server = MCPServer(NAME)
calls: collections.Counter[str] = collections.Counter()


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    calls["echo"] += 1
    return f"{NAME}: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    calls["add"] += 1
    return a + b


@server.tool()
async def sleep(seconds: float, ctx: Context, steps: int = 1) -> str:
    """Sleep, reporting progress `steps` times."""
    calls["sleep"] += 1
    try:
        for step in range(steps):
            await anyio.sleep(seconds / steps)
            await ctx.report_progress(step + 1, steps, f"step {step + 1}")
    except anyio.get_cancelled_exc_class():
        calls["sleep_cancelled"] += 1
        raise
    return f"slept {seconds}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
async def lookup(key: str) -> str:
    """A slow read-only, idempotent lookup (mcpmux may share one call among identical concurrent ones)."""
    calls["lookup"] += 1
    await anyio.sleep(0.2)
    return f"value of {key}"


@server.tool()
def get_weather(location: str) -> str:
    """The weather at one location."""
    calls["get_weather"] += 1
    return f"sunny in {location}"


@server.tool()
async def get_weather_many(locations: list[str]) -> list[str]:
    """The weather at many locations, in order (the list form of get_weather)."""
    calls["get_weather_many"] += 1
    calls["get_weather_many_items"] += len(locations)
    await anyio.sleep(0.05)
    return [f"sunny in {location}" for location in locations]


@server.tool()
def count(tool: str) -> int:
    """How many times `tool` has been called on this process."""
    return calls[tool]


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
async def log(message: str, ctx: Context) -> str:
    """Send a log notification, then answer."""
    await ctx.info(message)
    return "logged"


@server.tool()
def crash() -> str:
    """Exit the process without answering."""
    os._exit(3)


@server.tool()
def garbage() -> str:
    """Write a line that is not JSON-RPC onto the stdout wire, then answer."""
    # While serving, the SDK points fd 1 at stderr and keeps the wire on a private duplicate.
    claim = stdio_claims.get(1)
    wire = claim.private_fd if claim is not None and claim.private_fd is not None else 1
    os.write(wire, b"this is not json\n")
    return "after garbage"


@server.tool()
def fail(reason: str) -> str:
    """Fail as a tool (isError result)."""
    raise ValueError(reason)


@server.tool()
async def add_tool(name: str, ctx: Context, meta: dict[str, Any] | None = None) -> str:
    """Register a new tool named `name` (with `meta` as its `_meta`), which announces tools/list_changed."""

    def extra() -> str:
        return f"{name} works"

    server.add_tool(extra, name=name, description=f"added at run time: {name}", meta=meta)
    await ctx.notify_tools_changed()
    await ctx.request_context.session.send_tool_list_changed()
    return f"added {name}"


@server.resource("demo://{server}/greeting")
def greeting(server: str) -> str:
    """A fixed greeting."""
    return f"hello from {server}"


@server.prompt()
def summarize(topic: str) -> str:
    """A prompt that asks for a summary."""
    return f"Summarize {topic} from {NAME}."


@server.completion()
async def complete(ref: object, argument: object, context: object) -> Completion:
    """Completes the `summarize` prompt's topic and the greeting template's server, with the name inside."""
    partial = getattr(argument, "value", "")
    return Completion(values=[f"{partial}-{NAME}-1", f"{partial}-{NAME}-2"])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        server.run()
