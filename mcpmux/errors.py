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


class CallFailedError(MuxError):
    """A call that failed on its way to or from its upstream (down, too slow, or answering against the
    tool's schema). A tool call answers it as an `isError` result, which the model reads and carries on
    from; any other request, as a JSON-RPC error (`error_data`)."""

    exit_code = 1


class UpstreamUnavailableError(CallFailedError):
    """The upstream that owns the tool is not connected (starting, restarting or failed)."""


class UpstreamTimeoutError(CallFailedError):
    """The upstream did not answer within its call timeout."""


class UpstreamResultError(CallFailedError):
    """The upstream's result breaks the tool's declared output schema (reported as an `isError` result)."""


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


def error_data(err: MuxError) -> types.ErrorData:
    """The JSON-RPC error that every front answers a request failed by `err` with: an upstream's own
    error unchanged, a name the catalog does not hold as the client's error (-32602), anything else as
    mcpmux's (-32603)."""
    if isinstance(err, UpstreamError):
        return types.ErrorData(code=err.code, message=str(err), data=err.data)
    code = types.INVALID_PARAMS if isinstance(err, UnknownToolError) else types.INTERNAL_ERROR
    return types.ErrorData(code=code, message=str(err))
