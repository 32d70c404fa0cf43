"""Answers upstream servers' `sampling/createMessage`, in both protocol eras.

Each upstream `Client` gets `SamplingBridge.callback(name, settings)` as its `sampling_callback`;
the SDK calls it for 2025 pushed requests and for 2026-07-28 input-required rounds alike. The
upstream's `[servers.NAME.sampling] policy` decides who answers:

- `local`: the in-process `InferenceService` (the continuous-batching engine, or the remote backend);
- `client`: the client whose tool call caused the request, if it declared sampling. A 2025 session
  gets a pushed request; a 2026-07-28 client, which has no back channel, gets it in an input-required
  round of its parked call (`mcpmux.server.input_rounds`). Nothing in the protocol links the two requests, so
  the frontend tracks the calls in flight on each upstream, and the client of the most recent one is
  asked if it can sample (`mcpmux.server.client_relay`);
- `client-then-local` (the default): the client when one can answer, else the local model;
- `off`: refused with an error that names the setting to change.

Mapping to the local model: `systemPrompt` becomes a system message ahead of the conversation, which
goes through the model's chat template; `maxTokens` is capped by the upstream's `max_tokens`;
`temperature` defaults to 1.0; `stopSequences` end the text before the match (`stopReason:
"stopSequence"`); `metadata` may carry `seed`, `top_p`, `top_k` and `min_p` (other keys are ignored);
`modelPreferences` hints pick a configured model by substring, in order, and its cost/speed/
intelligence priorities pick one when no hint matches. `includeContext` is ignored: mcpmux has no
conversation of its own to include. Images and audio are refused by name: the local models read text.

Tools (`tools` + `toolChoice`): the tools are written into the system message and the output is held
by a grammar to one call of one of them (`required`), or to text or one call (`auto`, the default);
`none` samples plain text. A remote backend is asked for the same as a JSON schema and its answer
is checked on return (`serving.remote_form`). A call comes back as a `tool_use` block whose `input` matches the tool's
`inputSchema`, with `stopReason: "toolUse"`; earlier `tool_use` and `tool_result` blocks are shown
to the model in the same form (`serving.tool_calls`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.client.session import ClientRequestContext, SamplingFnT
from mcp.shared.exceptions import MCPError

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.errors import EngineError, InvalidSettingError
from mcpmux.inference.serving.settings import SamplingSettings
from mcpmux.inference.serving.tool_calls import CALL_MARKER, ToolSpec, ToolUse, call_text, result_text

if TYPE_CHECKING:
    from mcpmux.inference.serving.service import InferenceService

logger = logging.getLogger(__name__)

SamplingResult = types.CreateMessageResult | types.CreateMessageResultWithTools
ClientSampler = Callable[[str, types.CreateMessageRequestParams], Awaitable[SamplingResult | None]]
"""Forwards `(upstream, params)` to a client that can sample; None when no such client has a call in flight."""

DEFAULT_TEMPERATURE = 1.0
RECENT_TIMINGS = 4096
_METADATA_PARAMS = {"seed": int, "top_p": float, "top_k": int, "min_p": float}
_CONTENT_NAMES = {"image": "image", "audio": "audio", "resource": "embedded resource", "resource_link": "resource link"}


class SamplingRefusedError(Exception):
    """A sampling request mcpmux will not answer; the message says why and what to change."""


@dataclass(slots=True)
class SamplingCounts:
    """How this process answered sampling requests so far."""

    local: int = 0
    client: int = 0
    refused: int = 0


@dataclass(frozen=True, slots=True)
class SamplingTiming:
    """One locally answered request: seconds to its first text and to its end, and tokens generated."""

    upstream: str
    model: str
    ttft: float
    latency: float
    completion_tokens: int


@dataclass(slots=True)
class _Generated:
    text: str
    stop_reason: str
    ttft: float
    completion_tokens: int


@dataclass(slots=True)
class SamplingBridge:
    """Turns upstream sampling requests into local completions or forwards them to a client.

    `service` is set once the Mux has started the `InferenceService` (None while inference is off);
    `client_sampler` is set by the frontend that serves the clients.
    """

    service: InferenceService | None = None
    client_sampler: ClientSampler | None = None
    counts: SamplingCounts = field(default_factory=SamplingCounts)
    recent: deque[SamplingTiming] = field(default_factory=lambda: deque(maxlen=RECENT_TIMINGS))

    def callback(self, upstream: str, settings: SamplingSettings) -> SamplingFnT:
        """The `sampling_callback` for one upstream's `Client`."""

        async def on_sampling(
            context: ClientRequestContext, params: types.CreateMessageRequestParams
        ) -> SamplingResult | types.ErrorData:
            return await self.answer(upstream, settings, params)

        return on_sampling

    def samples_for(self, settings: SamplingSettings) -> Callable[[types.ClientCapabilities | None], bool]:
        """Whether an upstream under `settings` can have its sampling answered for a client that declared
        `capabilities`: by that client (a `client*` policy, and it declared sampling) or by the local
        model (`local`, `client-then-local`, with local inference on)."""

        def answers(capabilities: types.ClientCapabilities | None) -> bool:
            if settings.asks_client and capabilities is not None and capabilities.sampling is not None:
                return True
            return settings.policy in ("local", "client-then-local") and self.service is not None

        return answers

    async def answer(
        self, upstream: str, settings: SamplingSettings, params: types.CreateMessageRequestParams
    ) -> SamplingResult | types.ErrorData:
        """Answer one request under the upstream's policy; failures come back as `ErrorData` for the upstream."""
        try:
            result = await self._answer(upstream, settings, params)
        except MCPError as err:  # the client declined or failed: its word stands, no local fallback
            self.counts.refused += 1
            return err.error
        except (SamplingRefusedError, EngineError) as err:
            self.counts.refused += 1
            logger.info("sampling request from upstream %r refused: %s", upstream, err)
            code = types.INVALID_REQUEST if isinstance(err, SamplingRefusedError) else types.INTERNAL_ERROR
            return types.ErrorData(code=code, message=str(err))
        return result

    async def _answer(
        self, upstream: str, settings: SamplingSettings, params: types.CreateMessageRequestParams
    ) -> SamplingResult:
        policy = settings.policy
        if policy == "off":
            raise SamplingRefusedError(
                f"upstream {upstream!r} asked for sampling, but its sampling policy is 'off'; set "
                f'[servers.{upstream}.sampling] policy = "local", "client" or "client-then-local" to answer it'
            )
        if settings.asks_client and self.client_sampler is not None:
            forwarded = await self.client_sampler(upstream, params)
            if forwarded is not None:
                self.counts.client += 1
                return forwarded
        if policy == "client":
            raise SamplingRefusedError(
                f"upstream {upstream!r} asked for sampling under policy 'client', but no client with a call in "
                # Never say "session" here: upstream.py reads INVALID_REQUEST + "session" as an expired session.
                "flight on it declared sampling; "
                f'set [servers.{upstream}.sampling] policy = "client-then-local" to fall back to the local model'
            )
        result = await self._sample_locally(upstream, settings, params)
        self.counts.local += 1
        return result

    async def _sample_locally(
        self, upstream: str, settings: SamplingSettings, params: types.CreateMessageRequestParams
    ) -> SamplingResult:
        service = self.service
        if service is None:
            raise SamplingRefusedError(
                f"upstream {upstream!r} asked for sampling and no client could answer it, but local inference is "
                'off; set [inference] backend = "local" (or "openai") to answer with a model'
            )
        hints, priorities = _preferences(params.model_preferences)
        model = service.choose_model(hints, **priorities)
        use = tool_use_of(upstream, params)
        messages = to_chat_messages(upstream, model, params)
        sampling = to_sampling_params(params, settings)
        started = time.perf_counter()
        try:
            out = await _generate(service, messages, sampling, model, settings.priority, params, use)
        except InvalidSettingError as err:
            if use is None:
                raise
            raise SamplingRefusedError(
                f"upstream {upstream!r} asked for sampling with tools whose input schemas the local model "
                f"{model!r} cannot be held to ({err}); simplify those schemas, or forward such requests to a client "
                "with policy 'client'"
            ) from None
        latency = time.perf_counter() - started
        self.recent.append(SamplingTiming(upstream, model, out.ttft or latency, latency, out.completion_tokens))
        text = types.TextContent(type="text", text=out.text)
        if use is None:
            return types.CreateMessageResult(role="assistant", content=text, model=model, stop_reason=out.stop_reason)
        call = use.parse(out.text) if out.stop_reason == "endTurn" else None
        if call is None:
            return types.CreateMessageResultWithTools(
                role="assistant", content=[text], model=model, stop_reason=out.stop_reason
            )
        block = types.ToolUseContent(type="tool_use", id=call.id, name=call.name, input=call.arguments)
        return types.CreateMessageResultWithTools(role="assistant", content=[block], model=model, stop_reason="toolUse")


def tool_use_of(upstream: str, params: types.CreateMessageRequestParams) -> ToolUse | None:
    """The request's tools and tool choice; None when it has no tools."""
    if not params.tools:
        return None
    mode = (params.tool_choice.mode if params.tool_choice else None) or "auto"
    tools = tuple(ToolSpec(t.name, t.description or "", t.input_schema) for t in params.tools)
    try:
        return ToolUse(tools, mode)
    except ValueError as err:
        raise SamplingRefusedError(f"upstream {upstream!r} asked for sampling with tools, but {err}") from None


def to_chat_messages(upstream: str, model: str, params: types.CreateMessageRequestParams) -> list[dict[str, str]]:
    """The request as chat-template messages; refuses what a text-only model cannot take, by name."""
    messages = [{"role": "system", "content": params.system_prompt}] if params.system_prompt else []
    for index, message in enumerate(params.messages):
        blocks = message.content if isinstance(message.content, list) else [message.content]
        parts = [_block_text(upstream, model, index, block) for block in blocks]
        messages.append({"role": message.role, "content": "\n".join(parts)})
    if len(messages) == (1 if params.system_prompt else 0):
        raise SamplingRefusedError(f"upstream {upstream!r} asked for sampling with no messages")
    return messages


def _block_text(upstream: str, model: str, index: int, block: Any) -> str:
    """One content block as the text the model reads (tool calls and results in `tool_calls`' form)."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ToolUseContent):
        return call_text(block.name, block.input)
    if isinstance(block, types.ToolResultContent):
        parts = [_block_text(upstream, model, index, inner) for inner in block.content]
        if block.structured_content is not None and not parts:
            parts.append(json.dumps(block.structured_content))
        return result_text("\n".join(parts), is_error=bool(block.is_error))
    what = _CONTENT_NAMES.get(block.type, block.type)
    raise SamplingRefusedError(
        f"upstream {upstream!r} sent {what} content in sampling message {index}, which local model "
        f"{model!r} cannot read (text only); send text, or forward such requests to a client that "
        "supports them with policy 'client'"
    )


def to_sampling_params(params: types.CreateMessageRequestParams, settings: SamplingSettings) -> SamplingParams:
    """Engine sampling parameters; stop sequences are matched by the bridge to report `stopSequence`, and
    the tools travel beside them (each backend asks for a call in its own way)."""
    extra: dict[str, Any] = {}
    for key, kind in _METADATA_PARAMS.items():
        value = (params.metadata or {}).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            extra[key] = kind(value)
    temperature = params.temperature if params.temperature is not None else DEFAULT_TEMPERATURE
    return SamplingParams(
        max_tokens=min(params.max_tokens, settings.max_tokens),
        temperature=temperature,
        **extra,
    )


async def _generate(
    service: InferenceService,
    messages: list[dict[str, str]],
    sampling: SamplingParams,
    model: str,
    priority: int,
    params: types.CreateMessageRequestParams,
    use: ToolUse | None,
) -> _Generated:
    """Run the completion; return its text, the MCP stop reason, time to first text and token count."""
    stops = [s for s in params.stop_sequences or () if s]
    longest = max((len(s) for s in stops), default=0)
    started = time.perf_counter()
    text, ttft, tokens = "", 0.0, 0
    # Closing the stream on early exit makes the engine abort the request at once.
    async with aclosing(service.stream(messages, sampling, model=model, priority=priority, tools=use)) as deltas:
        async for delta in deltas:
            searched_from = max(0, len(text) - longest + 1)
            text += delta.text
            ttft = ttft or (time.perf_counter() - started if delta.text else 0.0)
            tokens = max(tokens + len(delta.token_ids), delta.completion_tokens)
            hits = [i for i in (text.find(s, searched_from) for s in stops) if i >= 0]
            if hits and not text.startswith(CALL_MARKER):  # a tool call is never cut
                # Leaving the loop closes the stream, which aborts the request in the engine.
                return _Generated(text[: min(hits)], "stopSequence", ttft, tokens)
            if delta.finish_reason == "length":
                return _Generated(text, "maxTokens", ttft, tokens)
            if delta.finish_reason == "abort":
                raise EngineError(f"the model {model!r} aborted the request (the engine is shutting down)")
    return _Generated(text, "endTurn", ttft, tokens)


def _preferences(prefs: types.ModelPreferences | None) -> tuple[list[str], dict[str, float | None]]:
    if prefs is None:
        return [], {}
    hints = [hint.name for hint in prefs.hints or () if hint.name]
    return hints, {
        "cost": prefs.cost_priority,
        "speed": prefs.speed_priority,
        "intelligence": prefs.intelligence_priority,
    }
