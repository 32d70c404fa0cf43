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
    'Each item of structuredContent.results is {"index", "tool", "ok": true, "result": {"text", "structured"?}} '
    'or {"index", "tool", "ok": false, "error": "<why>"}; one failing call never fails the others. '
    "The whole result is an error only when the request itself is malformed."
)

_TOOL_NAME = {
    "type": "string",
    "minLength": 1,
    "description": "A tool's full name as listed by tools/list, e.g. 'github__search_issues'. Not a mux_* tool.",
}
_ARGUMENTS = {"type": "object", "description": "The tool's arguments, matching its input schema.", "default": {}}

_REFERENCE_SYNTAX = (
    'A step refers to an earlier step\'s result with a JSON object whose only key is "$ref", placed anywhere '
    'in its arguments (as a whole value, also inside objects and arrays): {"$ref": "steps.<step>.<root>.<key>..."}. '
    "<step> is an earlier step's 0-based index or its id. <root> is text (the step's text output, blocks joined "
    "by newlines), json (that text parsed as JSON) or structured (its structuredContent). Further segments are "
    "object keys or 0-based list indices. For keys containing a dot, give a list: "
    '{"$ref": ["steps", "search", "structured", "a.b"]}. Example: step 0 {"id": "find", "tool": "db__query", '
    '"arguments": {"sql": "..."}}, step 1 {"tool": "mail__send", "arguments": {"to": {"$ref": '
    '"steps.find.json.0.email"}}}. A reference that does not resolve fails that step with an error naming the '
    "step and the reference; the first failing step stops the pipeline and the result says which step failed."
)


def _tool(name: str, title: str, description: str, schema: dict[str, Any]) -> types.Tool:
    return types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema=schema,
        annotations=types.ToolAnnotations(title=title, read_only_hint=False, open_world_hint=True),
    )


PARALLEL_TOOL = _tool(
    "mux_parallel",
    "Call several tools at once",
    "Run several independent tool calls concurrently in one request and get every answer back in input "
    f"order. Use it whenever calls do not depend on each other. Up to {MAX_CALLS} calls, at most "
    f"{MAX_CONCURRENT} running at once; each goes through the same limits and cache as a direct call. " + _ITEM_RESULT,
    {
        "type": "object",
        "properties": {
            "calls": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_CALLS,
                "description": "The calls to make, answered in this order.",
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
    "Call one tool once for each argument object, concurrently, and get every answer back in input order "
    f"(e.g. a lookup for 20 keys). Up to {MAX_CALLS} argument objects, at most {MAX_CONCURRENT} running at "
    "once; identical read-only calls are made once and shared. " + _ITEM_RESULT,
    {
        "type": "object",
        "properties": {
            "tool": _TOOL_NAME,
            "arguments": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_CALLS,
                "description": "One argument object per call, each matching the tool's input schema.",
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
    f"Run up to {MAX_STEPS} tool calls in order, where a step's arguments can use earlier steps' results. "
    + _REFERENCE_SYNTAX
    + ' structuredContent.steps lists each step that ran ({"index", "id", "tool", "ok", "result" | "error"}); '
    "failed_step is the index of the step that failed, or null.",
    {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_STEPS,
                "description": "The steps, run one after another.",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {
                            "type": "string",
                            "pattern": "^[A-Za-z_][A-Za-z0-9_-]{0,63}$",
                            "description": "Optional name for this step, usable in later references.",
                        },
                        "tool": _TOOL_NAME,
                        "arguments": {
                            **_ARGUMENTS,
                            "description": 'The tool\'s arguments; any {"$ref": "steps.<step>.<root>..."} '
                            "value is replaced by that earlier result.",
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
