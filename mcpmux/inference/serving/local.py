"""The local backend: the in-process continuous-batching engines, one per configured model.

Each model loads on the first request for it (a builtin model is converted first if it is not cached
yet), off the event loop, with torch imported only then. A `Generation` with tools gets them written
into its system message and a grammar that holds the output to a call (`serving.tool_calls`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from mcpmux.inference.engine.config import EngineConfig
from mcpmux.inference.engine.stats import EngineStats
from mcpmux.inference.errors import EngineError
from mcpmux.inference.serving.delta import Delta
from mcpmux.inference.serving.generation import Generation
from mcpmux.inference.serving.settings import BackendSettings, ModelSettings

if TYPE_CHECKING:
    from mcpmux.inference.engine.async_engine import Engine

log = logging.getLogger(__name__)


class LocalBackend:
    """The engines of the `[inference.models.*]` tables, started on first use; they stop with `stack`."""

    def __init__(self, settings: BackendSettings, tables: dict[str, ModelSettings], stack: AsyncExitStack) -> None:
        self.settings = settings
        self.name = settings.label
        self.tables = tables
        self.models = settings.model_names() or {name: name for name in tables}
        self._stack = stack
        self._engines: dict[str, Engine] = {}  # by table name, the ones loaded so far
        self._loading = {name: anyio.Lock() for name in tables}
        self._closed = False

    async def stream(self, generation: Generation) -> AsyncGenerator[Delta, None]:
        """The engine's deltas; errors (queue full, request too large) are raised on the first iteration."""
        prompt, params = generation.prompt, generation.params
        tools = generation.tools
        if tools is not None and tools.may_call:
            if isinstance(prompt, str):
                raise EngineError("tools need chat messages, not a plain prompt")
            prompt, params = tools.with_tools(prompt), dataclasses.replace(params, grammar=tools.grammar)
        engine = await self.engine(self.models[generation.model])
        async for out in engine.generate(prompt, params, generation.priority):
            yield Delta(
                out.text,
                out.finish_reason,
                out.token_ids,
                out.logprobs,
                out.prompt_tokens,
                out.cached_prompt_tokens,
                out.completion_tokens,
            )

    async def probe(self) -> None:
        """The engine is in this process: it is up while the process is."""

    async def engine(self, table: str) -> Engine:
        """The engine of local model `table`, started by the first request that needs it."""
        engine = self._engines.get(table)
        if engine is not None:
            return engine
        async with self._loading[table]:  # concurrent first requests wait for one load
            engine = self._engines.get(table)
            if engine is not None:
                return engine
            model = self.tables[table]
            log.info("loading model %s (%s)", table, model.model)
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
            self._engines[table] = engine
            log.info("model %s loaded", table)
            return engine

    def close(self) -> None:
        """Refuse engines that finish loading from now on (the stack stops the loaded ones)."""
        self._closed = True

    def token_text(self, model: str, token_id: int) -> str:
        """The text of one token of a loaded model (for logprobs); "" while it is not loaded."""
        engine = self._engines.get(self.models.get(model, ""))
        return "" if engine is None else str(engine.core.loaded.tokenizer.decode([token_id]))

    def model_stats(self) -> dict[str, dict[str, Any]]:
        """Each table's engine stats (zeros and `loaded: false` until its first request)."""
        return {name: self._model_stats(name) for name in self.tables}

    def _model_stats(self, name: str) -> dict[str, Any]:
        engine = self._engines.get(name)
        return asdict(engine.stats() if engine is not None else EngineStats()) | {"loaded": engine is not None}


def _engine_class() -> type[Engine]:
    from mcpmux.inference.engine.async_engine import Engine

    return Engine
