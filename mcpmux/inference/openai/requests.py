"""Parse OpenAI request bodies into typed requests; every problem is an `OpenAIBadRequest` naming the field."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from mcpmux.inference.engine.config import Grammar, SamplingParams
from mcpmux.inference.errors import InvalidSettingError
from mcpmux.inference.serving.tool_calls import MODES, ToolSpec, ToolUse, call_text, result_text

# Used when a request gives no max_tokens: long enough for an answer, short enough not to hog the engine.
DEFAULT_MAX_TOKENS = 256
MAX_N = 16


class OpenAIBadRequest(ValueError):
    """A request the API refuses with HTTP 400; `param` names the offending field (OpenAI's error shape)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


Prompt = str | list[dict[str, str]]


@dataclass(slots=True)
class GenerationRequest:
    """A chat or text completion request: one prompt per entry, `n` choices each."""

    chat: bool
    model: str | None
    prompts: list[Prompt]
    n: int
    params: SamplingParams
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no logprobs
    tools: ToolUse | None = None  # chat only: the tools the model may call
    priority: int = 0  # mcpmux's sense: larger runs first

    def choices(self) -> list[tuple[int, Prompt, SamplingParams]]:
        """(index, prompt, params) per choice; choice j > 0 of a seeded request gets seed + j, so the
        n choices differ yet each is reproducible."""
        out = []
        for p, prompt in enumerate(self.prompts):
            for j in range(self.n):
                params = self.params
                if j and params.seed is not None:
                    params = _replace_seed(params, params.seed + j)
                out.append((p * self.n + j, prompt, params))
        return out


@dataclass(slots=True)
class EmbeddingRequest:
    model: str | None
    texts: list[str]
    base64: bool


def _replace_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return dataclasses.replace(params, seed=seed)


def _response_format(body: dict[str, Any]) -> Grammar | None:
    """`response_format` as a grammar: `json_object` (any JSON object) or `json_schema` (its `schema`)."""
    given = body.get("response_format")
    kind = given.get("type") if isinstance(given, dict) else None
    if given is None or kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_schema", '{"type": "object"}')
    if kind == "json_schema":
        spec = given.get("json_schema")
        schema = spec.get("schema", {"type": "object"}) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise OpenAIBadRequest(
                "response_format.json_schema must be an object whose schema is a JSON schema object",
                "response_format",
            )
        return Grammar("json_schema", json.dumps(schema))
    raise OpenAIBadRequest(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}", "response_format"
    )


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise OpenAIBadRequest(f"{key} must be a number between {low:g} and {high:g}, got {value!r}", key)
    return float(value)


def _int(body: dict[str, Any], key: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise OpenAIBadRequest(f"{key} must be an integer {bound}, got {value!r}", key)
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise OpenAIBadRequest(f"stop must be a non-empty string or a list of up to 4 of them, got {stop!r}", "stop")
    return tuple(stops)


def _message(i: int, message: Any) -> dict[str, str]:
    """One chat message as template text; a tool's result and an assistant's tool calls are written
    the way `tool_calls` shows them to the model."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise OpenAIBadRequest(f"messages[{i}] must be an object with a role and content", f"messages[{i}]")
    content = _content(i, message.get("content"))
    if message["role"] == "tool":
        return {"role": "user", "content": result_text(content)}
    calls = message.get("tool_calls") if message["role"] == "assistant" else None
    if calls:
        if not isinstance(calls, list):
            raise OpenAIBadRequest(f"messages[{i}].tool_calls must be a list", f"messages[{i}].tool_calls")
        content = "\n".join([content] * bool(content) + [_call_text(i, call) for call in calls])
    return {"role": message["role"], "content": content}


def _content(i: int, content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise OpenAIBadRequest(
                    f"messages[{i}].content has a {kind!r} part; only text parts are supported by local models",
                    f"messages[{i}].content",
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    if not isinstance(content, str):
        raise OpenAIBadRequest(f"messages[{i}].content must be a string or text parts", f"messages[{i}].content")
    return content


def _call_text(i: int, call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise OpenAIBadRequest(
            f"messages[{i}].tool_calls entries must be {{type: function, function: {{name, arguments}}}}",
            f"messages[{i}].tool_calls",
        )
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments  # shown as written: the model sees what was sent
    return call_text(function["name"], parsed)


def _tools(body: dict[str, Any]) -> ToolUse | None:
    """`tools` + `tool_choice` (`auto` by default, `required`, `none`, or a named function)."""
    given = body.get("tools")
    if not given:
        if body.get("tool_choice") not in (None, "none"):
            raise OpenAIBadRequest("tool_choice needs tools: give the functions the model may call", "tool_choice")
        return None
    if not isinstance(given, list):
        raise OpenAIBadRequest("tools must be a list of {type: function, function: {...}} objects", "tools")
    specs = []
    for i, tool in enumerate(given):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise OpenAIBadRequest(
                f"tools[{i}] must be {{type: function, function: {{name, description, parameters}}}}", f"tools[{i}]"
            )
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise OpenAIBadRequest(f"tools[{i}].function.parameters must be a JSON schema object", f"tools[{i}]")
        specs.append(ToolSpec(function["name"], str(function.get("description") or ""), parameters))
    choice = body.get("tool_choice", "auto")
    try:
        if isinstance(choice, str) and choice in MODES:
            return ToolUse(tuple(specs), choice)  # type: ignore[arg-type]  # checked against MODES
        named = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
        if not isinstance(named, dict) or not isinstance(named.get("name"), str):
            raise OpenAIBadRequest(
                f"tool_choice must be 'auto', 'required', 'none' or {{type: function, function: {{name}}}}, "
                f"got {choice!r}",
                "tool_choice",
            )
        return ToolUse(tuple(specs), "required", named["name"])
    except ValueError as exc:
        if isinstance(exc, OpenAIBadRequest):
            raise
        raise OpenAIBadRequest(str(exc), "tool_choice") from exc


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise OpenAIBadRequest(f"model must be a string, got {model!r}", "model")
    return model


def parse_generation(body: Any, *, chat: bool) -> GenerationRequest:
    """A `/v1/chat/completions` (chat=True) or `/v1/completions` body."""
    if not isinstance(body, dict):
        raise OpenAIBadRequest("the request body must be a JSON object")
    prompts: list[Prompt]
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OpenAIBadRequest("messages is required: a non-empty list of {role, content} objects", "messages")
        tools = _tools(body)
        chat_messages = [_message(i, m) for i, m in enumerate(messages)]
        prompts = [chat_messages]  # the tools are written in by the backend that serves them
        top = _int(body, "top_logprobs", None, 0, 20)
        top_logprobs = (top or 0) if body.get("logprobs") else None
    else:
        tools = None
        if body.get("tools"):
            raise OpenAIBadRequest("tools are for /v1/chat/completions; /v1/completions takes a prompt only", "tools")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = list(prompt)
        else:
            raise OpenAIBadRequest("prompt is required: a string or a non-empty list of strings", "prompt")
        top_logprobs = _int(body, "logprobs", None, 0, 5)
    max_tokens = _int(body, "max_completion_tokens", None, 1) if chat else None
    max_tokens = max_tokens or _int(body, "max_tokens", DEFAULT_MAX_TOKENS, 1)
    seed = _int(body, "seed", None, -(2**63))
    grammar = _response_format(body)
    if tools is not None and tools.may_call and grammar is not None:
        raise OpenAIBadRequest(
            "response_format cannot be combined with tools the model may call; set tool_choice to 'none' "
            "or drop response_format",
            "response_format",
        )
    try:
        params = SamplingParams(
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
            seed=seed,
            stop=_stop(body),
            logprobs=top_logprobs,
            grammar=grammar,
            ignore_eos=body.get("ignore_eos") is True,  # vLLM's extension (benchmarks ask for exact lengths)
        )
    except InvalidSettingError as exc:
        raise OpenAIBadRequest(str(exc)) from exc
    options = body.get("stream_options") or {}
    return GenerationRequest(
        chat=chat,
        model=_model(body),
        prompts=prompts,
        n=_int(body, "n", 1, 1, MAX_N) or 1,
        params=params,
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        top_logprobs=top_logprobs,
        tools=tools,
        # vLLM's extension, in vLLM's sense (lower runs first), so one mcpmux can forward to another.
        priority=-(_int(body, "priority", 0, -(2**31), 2**31) or 0),
    )


def parse_embedding(body: Any) -> EmbeddingRequest:
    """A `/v1/embeddings` body: `input` is a string or a list of strings."""
    if not isinstance(body, dict):
        raise OpenAIBadRequest("the request body must be a JSON object")
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise OpenAIBadRequest("input is required: a string or a non-empty list of strings", "input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise OpenAIBadRequest(f"encoding_format must be 'float' or 'base64', got {encoding!r}", "encoding_format")
    return EmbeddingRequest(_model(body), texts, encoding == "base64")
