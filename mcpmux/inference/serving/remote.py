"""A remote backend: completions and embeddings from one OpenAI-compatible server (vLLM, SGLang, TGI).

The fleet (`serving.fleet`) hands it a `Generation`; it sends `/completions` (a prompt) or
`/chat/completions` (messages), streamed over SSE when the caller reads text as it comes. Structured
requests and tool calls go in their remote form (`serving.remote_form`): the first one asks the
server, once, whether it follows `response_format` `json_schema`; one that does gets the schema,
one that does not is asked in the prompt, and the answer is checked either way before anything of it
is passed on. Priorities travel as vLLM's `priority` field (lower runs first there), once the server
has accepted one.

Every failure is a `RemoteError` that names the URL and says what happened: the timeout and its
value, the connection error, or the HTTP status with the server's own message. `backend_failed`
tells the fleet whether another backend should be tried (the server is down, overloaded or broken)
or the request itself is at fault (the same request would fail anywhere).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import AsyncGenerator
from contextlib import aclosing
from types import TracebackType
from typing import Any

import anyio
import httpx2

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.errors import EngineError
from mcpmux.inference.serving import sse_client
from mcpmux.inference.serving.delta import Delta
from mcpmux.inference.serving.generation import Generation, Prompt
from mcpmux.inference.serving.remote_form import RemoteForm, remote_form
from mcpmux.inference.serving.settings import BackendSettings
from mcpmux.wire.http_response import HttpWireError

log = logging.getLogger(__name__)

# The request that asks a server, once, whether it holds answers to `response_format` `json_schema`.
_PROBE_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
_IN_PROMPT = "structured output and tool calls are asked for in the prompt and checked on return"
_PROBE_MESSAGES = [{"role": "user", "content": 'Is the sky blue? Answer {"ok": true} or {"ok": false}.'}]


class RemoteError(EngineError):
    """The remote server failed a request; `status` is its HTTP status (None: no answer at all);
    `backend_failed`: the server is at fault (down, overloaded, broken), not the request."""

    def __init__(self, message: str, status: int | None = None, *, backend_failed: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.backend_failed = backend_failed


class InvalidAnswerError(RemoteError):
    """The server answered, but not in the form asked for (a schema or a tool call it does not match)."""


def request_body(
    prompt: Prompt,
    params: SamplingParams,
    model: str,
    *,
    stream: bool,
    schema: dict[str, Any] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The OpenAI request body for a prompt (`/completions`) or chat messages (`/chat/completions`)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": stream,
    }
    body["prompt" if isinstance(prompt, str) else "messages"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    # vLLM and SGLang accept these extensions; send them only when they change anything.
    if params.top_k:
        body["top_k"] = params.top_k
    if params.min_p:
        body["min_p"] = params.min_p
    if params.ignore_eos:
        body["ignore_eos"] = True
    if schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        }
    if priority:
        body["priority"] = -priority  # vLLM runs lower values first; mcpmux larger ones
    return body


def _usage(usage: dict[str, Any] | None) -> tuple[int, int, int]:
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return int(usage.get("prompt_tokens") or 0), int(cached), int(usage.get("completion_tokens") or 0)


def _choice_text(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return str(choice["text"] or "")
    message = choice.get("delta") or choice.get("message") or {}
    return str(message.get("content") or "")


class RemoteBackend:
    """An HTTP client for one OpenAI-compatible server; enter with `async with`.

    `config_key` is where its settings are (`[inference.remote]`, or one of `[[inference.backends]]`),
    for errors that say what to change.
    """

    def __init__(self, settings: BackendSettings, embedding_model: str, config_key: str) -> None:
        assert settings.base_url is not None, "checked by BackendSettings"
        self.settings = settings
        self.name = settings.label
        self.base_url = settings.base_url.rstrip("/")
        self.models = settings.model_names()
        self.config_key = config_key
        self._embedding_model = embedding_model
        self._client: httpx2.AsyncClient | None = None
        self._streams: sse_client.SseClient | None = None  # streamed requests, where it can reach the server
        self._counts: Counter[str] = Counter()
        self.takes_json_schema: bool | None = None  # None until asked (the first structured request)
        self.takes_priority: bool | None = None  # None until asked (the first request with a priority)
        self._asking = anyio.Lock()

    async def __aenter__(self) -> RemoteBackend:
        headers = {}
        if self.settings.api_key_env:
            key = os.environ.get(self.settings.api_key_env)
            if not key:
                raise RemoteError(
                    f"{self.config_key} api_key_env names {self.settings.api_key_env!r}, but that environment "
                    f"variable is not set; export it with the API key for {self.base_url}"
                )
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx2.AsyncClient(headers=headers, timeout=self.settings.timeout)
        if sse_client.usable(self.base_url):
            self._streams = sse_client.SseClient(self.base_url, headers, self.settings.timeout)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._streams is not None:
            self._streams.close()
        if self._client is not None:
            await self._client.aclose()

    def stats(self) -> dict[str, Any]:
        """The server, what it was found to accept, and requests sent and failed by endpoint."""
        return {
            "base_url": self.base_url,
            "json_schema": self.takes_json_schema,
            "priority": self.takes_priority,
            "sent": dict(self._counts),
        }

    # -- generation ------------------------------------------------------------------------------

    async def stream(self, generation: Generation) -> AsyncGenerator[Delta, None]:
        """The completion as deltas; the last carries the finish reason and the usage. A structured answer
        comes whole, once checked (`InvalidAnswerError` when it does not match)."""
        form = remote_form(generation)
        schema = None
        if form.schema is not None:
            schema = form.schema if await self._json_schema_taken() else None
        prompt = form.prompt if form.schema is None or schema is not None else form.asked_in_prompt()
        priority = generation.priority if generation.priority and await self._priority_taken() else None
        model = self.models[generation.model]
        if generation.incremental and form.schema is None:
            async for delta in self._sse(prompt, generation.params, model, priority):
                yield delta
            return
        body = request_body(prompt, generation.params, model, stream=False, schema=schema, priority=priority)
        answer = await self._post(_path(prompt), body)
        choice = (answer.get("choices") or [{}])[0]
        text, finish = _choice_text(choice), str(choice.get("finish_reason") or "stop")
        if form.schema is not None:
            text = self._checked(form, text) if finish == "stop" else form.read_cut(text)
        prompt_tokens, cached, completion_tokens = _usage(answer.get("usage"))
        if text:
            yield Delta(text)
        yield Delta("", finish, prompt_tokens=prompt_tokens, cached_prompt_tokens=cached,
                    completion_tokens=completion_tokens)  # fmt: skip

    def _checked(self, form: RemoteForm, text: str) -> str:
        try:
            return form.read(text)
        except ValueError as err:
            self._counts["invalid answers"] += 1
            how = "held to the schema" if self.takes_json_schema else "asked in the prompt (it refuses json_schema)"
            raise InvalidAnswerError(
                f"the remote inference server {self.base_url} ({how}) answered wrongly: {err}"
            ) from None

    async def _sse(
        self, prompt: Prompt, params: SamplingParams, model: str, priority: int | None
    ) -> AsyncGenerator[Delta, None]:
        path = _path(prompt)
        finish: str | None = None
        usage: dict[str, Any] | None = None
        body = request_body(prompt, params, model, stream=True, priority=priority)
        self._counts[path] += 1
        try:
            async with aclosing(self._events(path, body)) as events:
                async for data in events:
                    if data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if chunk.get("error"):  # the server failed after the answer began
                        raise self._broke(path, chunk["error"])
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        finish = choice.get("finish_reason") or finish
                        text = _choice_text(choice)
                        if text:
                            yield Delta(text)
        except (httpx2.TimeoutException, TimeoutError) as exc:
            raise self._timeout(path) from exc
        except (httpx2.TransportError, OSError, HttpWireError) as exc:
            raise self._lost(path, exc) from exc
        except sse_client.StatusError as exc:
            raise self._status_error(path, exc.status, exc.reason, exc.body) from None
        if finish is None:  # the stream ended without a finish: the server went away mid-answer
            raise self._lost(path, EOFError("the stream ended before the answer did"))
        prompt_tokens, cached, completion_tokens = _usage(usage)
        yield Delta("", finish, prompt_tokens=prompt_tokens, cached_prompt_tokens=cached,
                    completion_tokens=completion_tokens)  # fmt: skip

    def _events(self, path: str, body: dict[str, Any]) -> AsyncGenerator[str, None]:
        """The data of each server-sent event of a streamed request's response."""
        if self._streams is not None:
            return self._streams.events(path, json.dumps(body).encode())
        return self._httpx_events(path, body)

    async def _httpx_events(self, path: str, body: dict[str, Any]) -> AsyncGenerator[str, None]:
        async with self._http().stream("POST", self.base_url + path, json=body) as response:
            await self._raise_for_status(path, response)
            async for line in response.aiter_lines():  # read to the end: a connection left mid-body is not reused
                if line.startswith("data:"):
                    yield line.removeprefix("data:").strip()

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Vectors from the server's `/embeddings` for the configured `[inference.embeddings] model`."""
        answer = await self._post("/embeddings", {"model": self._embedding_model, "input": texts})
        rows = sorted(answer.get("data") or [], key=lambda row: int(row.get("index", 0)))
        if len(rows) != len(texts):
            raise RemoteError(f"{self.base_url}/embeddings returned {len(rows)} vectors for {len(texts)} texts")
        return [[float(v) for v in row["embedding"]] for row in rows]

    async def probe(self) -> None:
        """Whether the server answers at all (`GET /models`); a `RemoteError` says why not."""
        try:
            response = await self._http().get(self.base_url + "/models", timeout=min(self.settings.timeout, 5.0))
        except httpx2.TimeoutException as exc:
            raise self._timeout("/models") from exc
        except httpx2.TransportError as exc:
            raise self._lost("/models", exc) from exc
        await self._raise_for_status("/models", response)

    # -- what the server accepts (asked once each) -----------------------------------------------

    async def _json_schema_taken(self) -> bool:
        async with self._asking:
            if self.takes_json_schema is None:
                self.takes_json_schema = await self._ask_json_schema()
        return self.takes_json_schema

    async def _ask_json_schema(self) -> bool:
        mode = self.settings.structured_output
        if mode != "auto":
            return mode == "json_schema"
        model = next(iter(self.models.values()))
        params = SamplingParams(max_tokens=24, temperature=0.0)
        body = request_body(_PROBE_MESSAGES, params, model, stream=False, schema=_PROBE_SCHEMA)
        try:
            answer = await self._post("/chat/completions", body)
        except RemoteError as err:
            if err.backend_failed:
                raise
            log.warning("inference backend %s refuses response_format json_schema (%s): %s", self.name, err, _IN_PROMPT)
            return False
        text = _choice_text((answer.get("choices") or [{}])[0])
        held = RemoteForm(_PROBE_MESSAGES, _PROBE_SCHEMA)
        try:
            held.read(text)
        except ValueError:
            log.warning(
                "inference backend %s ignores response_format json_schema (it answered %r): %s",
                self.name,
                text,
                _IN_PROMPT,
            )
            return False
        log.info("inference backend %s holds answers to response_format json_schema", self.name)
        return True

    async def _priority_taken(self) -> bool:
        if not self.settings.forward_priority:
            return False
        async with self._asking:
            if self.takes_priority is None:
                model = next(iter(self.models.values()))
                hello = [{"role": "user", "content": "Hi"}]
                body = request_body(hello, SamplingParams(max_tokens=1), model, stream=False, priority=1)
                try:
                    await self._post("/chat/completions", body)
                    self.takes_priority = True
                except RemoteError as err:
                    if err.backend_failed:
                        raise
                    log.info("inference backend %s refuses a priority (%s): priorities are not sent", self.name, err)
                    self.takes_priority = False
        return self.takes_priority

    # -- HTTP ------------------------------------------------------------------------------------

    def _http(self) -> httpx2.AsyncClient:
        if self._client is None:
            raise RemoteError("the remote backend is not open; start the InferenceService first")
        return self._client

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._counts[path] += 1
        try:
            response = await self._http().post(self.base_url + path, json=body)
        except httpx2.TimeoutException as exc:
            raise self._timeout(path) from exc
        except httpx2.TransportError as exc:
            raise self._lost(path, exc) from exc
        await self._raise_for_status(path, response)
        try:
            answer: dict[str, Any] = response.json()
        except ValueError as exc:
            self._counts["errors"] += 1
            raise RemoteError(
                f"{self.base_url}{path} answered with something that is not JSON: {exc}", backend_failed=True
            ) from exc
        return answer

    async def _raise_for_status(self, path: str, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            body = (await response.aread()).decode(errors="replace")
            raise self._status_error(path, response.status_code, response.reason_phrase, body)

    def _status_error(self, path: str, status: int, reason: str, body: str) -> RemoteError:
        self._counts["errors"] += 1
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:500] or reason
        return RemoteError(
            f"the remote inference server {self.base_url}{path} answered HTTP {status}: {message}",
            status,
            backend_failed=status >= 500 or status in (408, 429),
        )

    def _broke(self, path: str, error: Any) -> RemoteError:
        self._counts["errors"] += 1
        message = error.get("message") if isinstance(error, dict) else error
        return RemoteError(
            f"the remote inference server {self.base_url}{path} failed mid-answer: {message}", backend_failed=True
        )

    def _timeout(self, path: str) -> RemoteError:
        self._counts["errors"] += 1
        return RemoteError(
            f"the remote inference server {self.base_url}{path} did not answer within {self.settings.timeout:g} s; "
            f"check that it is up and not overloaded, or raise {self.config_key} timeout",
            backend_failed=True,
        )

    def _lost(self, path: str, exc: Exception) -> RemoteError:
        self._counts["errors"] += 1
        return RemoteError(
            f"could not talk to the remote inference server {self.base_url}{path}: {exc!r}; "
            f"check {self.config_key} base_url and that the server is running",
            backend_failed=True,
        )


def _path(prompt: Prompt) -> str:
    return "/completions" if isinstance(prompt, str) else "/chat/completions"
