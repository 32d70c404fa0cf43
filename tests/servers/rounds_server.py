"""A 2026-07-28 upstream whose input-required rounds (SEP-2322) are its own: `python rounds_server.py`.

Written on the low-level server so that the keys of its input requests and its `requestState` are
exactly its own, as a test of mcpmux relaying them needs:

- tool `greet`: round 1 asks `user_name` (elicitation) with state `greet:1`; the retry with that
  answer and state gets round 2, `color`, with state `greet:2:<name>`; the retry with that gets
  `"<name> likes <color>"`. A state it did not write, or a missing answer, is refused.
- prompt `briefing`: asks `topic` (elicitation, no state); the retry with the answer gets the prompt.
- tool `seen`: what each `greet` request carried (its input response keys and state), in order.
- tool `sampler`: needs the client's sampling; a request whose `clientCapabilities` declare none is
  refused with -32021 (SEP-2575's MissingRequiredClientCapabilityError), as the SDK's `Sample` does.
- tool `survey`: one round of three requests, as the conformance suite's reference server asks them
  in 2025 (`test_sampling`, `test_elicitation_sep1034_defaults`, `test_elicitation_sep1330_enums`):
  `llm` (sampling), `defaults` (a form whose every field has a default, SEP-1034) and `enums` (the
  five enum shapes of SEP-1330); the retry gets one text block per answer, as JSON.

It speaks 2026-07-28 only: the `initialize` handshake is refused (its tools answer in rounds, which
a 2025 session cannot carry), as a server written for the new revision alone refuses it.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import UNSUPPORTED_PROTOCOL_VERSION

seen: list[dict[str, Any]] = []


def _elicit(message: str, field: str) -> types.ElicitRequest:
    schema = {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def _answer(responses: types.InputResponses | None, key: str, field: str) -> str:
    answer = (responses or {}).get(key)
    if not isinstance(answer, types.ElicitResult) or answer.action != "accept" or not answer.content:
        raise MCPError(types.INVALID_PARAMS, f"no accepted answer under {key!r}")
    return str(answer.content[field])


DEFAULTS: types.ElicitRequestedSchema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
    "required": [],
}
TITLED = [{"const": f"value{n}", "title": title} for n, title in ((1, "First"), (2, "Second"), (3, "Third"))]
ENUMS: types.ElicitRequestedSchema = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {"type": "string", "oneOf": TITLED},
        "legacyEnum": {"type": "string", "enum": ["opt1", "opt2"], "enumNames": ["Option One", "Option Two"]},
        "untitledMulti": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {"type": "string", "enum": ["a", "b"]},
        },
        "titledMulti": {"type": "array", "minItems": 1, "items": {"anyOf": TITLED}},
    },
    "required": [],
}


def _survey() -> types.InputRequests:
    prompt = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="Test prompt"))
    return {
        "llm": types.CreateMessageRequest(params=types.CreateMessageRequestParams(messages=[prompt], max_tokens=100)),
        "defaults": types.ElicitRequest(
            params=types.ElicitRequestFormParams(message="Review the defaults", requested_schema=DEFAULTS)
        ),
        "enums": types.ElicitRequest(
            params=types.ElicitRequestFormParams(message="Pick from the enums", requested_schema=ENUMS)
        ),
    }


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    return types.ListToolsResult(
        tools=[types.Tool(name=name, input_schema=schema) for name in ("greet", "seen", "sampler", "survey")]
    )


async def call_tool(
    ctx: ServerRequestContext, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    if params.name == "seen":
        return _text(repr(seen))
    if params.name == "sampler":
        declared = ((ctx.params or {}).get("_meta") or {}).get("io.modelcontextprotocol/clientCapabilities") or {}
        if "sampling" not in declared:
            required = {"requiredCapabilities": {"sampling": {}}}
            raise MCPError(-32021, "MissingRequiredClientCapabilityError: sampling", data=required)
        return _text("the client can sample")
    if params.name == "survey":
        if not params.input_responses:
            return types.InputRequiredResult(input_requests=_survey())
        missing = {"llm", "defaults", "enums"} - params.input_responses.keys()
        if missing:
            raise MCPError(types.INVALID_PARAMS, f"no answer under {sorted(missing)}")
        answers = [
            params.input_responses[key].model_dump_json(by_alias=True, exclude_none=True)
            for key in ("llm", "defaults", "enums")
        ]
        return types.CallToolResult(content=[types.TextContent(type="text", text=answer) for answer in answers])
    seen.append({"answers": sorted(params.input_responses or {}), "state": params.request_state})
    state = params.request_state
    if state is None:
        return types.InputRequiredResult(
            input_requests={"user_name": _elicit("What is your name?", "name")}, request_state="greet:1"
        )
    if state == "greet:1":
        name = _answer(params.input_responses, "user_name", "name")
        return types.InputRequiredResult(
            input_requests={"color": _elicit(f"{name}, your favourite colour?", "color")},
            request_state=f"greet:2:{name}",
        )
    if state.startswith("greet:2:"):
        return _text(f"{state.removeprefix('greet:2:')} likes {_answer(params.input_responses, 'color', 'color')}")
    raise MCPError(types.INVALID_PARAMS, f"requestState {state!r} was not written by this server")


async def list_prompts(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[types.Prompt(name="briefing")])


async def get_prompt(
    ctx: ServerRequestContext, params: types.GetPromptRequestParams
) -> types.GetPromptResult | types.InputRequiredResult:
    if not params.input_responses:
        return types.InputRequiredResult(input_requests={"topic": _elicit("Brief on what?", "topic")})
    topic = _answer(params.input_responses, "topic", "topic")
    message = types.PromptMessage(role="user", content=types.TextContent(type="text", text=f"Brief me on {topic}."))
    return types.GetPromptResult(messages=[message])


async def _modern_only(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    if ctx.method == "initialize":
        raise MCPError(UNSUPPORTED_PROTOCOL_VERSION, "this server speaks 2026-07-28 only: no initialize handshake")
    return await call_next(ctx)


async def _serve() -> None:
    server = Server(
        "rounds",
        version="1.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    server.middleware.append(_modern_only)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options(NotificationOptions()))


if __name__ == "__main__":
    anyio.run(_serve)
