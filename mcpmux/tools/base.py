"""What a tool mcpmux implements itself is: its definition, and the handler that answers it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import mcp_types as types

from mcpmux.core.inbound import Caller
from mcpmux.upstream.lane import ProgressFn


@dataclass(frozen=True, slots=True)
class LocalTool:
    """A tool mcpmux implements itself; `handler(arguments, progress, caller)` answers it."""

    tool: types.Tool
    handler: Callable[[dict[str, Any], ProgressFn | None, Caller], Awaitable[types.CallToolResult]]


class ToolCaller(Protocol):
    """What a tool that calls others needs of the `Mux` it serves."""

    def model_refusal(self, name: str, profile: str | None = None) -> str | None:
        """Why the model may not call `name` (an app-only tool), or None."""

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        progress: ProgressFn | None = None,
        caller: Caller | None = None,
        hears_logs: bool = False,
    ) -> types.CallToolResult: ...
