"""Errors a user of mcpmux can hit, each worded so the reader knows what to do next."""

from __future__ import annotations

from typing import Any

import mcp_types as types


def error_result(text: str) -> types.CallToolResult:
    """A tool result that reports a failure in words (`isError`): a model reads it and carries on."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class MuxError(Exception):
    """Base class of mcpmux's own errors."""

    exit_code = 2
    """The `mcpmux` command's exit status when this error ends it: 2, a usage or configuration error;
    1 where the command was right and an upstream failed it."""


class ConfigError(MuxError):
    """The configuration is invalid; the message names the file, the key path and what was expected."""


class UnknownToolError(MuxError):
    """No tool, prompt or resource of that name is in the catalog."""


class UnlistedToolError(UnknownToolError):
    """The name is not in the catalog because the upstream its prefix names is not connected."""

    exit_code = 1


class UpstreamUnavailableError(MuxError):
    """The upstream that owns the tool is not connected (starting, restarting or failed)."""

    exit_code = 1


class UpstreamTimeoutError(MuxError):
    """The upstream did not answer within its call timeout."""

    exit_code = 1


class UpstreamResultError(MuxError):
    """The upstream's result breaks the tool's declared output schema (reported as an `isError` result)."""

    exit_code = 1


class UpstreamError(MuxError):
    """The upstream answered with a JSON-RPC error; `code` and `data` are passed through unchanged."""

    exit_code = 1

    def __init__(self, message: str, code: int, data: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


class InputRequired(Exception):
    """An upstream answered a 2026-07-28 client's request with an input-required result (SEP-2322) that
    goes to that client as it is: the round is the client's own, and its retry, carrying its
    `inputResponses` and the upstream's `requestState`, goes back to the same upstream. Raised where
    the result is read (`mcpmux.mux.dispatcher`), it travels through flights and gates to the front
    that answers the client. `raw`: the result as the upstream wrote it; `call`: the inbound call
    (`mcpmux.core.inbound.InboundCall`) it is for, and no other."""

    def __init__(self, raw: Any, call: object) -> None:
        super().__init__("the upstream asked the calling client for input")
        self.raw = raw
        self.call = call
