"""What a tool mcpmux implements itself is: its definition, and the handler that answers it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from mcpmux.core.inbound import Caller
from mcpmux.upstream.lane import ProgressFn


@dataclass(frozen=True, slots=True)
class LocalTool:
    """A tool mcpmux implements itself; `handler(arguments, progress, caller)` answers it."""

    tool: types.Tool
    handler: Callable[[dict[str, Any], ProgressFn | None, Caller], Awaitable[types.CallToolResult]]
