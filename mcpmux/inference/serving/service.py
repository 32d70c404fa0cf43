"""`InferenceService`: every model the `[inference]` table configures, behind one object.

The sampling bridge, the local tools and the OpenAI-compatible API all call this, never an engine
directly, so switching `backend` between "local" (in-process `Engine`s) and "openai" (a remote
OpenAI-compatible server) changes nothing for them.

    async with await InferenceService.start(settings) as svc:
        text = (await svc.complete("Hello", SamplingParams(max_tokens=16))).text

Starting it costs nothing: no model loads and torch is not imported. Each local model loads on the
first request for it (a builtin model is converted first if it is not cached yet), the embedding
model on the first embedding request. Start and shut it down from the same task (its embedding
batcher runs in a task group).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.outputs import Completion
from mcpmux.inference.engine.stats import EngineStats
from mcpmux.inference.errors import EngineError, ModelLoadError
from mcpmux.inference.models import builtin
from mcpmux.inference.serving.delta import Delta
from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.remote import RemoteBackend
from mcpmux.inference.serving.settings import InferenceSettings, ModelSettings

if TYPE_CHECKING:
    from mcpmux.inference.engine.async_engine import Engine

log = logging.getLogger(__name__)

Prompt = str | list[dict[str, str]]

# Used when backend = "local" and no [inference.models.NAME] table is given.
DEFAULT_MODELS = {"smollm2": ModelSettings(model="builtin:smollm2-135m", intelligence=0.2, speed=0.9, cost=0.9)}


class UnknownModelError(EngineError, ValueError):
    """A request named a model that is not configured; the message lists the configured ones."""


class InferenceOffError(EngineError):
    """Inference (or just embeddings) is switched off in the configuration."""


class InferenceService:
    """Local engines or a remote client, plus the embedder, chosen by `InferenceSettings`."""

    def __init__(self, settings: InferenceSettings) -> None:
        self.settings = settings
        self._stack = AsyncExitStack()
        self._engines: dict[str, Engine] = {}  # the local models loaded so far
        self._loading: dict[str, anyio.Lock] = {}
        self._models: dict[str, ModelSettings] = {}
        self._remote: RemoteBackend | None = None
        self._embedder: Embedder | None = None
        self._closed = False
        self.description: list[str] = []  # what serves and from where, one line each (logged at start)

    @classmethod
    async def start(cls, settings: InferenceSettings) -> InferenceService:
        """Open the remote client (openai) or check the local models' sources (local); nothing loads yet."""
        if settings.backend == "off":
            raise InferenceOffError('[inference] backend is "off"; set it to "local" or "openai" to serve models')
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
        if settings.backend == "openai":
            if settings.remote is None:
                raise InferenceOffError(
                    '[inference] backend = "openai" needs an [inference.remote] table with base_url and model'
                )
            self._remote = await self._stack.enter_async_context(RemoteBackend(settings.remote, settings.embeddings))
            self._models = {settings.remote.model: ModelSettings(model=settings.remote.model)}
            remote = settings.remote
            self._describe(f"model {remote.model} served by the OpenAI-compatible server at {remote.base_url}")
            return
        self._models = dict(settings.models) or dict(DEFAULT_MODELS)
        for name, model in self._models.items():
            self._loading[name] = anyio.Lock()
            try:
                where = source_of(model.model)
            except ModelLoadError as err:  # served as an error to each request until it is fixed
                self._describe(f"model {name} cannot load: {err}", logging.WARNING)
            else:
                self._describe(f"model {name} serves {where}; loads on first use")
        if settings.embeddings.model:
            self._describe(f"embeddings from {settings.embeddings.model}; loads on first use")
            self._embedder = await self._stack.enter_async_context(Embedder(settings.embeddings))

    def _describe(self, line: str, level: int = logging.INFO) -> None:
        self.description.append(line)
        log.log(level, "inference: %s", line)

    async def _engine(self, name: str) -> Engine:
        """The engine of local model `name`, started by the first request that needs it."""
        engine = self._engines.get(name)
        if engine is not None:
            return engine
        async with self._loading[name]:  # concurrent first requests wait for one load
            engine = self._engines.get(name)
            if engine is not None:
                return engine
            model = self._models[name]
            log.info("loading model %s (%s)", name, model.model)
            # Torch and transformers come in with the first model, not with the service, and off the
            # event loop: importing them takes seconds, and every other call would wait that long.
            engine_class = await anyio.to_thread.run_sync(_engine_class)
            engine = await engine_class.start(
                EngineConfig(
                    model=model.model,
                    dtype=model.dtype,
                    device=model.device,
                    max_num_seqs=model.max_num_seqs,
                    max_num_batched_tokens=model.max_num_batched_tokens,
                    kv_cache_memory_mb=model.kv_cache_memory_mb,
                    max_waiting=model.max_waiting,
                    cuda_graphs=model.cuda_graphs,
                )
            )
            if self._closed:  # shut down while the model loaded
                await engine.shutdown()
                raise EngineError("the inference service is shut down; start a new one with InferenceService.start()")
            self._stack.push_async_callback(engine.shutdown)
            self._engines[name] = engine
            log.info("model %s loaded", name)
            return engine

    async def shutdown(self) -> None:
        """Abort what is in flight, stop the engines, the embedder and the remote client."""
        self._closed = True
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
        self, prompt: Prompt, params: SamplingParams, *, model: str | None = None, priority: int = 0
    ) -> AsyncGenerator[Delta, None]:
        """Stream a completion of a prompt or chat messages; larger `priority` runs first (local only).

        Errors (unknown model, queue full, request too large, remote failures) are `EngineError`s
        raised on the first iteration. Leaving the loop early aborts the request.
        """
        name = self.resolve_model(model)
        if self._remote is not None:
            async for delta in self._remote.stream(prompt, params, name):
                yield delta
            return
        engine = await self._engine(name)
        async for out in engine.generate(prompt, params, priority):
            yield Delta(
                out.text,
                out.finish_reason,
                out.token_ids,
                out.logprobs,
                out.prompt_tokens,
                out.cached_prompt_tokens,
                out.completion_tokens,
            )

    async def complete(
        self, prompt: Prompt, params: SamplingParams, *, model: str | None = None, priority: int = 0
    ) -> Completion:
        """Run a completion to the end; the same errors as `stream`."""
        name = self.resolve_model(model)
        if self._remote is not None:
            return await self._remote.complete(prompt, params, name)
        engine = await self._engine(name)
        return await engine.complete(prompt, params, priority)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One L2-normalized vector per text (batched with other callers' texts)."""
        if self._closed:
            raise EngineError("the inference service is shut down; start a new one with InferenceService.start()")
        if not self.settings.embeddings.model:
            raise InferenceOffError(
                'embeddings are off ([inference.embeddings] model = ""); set it to "builtin:all-minilm-l6-v2" '
                "or a sentence-transformers folder"
            )
        if self._remote is not None:
            return await self._remote.embed(texts)
        assert self._embedder is not None, "the service was not started"
        return await self._embedder.embed(texts)

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
        engine = self._engines.get(self.resolve_model(model))
        if engine is None:
            return ""
        return str(engine.core.loaded.tokenizer.decode([token_id]))

    @property
    def embedding_model(self) -> str:
        """The configured embedding model spec ("" when embeddings are off)."""
        return self.settings.embeddings.model

    def stats(self) -> dict[str, Any]:
        """Per-model engine stats (local; zeros and `loaded: false` until a model's first request) or
        remote counters, plus the embedder's (padding waste)."""
        result: dict[str, Any] = {"backend": self.settings.backend}
        if self._remote is not None:
            result["remote"] = self._remote.stats()
        else:
            result["models"] = {name: self._model_stats(name) for name in self._models}
        if self._embedder is not None:
            result["embeddings"] = self._embedder.stats()
        return result

    def _model_stats(self, name: str) -> dict[str, Any]:
        engine = self._engines.get(name)
        return asdict(engine.stats() if engine is not None else EngineStats()) | {"loaded": engine is not None}


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


def _engine_class() -> type[Engine]:
    from mcpmux.inference.engine.async_engine import Engine

    return Engine
