"""An OpenAI-compatible HTTP API over an `InferenceService`.

`/v1/models`, `/v1/chat/completions` and `/v1/completions` (streamed as SSE ending `data: [DONE]`
when `stream` is true; `response_format` `json_object` or `json_schema` constrains the output;
`tools` + `tool_choice` give `message.tool_calls` and `finish_reason: "tool_calls"`, streamed as
`delta.tool_calls`: the call's id and name first, then its arguments in fragments),
`/v1/embeddings`. Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400
for bad requests (missing messages, bad values, unknown model, a schema the grammar library cannot
use), 503 when the engine's queue is full (retry later), 502 when a remote
backend failed. `openai_mount(service)` is mounted by the frontend's HTTP app; `openai_app(service)`
is the standalone app of `mcpmux serve --openai-only`.
"""

from __future__ import annotations

import base64
import logging
import struct
import time
import uuid
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from mcpmux.inference.engine.outputs import Completion
from mcpmux.inference.errors import EngineError, QueueFullError
from mcpmux.inference.openai.requests import OpenAIBadRequest, parse_embedding, parse_generation
from mcpmux.inference.openai.stream import ChoiceResult, GenerationStream, choice_logprobs, tool_call_json, usage_of
from mcpmux.inference.serving.remote import RemoteError
from mcpmux.inference.serving.service import InferenceService, UnknownModelError

log = logging.getLogger(__name__)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(exc: BaseException) -> JSONResponse:
    """The HTTP status and OpenAI error body for an exception a request raised."""
    if isinstance(exc, OpenAIBadRequest):
        return JSONResponse(error_body(str(exc), "invalid_request_error", exc.param, exc.code), 400)
    if isinstance(exc, QueueFullError):
        return JSONResponse(error_body(str(exc), "server_error", None, "queue_full"), 503)
    if isinstance(exc, RemoteError):
        status = exc.status if exc.status is not None and 400 <= exc.status < 500 else 502
        return JSONResponse(error_body(str(exc), "upstream_error", None, "remote_failed"), status)
    if isinstance(exc, UnknownModelError):
        return JSONResponse(error_body(str(exc), "invalid_request_error", "model", "model_not_found"), 400)
    if isinstance(exc, ValueError):  # a bad sampling value, a prompt too long, no chat template
        return JSONResponse(error_body(str(exc), "invalid_request_error"), 400)
    if isinstance(exc, EngineError):
        return JSONResponse(error_body(str(exc), "invalid_request_error"), 400)
    log.exception("OpenAI API request failed", exc_info=exc)
    return JSONResponse(error_body(f"internal error: {exc!r}", "server_error"), 500)


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError as exc:
        raise OpenAIBadRequest(f"the request body is not valid JSON: {exc}") from exc


class OpenAIRoutes:
    """The endpoint functions, bound to one service."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def models(self, request: Request) -> Response:
        created = int(time.time())
        ids = self.service.model_names() + ([self.service.embedding_model] if self.service.embedding_model else [])
        data = [{"id": name, "object": "model", "created": created, "owned_by": "mcpmux"} for name in ids]
        return JSONResponse({"object": "list", "data": data})

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        try:
            req = parse_generation(await _json(request), chat=chat)
            model = self.service.resolve_model(req.model)
        except (OpenAIBadRequest, EngineError, ValueError) as exc:
            return error_response(exc)
        if req.stream:
            return GenerationStream(self.service, req, model, error_response)
        results: dict[int, Completion] = {}
        errors: list[Exception] = []

        async def run(index: int, prompt: Any, params: Any) -> None:
            try:
                results[index] = await self.service.complete(
                    prompt, params, model=model, priority=req.priority, tools=req.tools
                )
            except Exception as exc:  # answered as one error response below
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for index, prompt, params in req.choices():
                tg.start_soon(run, index, prompt, params)
        if errors:
            return error_response(errors[0])
        choices: list[dict[str, Any]] = []
        finished: list[ChoiceResult] = []
        for index in sorted(results):
            done = results[index]
            finish = "stop" if done.finish_reason == "abort" else done.finish_reason
            wanted = req.top_logprobs is not None
            logprobs = choice_logprobs(self.service, model, chat, done.logprobs) if wanted else None
            if chat:
                call = req.tools.parse(done.text) if req.tools is not None and finish == "stop" else None
                message: dict[str, Any] = {"role": "assistant", "content": done.text}
                if call is not None:
                    message = {"role": "assistant", "content": None, "tool_calls": [tool_call_json(call)]}
                    finish = "tool_calls"
                choices.append({"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs})
            else:
                choices.append({"index": index, "text": done.text, "finish_reason": finish, "logprobs": logprobs})
            finished.append(ChoiceResult(index, done.prompt_tokens, done.cached_prompt_tokens, done.completion_tokens))
        return JSONResponse(
            {
                "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                "usage": usage_of(finished, req.n),
            }
        )

    async def embeddings(self, request: Request) -> Response:
        try:
            req = parse_embedding(await _json(request))
            name = self.service.embedding_model
            if req.model is not None and req.model not in (name, name.removeprefix("builtin:")):
                raise OpenAIBadRequest(
                    f"unknown embedding model {req.model!r}; this server embeds with {name!r}"
                    if name
                    else "embeddings are off on this server ([inference.embeddings] model is empty)",
                    "model",
                    "model_not_found",
                )
            vectors = await self.service.embed(req.texts)
        except Exception as exc:
            return error_response(exc)
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if req.base64 else v,
            }
            for i, v in enumerate(vectors)
        ]
        tokens = await self.service.embedding_token_count(req.texts)
        return JSONResponse(
            {"object": "list", "data": data, "model": name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        )


def openai_routes(service: InferenceService) -> list[Route]:
    """The API's routes, relative to the `/v1` mount point."""
    api = OpenAIRoutes(service)
    return [
        Route("/models", api.models, methods=["GET"]),
        Route("/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/completions", api.completions, methods=["POST"]),
        Route("/embeddings", api.embeddings, methods=["POST"]),
    ]


def openai_mount(service: InferenceService) -> Mount:
    """The API mounted at `/v1`, to add to another Starlette app's routes."""
    return Mount("/v1", routes=openai_routes(service))


def openai_app(service: InferenceService) -> Starlette:
    """A Starlette app serving only `/v1` (for `mcpmux serve --openai-only`)."""
    return Starlette(routes=[openai_mount(service)])
