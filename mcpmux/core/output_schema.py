"""Tool results checked against the tool's declared output schema, on both call paths alike.

The SDK's client checks every successful `tools/call` result of a tool that declares an
`outputSchema` and raises a `RuntimeError` when the structured content is missing or breaks it;
unhandled, that reached the client as an opaque "internal error". The fast path never runs the
SDK's client, so it checks the raw result itself with the same rules (`OutputCheck`). Both paths
then answer with one `isError` result naming the upstream, the tool and what is wrong.
"""

from __future__ import annotations

from typing import Any

from jsonschema import exceptions as schema_exceptions
from jsonschema.validators import validator_for
from referencing import Registry
from referencing.exceptions import Unresolvable

from mcpmux.errors import UpstreamResultError

_MISSING = "it has no structured content"
# How the SDK's client words its three refusals (mcp.client.session.ClientSession.validate_tool_result).
_SDK_INVALID = "Invalid structured content returned by tool"
_SDK_MISSING = "has an output schema but did not return structured content"
_SDK_BAD_SCHEMA = "Invalid schema for tool"


def result_error(upstream: str, what: str, problem: str) -> UpstreamResultError:
    return UpstreamResultError(
        f"upstream {upstream!r} answered {what} with a result that breaks the tool's declared output "
        f"schema: {problem} (the server is at fault; its result was not passed on)"
    )


def sdk_problem(err: RuntimeError) -> str | None:
    """What an SDK client's output-schema refusal found wrong; None for any other `RuntimeError`."""
    text = str(err)
    if _SDK_INVALID in text and isinstance(err.__cause__, schema_exceptions.ValidationError):
        return err.__cause__.message
    if _SDK_MISSING in text:
        return _MISSING
    if text.startswith(_SDK_BAD_SCHEMA):
        return f"the schema itself is unusable ({text.partition(': ')[2]})"
    return None


class OutputCheck:
    """One tool's output schema, compiled once; `problem()` checks a raw result as the SDK's client does."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._schema = schema
        self._validator: Any = None

    def problem(self, result: object) -> str | None:
        """What is wrong with a raw `CallToolResult` object, or None when it passes (errors always pass)."""
        if not isinstance(result, dict) or result.get("isError"):
            return None
        if "structuredContent" not in result:
            return _MISSING
        try:
            if self._validator is None:
                cls = validator_for(self._schema)
                cls.check_schema(self._schema)
                self._validator = cls(self._schema, registry=Registry())
            error = schema_exceptions.best_match(self._validator.iter_errors(result["structuredContent"]))
        except (schema_exceptions.SchemaError, Unresolvable) as err:
            return f"the schema itself is unusable ({err})"
        return None if error is None else str(error.message)
