"""An MCP server (SDK 2.3) whose tool `plan` asks the client's model to pick a tool (sampling with tools).

    python tests/inference/serving/tool_sampling_server.py   # stdio

`plan(prompt, choice, history)` samples with two tools, `weather` and `add`, under `toolChoice`
`choice`; with `history` the conversation already holds one `weather` call and its result, with
`tags` a third tool has a schema llguidance refuses. It
returns the sampled result as JSON (stopReason, model, content blocks), for the tests to check.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer, Resolve, Sample
from mcp_types import (
    CreateMessageResultWithTools,
    SamplingMessage,
    TextContent,
    Tool,
    ToolChoice,
    ToolResultContent,
    ToolUseContent,
)

WEATHER = Tool(
    name="weather",
    description="The weather forecast for a city.",
    input_schema={
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
)
ADD = Tool(
    name="add",
    description="Add two small numbers.",
    input_schema={
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 999},
            "b": {"type": "integer", "minimum": 0, "maximum": 999},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)
# llguidance has no `uniqueItems`: a tool the grammar cannot hold the model to.
TAGS = Tool(
    name="tag",
    input_schema={"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
)
server = MCPServer("tool-sampling-demo")


def _plan_request(
    prompt: str,
    choice: str = "auto",
    history: bool = False,
    max_tokens: int = 96,
    seed: int = 0,
    tags: bool = False,
    temperature: float = 1.0,
) -> Sample:
    messages = [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))]
    if history:
        call = ToolUseContent(type="tool_use", id="use-1", name="weather", input={"city": "Paris", "days": 2})
        result = ToolResultContent(
            type="tool_result", tool_use_id="use-1", content=[TextContent(type="text", text="Sunny, 21 C")]
        )
        messages += [SamplingMessage(role="assistant", content=[call]), SamplingMessage(role="user", content=[result])]
    return Sample(
        messages,
        max_tokens=max_tokens,
        temperature=temperature,
        metadata={"seed": seed},
        tools=[WEATHER, ADD, TAGS] if tags else [WEATHER, ADD],
        tool_choice=ToolChoice(mode=choice),  # type: ignore[arg-type]  # the tests pass the three modes
    )


@server.tool()
async def plan(
    prompt: str,
    result: Annotated[CreateMessageResultWithTools, Resolve(_plan_request)],
    choice: str = "auto",
    history: bool = False,
    max_tokens: int = 96,
    seed: int = 0,
    tags: bool = False,
    temperature: float = 1.0,
) -> dict[str, Any]:
    """Ask the model to answer `prompt` with the weather and add tools; return what it sampled."""
    blocks = result.content if isinstance(result.content, list) else [result.content]
    return {
        "stop_reason": result.stop_reason,
        "model": result.model,
        "content": [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in blocks],
    }


if __name__ == "__main__":
    server.run("stdio")
