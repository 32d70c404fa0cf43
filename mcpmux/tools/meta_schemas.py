"""What clients see of the meta-tools: names, descriptions a model can act on, and input schemas."""

from __future__ import annotations

from typing import Any

import mcp_types as types

MAX_CALLS = 256
"""Most calls one `mux_parallel` or `mux_batch` request may carry."""
MAX_CONCURRENT = 32
"""Most inner calls of one meta-tool request in flight at once (each upstream's own limits apply too)."""
MAX_STEPS = 32
"""Most steps in one `mux_pipeline`."""

_ITEM_RESULT = (
    'Each structuredContent.results item is {"index", "tool", "ok": true, "result": {"text", "structured"?}} '
    'or {"index", "tool", "ok": false, "error"}; one failing call never fails the others.'
)

_TOOL_NAME = {
    "type": "string",
    "minLength": 1,
    "description": "A tool's full name, e.g. 'github__search_issues' (not a mux_* tool).",
}
_ARGUMENTS = {"type": "object", "description": "The tool's arguments.", "default": {}}

_REFERENCE_SYNTAX = (
    'Any argument value may be {"$ref": "steps.<step>.<root>.<key>..."}: <step> is an earlier step\'s '
    "0-based index or id; <root> is text (its text output), json (that text parsed) or structured (its "
    "structuredContent); then object keys or list indices (a key with a dot: give a list, "
    '["steps", "find", "structured", "a.b"]). E.g. step 0 {"id": "find", "tool": "db__query", ...}, step 1 '
    '{"tool": "mail__send", "arguments": {"to": {"$ref": "steps.find.json.0.email"}}}.'
)


def _tool(name: str, title: str, description: str, schema: dict[str, Any]) -> types.Tool:
    return types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema=schema,
        annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
    )


PARALLEL_TOOL = _tool(
    "mux_parallel",
    "Call several tools at once",
    "Run independent tool calls concurrently in one request; answers come back in input order. Up to "
    f"{MAX_CALLS} calls, {MAX_CONCURRENT} at a time, each with a direct call's limits and cache. " + _ITEM_RESULT,
    {
        "type": "object",
        "properties": {
            "calls": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_CALLS,
                "items": {
                    "type": "object",
                    "properties": {"tool": _TOOL_NAME, "arguments": _ARGUMENTS},
                    "required": ["tool"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["calls"],
        "additionalProperties": False,
    },
)

BATCH_TOOL = _tool(
    "mux_batch",
    "Call one tool with many arguments",
    "Call one tool once per argument object, concurrently (e.g. a lookup per key); answers in input order. "
    f"Up to {MAX_CALLS}, {MAX_CONCURRENT} at a time; identical read-only calls run once. " + _ITEM_RESULT,
    {
        "type": "object",
        "properties": {
            "tool": _TOOL_NAME,
            "arguments": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_CALLS,
                "description": "One argument object per call.",
                "items": {"type": "object"},
            },
        },
        "required": ["tool", "arguments"],
        "additionalProperties": False,
    },
)

PIPELINE_TOOL = _tool(
    "mux_pipeline",
    "Chain tool calls",
    f"Run up to {MAX_STEPS} tool calls in order; a step's arguments may use earlier results. "
    + _REFERENCE_SYNTAX
    + " The first failing step (or unresolved reference) stops the pipeline. structuredContent.steps lists "
    'the steps run ({"index", "id", "tool", "ok", "result" | "error"}); failed_step: its index, or null.',
    {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_STEPS,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {
                            "type": "string",
                            "pattern": "^[A-Za-z_][A-Za-z0-9_-]{0,63}$",
                            "description": "A name later references may use.",
                        },
                        "tool": _TOOL_NAME,
                        "arguments": {
                            **_ARGUMENTS,
                            "description": 'The tool\'s arguments; {"$ref": ...} values are replaced.',
                        },
                    },
                    "required": ["tool"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["steps"],
        "additionalProperties": False,
    },
)
