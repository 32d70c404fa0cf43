"""An upstream that asks the calling client things: `python asking_server.py [stdio | http PORT]`.

What a test of "who is asking" needs to see where each question, answer and notification went:

- `whoami` elicits the user's name, `myroots` lists the client's roots; both are written with
  `Resolve(...)`, so they work in both eras (pushed requests in 2025-11-25, input-required rounds
  in 2026-07-28). Each waits 0–`delay_ms` ms first, so the calls of several clients overlap.
- `profile` asks a form whose every field has a default (SEP-1034), `signup` one with a required
  field that has none; both (`Resolve`, so in both eras) answer with the action and the content.
- `tell(tag)` logs `tag` and reports progress with `tag` as its message during the call.
- `view` is listed only to a client that declared the MCP Apps extension (`io.modelcontextprotocol/ui`),
  ext-apps' `getUiCapability` pattern; the server advertises the extension (SEP-2133).
- `pid` tells which process answered; `crash` ends it.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from typing import Annotated, Any

import anyio
import mcp_types as types
from mcp.server.apps import EXTENSION_ID, Apps
from mcp.server.context import ServerRequestContext
from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, Elicit, ListRoots, MCPServer, Resolve
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import BaseModel

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)  # logging is deprecated in 2026-07-28


class Name(BaseModel):
    name: str


class _AskingServer(MCPServer):
    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = await self.list_tools()
        capabilities = ctx.session.client_capabilities
        extensions = capabilities.extensions if capabilities is not None else None
        if not extensions or EXTENSION_ID not in extensions:
            tools = [tool for tool in tools if tool.name != "view"]
        return types.ListToolsResult(tools=tools)


server = _AskingServer("asking", extensions=[Apps()])


async def ask_name(delay_ms: int = 150) -> Elicit[Name]:
    await anyio.sleep(random.uniform(0, delay_ms) / 1000)
    return Elicit("What is your name?", Name)


async def ask_roots(delay_ms: int = 150) -> ListRoots:
    await anyio.sleep(random.uniform(0, delay_ms) / 1000)
    return ListRoots()


@server.tool()
async def whoami(answer: Annotated[Name, Resolve(ask_name)], delay_ms: int = 150) -> str:
    """Ask the user's name; answer with it."""
    return answer.name


@server.tool()
async def myroots(listed: Annotated[types.ListRootsResult, Resolve(ask_roots)], delay_ms: int = 150) -> list[str]:
    """The client's roots."""
    return [str(root.uri) for root in listed.roots]


@server.tool()
async def tell(tag: str, ctx: Context) -> str:
    """Log `tag` and report progress with it, then answer with it."""
    await ctx.info(tag)
    await ctx.report_progress(1, 1, tag)
    await anyio.sleep(random.uniform(0, 0.05))
    return tag


@server.tool(meta={"ui": {"resourceUri": "ui://asking/view.html"}})
def view() -> str:
    """A tool with a view (listed only to hosts that render MCP Apps)."""
    return "a view"


class Profile(BaseModel):
    name: str = "John Doe"
    age: int = 30
    score: float = 95.5
    verified: bool = True


class Signup(BaseModel):
    email: str
    newsletter: bool = False


def ask_profile() -> Elicit[Profile]:
    return Elicit("Review your profile", Profile)


def ask_signup() -> Elicit[Signup]:
    return Elicit("Sign up", Signup)


def _outcome(answer: ElicitationResult[Any]) -> dict[str, Any]:
    data = answer.data.model_dump() if isinstance(answer, AcceptedElicitation) else None
    return {"action": answer.action, "content": data}


@server.tool()
async def profile(answer: Annotated[ElicitationResult[Profile], Resolve(ask_profile)]) -> dict[str, Any]:
    """Ask for a profile, every field with a default; answer with what came back."""
    return _outcome(answer)


@server.tool()
async def signup(answer: Annotated[ElicitationResult[Signup], Resolve(ask_signup)]) -> dict[str, Any]:
    """Ask for a sign-up whose email has no default; answer with what came back."""
    return _outcome(answer)


@server.tool()
def pid() -> int:
    """This server process's id."""
    return os.getpid()


@server.tool()
def crash() -> str:
    """End this server process at once."""
    os._exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        import uvicorn

        app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run("stdio")
