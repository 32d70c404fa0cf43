"""Where the whole of a result cut for a model's context is kept, for the client to read back.

Both paths shape a tool result through `ResultStore.fit` (the SDK path in `Mux.call_tool`, the fast
path in `FastPath._response`): under the plan's `result_limit` it is the result unchanged, over it
the cut result of `mcpmux.core.result_limit.fit`, whose whole is kept here under a
`mcpmux://results/<id>` URI. `Mux.read_resource` answers `resources/read` of such a URI from here.

The id is 128 random bits: only the client that was given the link can name it, so one client's
result never reaches another. Results are kept `KEPT_SECONDS` and at most `KEPT_BYTES` in all (the
least recently used go first); a read after that says to call the tool again.
"""

from __future__ import annotations

import secrets
from typing import Any

import mcp_types as types

from mcpmux.batching import CachePolicy, ResultCache
from mcpmux.core.call_plan import CallPlan
from mcpmux.core.result_limit import Kept, fit, fits
from mcpmux.errors import UnknownToolError

SCHEME = "mcpmux://results/"
KEPT_SECONDS = 3600.0
KEPT_BYTES = 256 * 1024 * 1024


class ResultStore:
    """The whole results of the calls whose text was cut, by URI, for a while."""

    def __init__(self, kept_seconds: float = KEPT_SECONDS, kept_bytes: int = KEPT_BYTES) -> None:
        policy = CachePolicy(ttl=kept_seconds, max_entries=100_000, max_bytes=kept_bytes)
        self._kept: ResultCache[Kept] = ResultCache(policy, sizeof=lambda kept: kept.size, name="cut results")

    def fit(self, plan: CallPlan, raw: Any, upstream: str) -> Any:
        """`raw`, or, beyond the plan's `result_limit`, the cut result whose whole is kept here."""
        keeps_structured = plan.output is not None  # an outputSchema validates it: never changed
        return self._fit(raw, plan.result_limit, keeps_structured, f"tool {plan.tool!r} of {upstream!r}")

    def fit_model(self, plan: CallPlan, result: types.CallToolResult, upstream: str) -> types.CallToolResult:
        """`fit` for a result already in the SDK's model (the SDK path), read and rebuilt only when cut."""
        label = f"tool {plan.tool!r} of {upstream!r}"
        return self._fit_model(result, plan.result_limit, plan.output is not None, label)

    def fit_own(self, tool: types.Tool, result: types.CallToolResult, limit: int) -> types.CallToolResult:
        """`fit_model` for a result of mcpmux's own tools (`mux_parallel` gathering several, say), under
        `[mux] max_result_bytes`: what the model reads of it fits as an upstream's result does."""
        return self._fit_model(result, limit, tool.output_schema is not None, f"mcpmux's tool {tool.name!r}")

    def _fit_model(
        self, result: types.CallToolResult, limit: int, keeps_structured: bool, label: str
    ) -> types.CallToolResult:
        if not limit or _model_fits(result, limit, keeps_structured):
            return result
        raw = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        shaped = self._fit(raw, limit, keeps_structured, label)
        return result if shaped is raw else types.CallToolResult.model_validate(shaped, by_name=False)

    def _fit(self, raw: Any, limit: int, keeps_structured: bool, label: str) -> Any:
        if fits(raw, limit, keeps_structured):
            return raw
        shaped, kept = fit(raw, limit, keeps_structured, label, _new_uri)
        if kept is not None:
            self._kept.put((kept.uri,), kept)
        return shaped

    @staticmethod
    def holds(uri: str) -> bool:
        """Whether `uri` names a result kept here (rather than an upstream's resource)."""
        return uri.startswith(SCHEME)

    def read(self, uri: str) -> types.ReadResourceResult:
        """`resources/read` of a kept result; `UnknownToolError` once it is gone (or never was)."""
        kept = self._kept.get((uri,))
        if kept is None:
            raise UnknownToolError(
                f"resource {uri!r} is not kept (any longer): mcpmux keeps a cut result for "
                f"{KEPT_SECONDS / 60:.0f} minutes, and fewer when many are large; call the tool again"
            )
        return types.ReadResourceResult.model_validate({"contents": kept.contents}, by_name=False)


def _new_uri() -> str:
    return SCHEME + secrets.token_urlsafe(16)


def _model_fits(result: types.CallToolResult, limit: int, keeps_structured: bool) -> bool:
    """The cheap test of `fits` on the model: at most 4 bytes a character, so short text fits unread."""
    chars = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            chars += len(block.text)
        elif isinstance(block, types.EmbeddedResource) and isinstance(block.resource, types.TextResourceContents):
            chars += len(block.resource.text)
    return chars * 4 <= limit and (keeps_structured or result.structured_content is None)
