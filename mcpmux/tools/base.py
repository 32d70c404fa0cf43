"""What a tool mcpmux implements itself is: its definition, and the handler that answers it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from mcpmux.upstream.lane import ProgressFn


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: a per-connection id (the scope of private cache entries), its clientInfo name,
    and its profile (`[profiles.NAME]`: its calls and searches stay inside it; None: the whole catalog)."""

    client: str | None = None
    name: str | None = None
    profile: str | None = None


@dataclass(frozen=True, slots=True)
class LocalTool:
    """A tool mcpmux implements itself; `handler(arguments, progress, caller)` answers it."""

    tool: types.Tool
    handler: Callable[[dict[str, Any], ProgressFn | None, Caller], Awaitable[types.CallToolResult]]
