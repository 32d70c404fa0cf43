"""`InferenceService`: every model the `[inference]` table configures, behind one object.

The sampling bridge, the local tools and the OpenAI-compatible API all call this, never an engine
or a server directly, so what serves (the in-process engine, a remote OpenAI-compatible server, or a
fleet of both: `[[inference.backends]]`) changes nothing for them. Each request is one `Generation`,
routed by the `Fleet`.

    async with await InferenceService.start(settings) as svc:
        text = (await svc.complete("Hello", SamplingParams(max_tokens=16))).text

Starting it costs nothing: no model loads, torch is not imported and no server is asked anything.
Each local model loads on the first request for it (a builtin model is converted first if it is not
cached yet), the embedding model on the first embedding request. Start and shut it down from the
same task (its embedding batcher and the fleet's probes run in task groups).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, cast

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.engine.outputs import Completion, TokenLogprob
from mcpmux.inference.errors import EngineError, ModelLoadError
from mcpmux.inference.models import builtin
from mcpmux.inference.serving.delta import Delta
from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.fleet import Fleet, Member
from mcpmux.inference.serving.generation import Generation, Prompt
from mcpmux.inference.serving.local import LocalBackend
from mcpmux.inference.serving.remote import RemoteBackend
from mcpmux.inference.serving.settings import BackendSettings, InferenceSettings, ModelSettings
from mcpmux.inference.serving.tool_calls import ToolUse

log = logging.getLogger(__name__)

# Used when no [inference.models.NAME] table is given.
DEFAULT_MODELS = {"smollm2": ModelSettings(model="builtin:smollm2-135m", intelligence=0.2, speed=0.9, cost=0.9)}


class UnknownModelError(EngineError, ValueError):
    """A request named a model that is not configured; the message lists the configured ones."""


class InferenceOffError(EngineError):
    """Inference (or just embeddings) is switched off in the configuration."""


class InferenceService:
    """The fleet of backends (the local engines, remote servers) plus the embedder, chosen by `InferenceSettings`."""

    def __init__(self, settings: InferenceSettings) -> None:
        self.settings = settings
        self._stack = AsyncExitStack()
        self._models: dict[str, ModelSettings] = {}
        self._local: LocalBackend | None = None
        self._fleet: Fleet | None = None
        self._task_group: TaskGroup | None = None
        self._embedder: Embedder | None = None
        self._closed = False
        self.description: list[str] = []  # what serves and from where, one line each (logged at start)

    @classmethod
    async def start(cls, settings: InferenceSettings) -> InferenceService:
        """Open the remote clients and check the local models' sources; nothing loads yet."""
        if settings.backend == "off":
            raise InferenceOffError(
                '[inference] backend is "off"; set it to "local", "openai" or "fleet" to serve models'
            )
        if settings.backend == "openai" and settings.remote is None:
            raise InferenceOffError(
                '[inference] backend = "openai" needs an [inference.remote] table with base_url and model'
            )
        service = cls(settings)
        await service._stack.__aenter__()
        try:
            await service._open()
        except BaseException:
            await service._stack.aclose()
            raise
        return service

    async def _open(self) -> None:
        settings = self.settings
        self._task_group = await self._stack.enter_async_context(anyio.create_task_group())
        members = [Member(await self._backend(backend), backend) for backend in settings.fleet()]
        self._fleet = Fleet(members, self._task_group, share_identical=settings.share_identical)
        for member in members:
            for name in member.backend.models:
                self._models.setdefault(name, self._model_settings(name))
        remote_embeddings = [m.backend.name for m in members if m.settings.embeddings]
        if settings.embeddings.model and remote_embeddings:
            self._describe(f"embeddings from {settings.embeddings.model} on {', '.join(remote_embeddings)}")
        elif settings.embeddings.model:
            self._describe(f"embeddings from {settings.embeddings.model}; loads on first use")
            self._embedder = await self._stack.enter_async_context(Embedder(settings.embeddings))

    async def _backend(self, backend: BackendSettings) -> LocalBackend | RemoteBackend:
        if backend.kind == "local":
            self._local = LocalBackend(backend, dict(self.settings.models) or dict(DEFAULT_MODELS), self._stack)
            for name, table in self._local.models.items():
                self._describe_local(name, self._local.tables[table])
            return self._local
        in_fleet = bool(self.settings.backends)
        key = f"[[inference.backends]] {backend.label!r}" if in_fleet else "[inference.remote]"
        remote = await self._stack.enter_async_context(RemoteBackend(backend, self.settings.embeddings.model, key))
        named = f" (backend {remote.name})" if in_fleet else ""
        role = ", the fallback" if backend.fallback else ""
        for name in remote.models:
            self._describe(f"model {name} served by the OpenAI-compatible server at {remote.base_url}{named}{role}")
        return remote

    def _describe_local(self, name: str, table: ModelSettings) -> None:
        try:
            where = source_of(table.model)
        except ModelLoadError as err:  # served as an error to each request until it is fixed
            self._describe(f"model {name} cannot load: {err}", logging.WARNING)
        else:
            role = " (the fallback)" if self._local is not None and self._local.settings.fallback else ""
            self._describe(f"model {name} serves {where}; loads on first use{role}")

    def _model_settings(self, name: str) -> ModelSettings:
        """The settings `choose_model` scores a model by: its local table where the local engine serves it."""
        if self._local is not None and name in self._local.models:
            return self._local.tables[self._local.models[name]]
        return ModelSettings(model=name)

    def _describe(self, line: str, level: int = logging.INFO) -> None:
        self.description.append(line)
        log.log(level, "inference: %s", line)

    async def shutdown(self) -> None:
        """Abort what is in flight, stop the engines, the embedder and the remote clients."""
        self._closed = True
        if self._local is not None:
            self._local.close()
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()  # shared generations and probes end first
        await self._stack.aclose()

    async def __aenter__(self) -> InferenceService:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    # -- models ----------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        """Configured model names, the default first."""
        return list(self._models)

    def choose_model(
        self,
        hints: Sequence[str] = (),
        *,
        cost: float | None = None,
        speed: float | None = None,
        intelligence: float | None = None,
    ) -> str:
        """Pick a model the way MCP `modelPreferences` asks.

        Hints are tried in order; the first that is a (case-insensitive) substring of a configured
        model's name or spec picks it. If none matches, the priorities (0..1 each) score every model
        as `cost*model.cost + speed*model.speed + intelligence*model.intelligence` and the best wins
        (ties: the earlier one). With no hint match and no priority, the default model.
        """
        for hint in hints:
            needle = hint.lower()
            for name, model in self._models.items():
                if needle and (needle in name.lower() or needle in model.model.lower()):
                    return name
        weights = (cost or 0.0, speed or 0.0, intelligence or 0.0)
        names = self.model_names()
        if not any(weights):
            return names[0]

        def score(name: str) -> float:
            m = self._models[name]
            return weights[0] * m.cost + weights[1] * m.speed + weights[2] * m.intelligence

        return max(names, key=score)  # max keeps the first of equal scores

    def resolve_model(self, model: str | None) -> str:
        """The configured name for `model` (a name or a model spec); None means the default."""
        if self._closed:
            raise EngineError("the inference service is shut down; start a new one with InferenceService.start()")
        if model is None:
            return self.model_names()[0]
        if model in self._models:
            return model
        for name, settings in self._models.items():
            if settings.model == model:
                return name
        raise UnknownModelError(
            f"unknown model {model!r}; configured models: {', '.join(self.model_names())} "
            "(add an [inference.models.NAME] table to serve another)"
        )

    # -- generation ------------------------------------------------------------------------------

    async def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        *,
        model: str | None = None,
        priority: int = 0,
        tools: ToolUse | None = None,
    ) -> AsyncGenerator[Delta, None]:
        """Stream a completion of a prompt or chat messages; larger `priority` runs first; `tools`: the
        tools the model may call (the answer is a call in `serving.tool_calls`' text form, or text).

        Errors (unknown model, queue full, request too large, remote failures) are `EngineError`s
        raised on the first iteration. Leaving the loop early aborts the request.
        """
        generation = Generation(prompt, params, self.resolve_model(model), priority, tools)
        async for delta in self._routed().stream(generation):
            yield delta

    async def complete(
        self,
        prompt: Prompt,
        params: SamplingParams,
        *,
        model: str | None = None,
        priority: int = 0,
        tools: ToolUse | None = None,
    ) -> Completion:
        """Run a completion to the end; the same errors as `stream`."""
        generation = Generation(prompt, params, self.resolve_model(model), priority, tools, incremental=False)
        text: list[str] = []
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        last = Delta("", "abort")
        async for delta in self._routed().stream(generation):
            text.append(delta.text)
            tokens += delta.token_ids
            logprobs += delta.logprobs
            last = delta
        return Completion(
            uuid.uuid4().hex,
            "".join(text),
            tokens,
            last.finish_reason or "abort",
            last.prompt_tokens,
            last.cached_prompt_tokens,
            last.completion_tokens,
            logprobs if params.logprobs is not None else None,
        )

    def _routed(self) -> Fleet:
        if self._fleet is None:
            raise EngineError("the inference service is not started; use InferenceService.start()")
        return self._fleet

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One L2-normalized vector per text (batched with other callers' texts)."""
        if self._closed:
            raise EngineError("the inference service is shut down; start a new one with InferenceService.start()")
        if not self.settings.embeddings.model:
            raise InferenceOffError(
                'embeddings are off ([inference.embeddings] model = ""); set it to "builtin:all-minilm-l6-v2" '
                "or a sentence-transformers folder"
            )
        if self._embedder is not None:
            return await self._embedder.embed(texts)
        return await self._routed().call(
            lambda m: m.settings.embeddings,  # kind openai only (BackendSettings checks)
            f"embeddings ({self.settings.embeddings.model})",
            lambda m: cast(RemoteBackend, m.backend).embed(texts),
        )

    async def embedding_token_count(self, texts: list[str]) -> int:
        """Tokens the embedding model reads for `texts` (for `usage`); 0 where the remote server counts."""
        if self._embedder is None:
            return 0
        model = await self._embedder.model()
        return sum(len(ids) for ids in await anyio.to_thread.run_sync(model.tokenize, texts))

    async def embedding_precision(self) -> str:
        """What this service's vectors are computed in, loading the local model (off the event loop) the
        first time: "float32" or "bfloat16" locally, "" where a remote server embeds."""
        if self._embedder is None:
            return ""
        return (await self._embedder.model()).precision

    def token_text(self, model: str | None, token_id: int) -> str:
        """The text of one token of a local model (for logprobs); empty for remote or not yet loaded models."""
        return "" if self._local is None else self._local.token_text(self.resolve_model(model), token_id)

    @property
    def embedding_model(self) -> str:
        """The configured embedding model spec ("" when embeddings are off)."""
        return self.settings.embeddings.model

    def stats(self) -> dict[str, Any]:
        """Each backend's state (`backends`), the local engines' stats per model (`models`: zeros and
        `loaded: false` until a model's first request), requests that shared another's generation or
        moved to another backend, and the embedder's figures (padding waste)."""
        fleet = self._routed()
        result: dict[str, Any] = {
            "backend": self.settings.backend,
            "backends": fleet.stats(),
            "shared": fleet.shared,
            "moved": fleet.moved,
            "resumed": fleet.resumed,
        }
        if self._local is not None:
            result["models"] = self._local.model_stats()
        if self._embedder is not None:
            result["embeddings"] = self._embedder.stats()
        return result


def source_of(spec: str) -> str:
    """Where a model spec's weights come from, for the start-up log; `ModelLoadError` for an unknown
    builtin model or a missing package, so a broken install shows at start, not only at first use."""
    if not spec.startswith(builtin.PREFIX):
        return spec
    model = builtin.lookup(spec.removeprefix(builtin.PREFIX))
    folder = builtin.converted_folder(model)
    converted = "converted" if (folder / "config.json").is_file() else "to be converted on first use (~20 s)"
    return (
        f"{spec} ({model.description}) from the {model.distribution} package ({builtin.gguf_path(model)}), "
        f"{converted} to {folder}"
    )
