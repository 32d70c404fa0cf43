"""What a tool mcpmux implements itself is: its definition, and the handler that answers it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import mcp_types as types

from mcpmux.core.config import Config
from mcpmux.core.inbound import Caller
from mcpmux.upstream.lane import ProgressFn

if TYPE_CHECKING:
    from mcpmux.inference.serving.service import InferenceService


@dataclass(frozen=True, slots=True)
class LocalTool:
    """A tool mcpmux implements itself; `handler(arguments, progress, caller)` answers it."""

    tool: types.Tool
    handler: Callable[[dict[str, Any], ProgressFn | None, Caller], Awaitable[types.CallToolResult]]
    fitted: bool = True
    """Whether its result is cut to `[mux] max_result_bytes` (False: it relays one call's result,
    already fitted to that tool's own limit)."""


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


class _Route(Protocol):
    @property
    def upstream(self) -> str: ...
    @property
    def name(self) -> str: ...


class _Catalog(Protocol):
    @property
    def tools(self) -> list[types.Tool]: ...
    def resolve_tool(self, name: str) -> _Route: ...


class _View(Protocol):
    @property
    def profile(self) -> object: ...
    def allows(self, name: str) -> bool: ...


class _Sampling(Protocol):
    @property
    def service(self) -> object: ...


class SearchHost(ToolCaller, Protocol):
    """What tool search reads of the `Mux` it indexes (`mcpmux.tools.search`)."""

    @property
    def config(self) -> Config: ...
    @property
    def catalog(self) -> _Catalog: ...
    @property
    def local_tools(self) -> Mapping[str, LocalTool]: ...
    @property
    def inference(self) -> InferenceService | None: ...
    @property
    def sampling(self) -> _Sampling: ...
    def list_tools(self, profile: str | None = None, caller: Caller | None = None) -> list[types.Tool]: ...
    def view(self, profile: str | None = None, caller: Caller | None = None) -> _View: ...
    def on_catalog_changed(self, listener: Callable[[], Awaitable[None]]) -> None: ...
    async def wait_for_starting(self) -> None: ...
