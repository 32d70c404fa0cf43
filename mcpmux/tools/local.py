"""The local inference tools: `local__generate` and `local__embed` (the prefix is `[inference] namespace`).

`generate` takes a `prompt` or chat `messages` plus sampling parameters and returns the text; when
the client passes a progress token, each new piece of text is sent as a progress notification whose
message is the text so far. With a JSON `schema`, the output is held to it token by token and its
parsed value is `structuredContent.value`; a schema the grammar engine cannot use, or an output cut
by `max_tokens` before it is complete, is an error result saying which. `embed` returns one
normalized vector per input text. Both run on the Mux's `InferenceService`, so they share its engine
(and its batch) with upstream sampling and /v1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Literal

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mcpmux.core.inbound import Caller
from mcpmux.errors import error_result
from mcpmux.inference.engine.config import Grammar, SamplingParams
from mcpmux.inference.errors import EngineError
from mcpmux.tools.base import LocalTool
from mcpmux.upstream.lane import ProgressFn

if TYPE_CHECKING:
    from mcpmux.inference.serving.service import InferenceService

MAX_EMBED_TEXTS = 256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class _GenerateArgs(_Strict):
    prompt: str | None = None
    messages: list[_Message] | None = Field(default=None, min_length=1)
    model: str | None = None
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")

    @model_validator(mode="after")
    def _one_input(self) -> _GenerateArgs:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' (plain text) or 'messages' (chat)")
        return self


class _EmbedArgs(_Strict):
    texts: list[str] = Field(min_length=1, max_length=MAX_EMBED_TEXTS)


def _schema(args: type[BaseModel], descriptions: dict[str, str]) -> dict[str, Any]:
    schema = args.model_json_schema()
    for name, text in descriptions.items():
        schema["properties"][name]["description"] = text
    return schema


GENERATE_DESCRIPTIONS = {
    "prompt": "Plain text to continue (give this or 'messages').",
    "messages": "Chat messages [{role, content}], rendered with the model's chat template.",
    "model": "A configured model name; default: the first configured model.",
    "max_tokens": "Most tokens to generate.",
    "temperature": "0 is greedy; higher is more random.",
    "seed": "Makes sampling reproducible.",
    "stop": "Strings that end the output (not included).",
    "schema": "A JSON schema the output must match; its parsed value is structuredContent.value.",
}


def _bad_arguments(tool: str, err: ValidationError) -> types.CallToolResult:
    problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in err.errors())
    return error_result(f"invalid arguments for {tool}: {problems}")


def inference_tools(service: Callable[[], InferenceService | None], namespace: str, separator: str) -> list[LocalTool]:
    """The generate and embed tools; `service()` returns the running `InferenceService` (or None)."""
    generate_name = f"{namespace}{separator}generate"
    embed_name = f"{namespace}{separator}embed"

    def running(tool: str) -> InferenceService:
        svc = service()
        if svc is None:
            raise EngineError(f"{tool} cannot run: the inference service is not running (is the Mux started?)")
        return svc

    async def generate(arguments: dict[str, Any], progress: ProgressFn | None, caller: Caller) -> types.CallToolResult:
        try:
            args = _GenerateArgs.model_validate(arguments)
        except ValidationError as err:
            return _bad_arguments(generate_name, err)
        try:
            svc = running(generate_name)
            params = SamplingParams(
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=args.top_k,
                seed=args.seed,
                stop=tuple(args.stop),
                grammar=Grammar("json_schema", json.dumps(args.schema_)) if args.schema_ is not None else None,
            )
            chat = [m.model_dump() for m in args.messages or ()]
            prompt: str | list[dict[str, str]] = chat or args.prompt or ""
            model = svc.resolve_model(args.model)
            text, done, finish, usage = "", 0, "stop", (0, 0, 0)
            # Closing the generator (also on cancellation) aborts the request in the engine at once.
            async with aclosing(svc.stream(prompt, params, model=model)) as deltas:
                async for delta in deltas:
                    text += delta.text
                    done += max(1, len(delta.token_ids))
                    if progress is not None and delta.text:
                        await progress(done, args.max_tokens, text)
                    if delta.finish_reason is not None:
                        finish = delta.finish_reason
                        usage = (delta.prompt_tokens, delta.cached_prompt_tokens, delta.completion_tokens)
        except EngineError as err:
            return error_result(f"{generate_name} failed: {err}")
        structured: dict[str, Any] = {
            "text": text,
            "model": model,
            "finish_reason": finish,
            "usage": {"prompt_tokens": usage[0], "cached_prompt_tokens": usage[1], "completion_tokens": usage[2]},
        }
        if args.schema_ is not None:
            if finish != "stop":
                return error_result(
                    f"{generate_name} stopped ({finish}) after {args.max_tokens} tokens before its output matched "
                    f"the schema; raise max_tokens or simplify the schema. The output so far: {text}"
                )
            structured["value"] = json.loads(text)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)

    async def embed(arguments: dict[str, Any], progress: ProgressFn | None, caller: Caller) -> types.CallToolResult:
        try:
            args = _EmbedArgs.model_validate(arguments)
        except ValidationError as err:
            return _bad_arguments(embed_name, err)
        try:
            svc = running(embed_name)
            vectors = await svc.embed(args.texts)
        except EngineError as err:
            return error_result(f"{embed_name} failed: {err}")
        structured = {"model": svc.embedding_model, "dimensions": len(vectors[0]), "embeddings": vectors}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(structured))], structured_content=structured
        )

    return [
        LocalTool(
            types.Tool(
                name=generate_name,
                description=(
                    "Generate text with mcpmux's local model from a prompt or chat messages. Progress "
                    "notifications carry the text so far when a progress token is given."
                ),
                input_schema=_schema(_GenerateArgs, GENERATE_DESCRIPTIONS),
            ),
            generate,
        ),
        LocalTool(
            types.Tool(
                name=embed_name,
                description="Embed texts with mcpmux's local embedding model: one normalized vector per text.",
                input_schema=_schema(_EmbedArgs, {"texts": f"The texts to embed (1 to {MAX_EMBED_TEXTS})."}),
            ),
            embed,
        ),
    ]
