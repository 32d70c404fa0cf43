"""The remote backend: completions and embeddings from any OpenAI-compatible server (vLLM, SGLang, TGI).

`[inference] backend = "openai"` routes the service's `stream`, `complete` and `embed` here. Every
failure becomes a `RemoteError` that names the URL and says what happened: the timeout and its
value, the connection error, or the HTTP status with the server's own message.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import Any

import httpx2

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.engine.outputs import Completion
from mcpmux.inference.errors import EngineError
from mcpmux.inference.serving.delta import Delta
from mcpmux.inference.serving.settings import EmbeddingSettings, RemoteSettings

log = logging.getLogger(__name__)

Prompt = str | list[dict[str, str]]


class RemoteError(EngineError):
    """The remote server failed a request; `status` is its HTTP status (None: no answer at all)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def request_body(prompt: Prompt, params: SamplingParams, model: str, *, stream: bool) -> dict[str, Any]:
    """The OpenAI request body for a prompt (`/completions`) or chat messages (`/chat/completions`)."""
    if params.grammar is not None:  # refused rather than dropped: the answer would not be held to it
        raise EngineError("a grammar (constrained decoding) is served by the local engine only, not the remote backend")
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
    """An HTTP client for one OpenAI-compatible server; enter with `async with`."""

    def __init__(self, settings: RemoteSettings, embeddings: EmbeddingSettings) -> None:
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self._embedding_model = embeddings.model
        self._client: httpx2.AsyncClient | None = None
        self._counts: Counter[str] = Counter()

    async def __aenter__(self) -> RemoteBackend:
        headers = {}
        if self.settings.api_key_env:
            key = os.environ.get(self.settings.api_key_env)
            if not key:
                raise RemoteError(
                    f"[inference.remote] api_key_env names {self.settings.api_key_env!r}, but that environment "
                    f"variable is not set; export it with the API key for {self.base_url}"
                )
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx2.AsyncClient(headers=headers, timeout=self.settings.timeout)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._client is not None:
            await self._client.aclose()

    def stats(self) -> dict[str, Any]:
        """Requests sent and failed, by endpoint, and the server they went to."""
        return {"base_url": self.base_url, "model": self.settings.model, **dict(self._counts)}

    async def stream(self, prompt: Prompt, params: SamplingParams, model: str) -> AsyncGenerator[Delta, None]:
        """Stream a completion over SSE; the last delta carries the finish reason and the usage."""
        path = "/completions" if isinstance(prompt, str) else "/chat/completions"
        finish: str | None = None
        usage: dict[str, Any] | None = None
        body = request_body(prompt, params, model, stream=True)
        self._counts[path] += 1
        try:
            async with self._http().stream("POST", self.base_url + path, json=body) as response:
                await self._raise_for_status(path, response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line.removeprefix("data:").strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        finish = choice.get("finish_reason") or finish
                        text = _choice_text(choice)
                        if text:
                            yield Delta(text)
        except httpx2.TimeoutException as exc:
            raise self._timeout(path) from exc
        except httpx2.TransportError as exc:
            raise self._lost(path, exc) from exc
        prompt_tokens, cached, completion_tokens = _usage(usage)
        yield Delta("", finish or "stop", prompt_tokens=prompt_tokens, cached_prompt_tokens=cached,
                    completion_tokens=completion_tokens)  # fmt: skip

    async def complete(self, prompt: Prompt, params: SamplingParams, model: str) -> Completion:
        """One non-streamed completion."""
        path = "/completions" if isinstance(prompt, str) else "/chat/completions"
        answer = await self._post(path, request_body(prompt, params, model, stream=False))
        choice = (answer.get("choices") or [{}])[0]
        prompt_tokens, cached, completion_tokens = _usage(answer.get("usage"))
        return Completion(
            str(answer.get("id", "")),
            _choice_text(choice),
            [],
            str(choice.get("finish_reason") or "stop"),
            prompt_tokens,
            cached,
            completion_tokens,
        )

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Vectors from the server's `/embeddings` for the configured `[inference.embeddings] model`."""
        answer = await self._post("/embeddings", {"model": self._embedding_model, "input": texts})
        rows = sorted(answer.get("data") or [], key=lambda row: int(row.get("index", 0)))
        if len(rows) != len(texts):
            raise RemoteError(f"{self.base_url}/embeddings returned {len(rows)} vectors for {len(texts)} texts")
        return [[float(v) for v in row["embedding"]] for row in rows]

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
            raise RemoteError(f"{self.base_url}{path} answered with something that is not JSON: {exc}") from exc
        return answer

    async def _raise_for_status(self, path: str, response: httpx2.Response) -> None:
        if response.status_code < 400:
            return
        self._counts["errors"] += 1
        body = (await response.aread()).decode(errors="replace")
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:500] or response.reason_phrase
        raise RemoteError(
            f"the remote inference server {self.base_url}{path} answered HTTP {response.status_code}: {message}",
            response.status_code,
        )

    def _timeout(self, path: str) -> RemoteError:
        self._counts["errors"] += 1
        return RemoteError(
            f"the remote inference server {self.base_url}{path} did not answer within {self.settings.timeout:g} s; "
            "check that it is up and not overloaded, or raise [inference.remote] timeout"
        )

    def _lost(self, path: str, exc: Exception) -> RemoteError:
        self._counts["errors"] += 1
        return RemoteError(
            f"could not talk to the remote inference server {self.base_url}{path}: {exc!r}; "
            "check [inference.remote] base_url and that the server is running"
        )
