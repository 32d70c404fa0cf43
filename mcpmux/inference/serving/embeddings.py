"""Sentence embeddings served through the batching layer.

`Embedder` puts every text its callers submit into one `DynamicBatcher` and hands each flushed batch
to the encoder (`encoder.EmbeddingModel`), which pads each length bucket only to its own longest
text. Padding waste (pad tokens / all tokens fed to the model) is in `stats()`. The encoder, and
with it torch, is imported when the model first loads, not with this module.

A small batch (a search query, a few short texts: up to `SMALL_BATCH_CHARS`) runs on the embedder's
own thread, whose torch ops use one intra-op thread: splitting a product of a dozen rows over
several threads costs more than it saves, and on a busy host each forward then waits for a
preempted partner thread (a query took 227 ms on torch's two threads against 26 ms on one,
measured on 2 loaded cores). Larger batches run on a worker thread with torch's own thread count,
which the serving engine shares; the one-thread setting stays on the embedder's thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from mcpmux.batching import BatchPolicy, DynamicBatcher
from mcpmux.inference.serving.settings import EmbeddingSettings

if TYPE_CHECKING:
    from mcpmux.inference.serving.encoder import EmbeddingModel

log = logging.getLogger(__name__)

SMALL_BATCH_CHARS = 512
"""Batches of up to this many characters (about 130 tokens) run on one intra-op thread; larger ones
keep torch's thread count, so that a host with idle cores shares their products among them."""


class Embedder:
    """Embeddings for many concurrent callers, batched by a `DynamicBatcher`; the model loads on first use.

    Enter it with `async with` (it owns the batcher's task group) and leave it from the same task.
    """

    def __init__(
        self, settings: EmbeddingSettings, *, device: str = "auto", model: EmbeddingModel | None = None
    ) -> None:
        """`model`: an already loaded model to serve (else `settings.model` loads on first use)."""
        self.settings = settings
        self._device = device
        policy = BatchPolicy(max_batch_size=settings.max_batch_size, max_delay=settings.max_delay, mode=settings.mode)
        self._batcher: DynamicBatcher[str, list[float]] = DynamicBatcher(self._run_batch, policy, name="embeddings")
        self._model = model
        self._load_lock = anyio.Lock()
        self._own_thread = ThreadPoolExecutor(1, thread_name_prefix="mcpmux-embeddings", initializer=_one_thread)

    async def __aenter__(self) -> Embedder:
        await self._batcher.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self._batcher.__aexit__(exc_type, exc, tb)
        finally:
            self._own_thread.shutdown(wait=False)

    async def model(self) -> EmbeddingModel:
        """The loaded model, loading it (off the event loop) the first time."""
        async with self._load_lock:
            if self._model is None:
                log.info("loading embedding model %s", self.settings.model)
                self._model = await anyio.to_thread.run_sync(_load_model, self.settings.model, self._device)
            return self._model

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order; each text joins whatever batch is forming.

        A long list goes in one batch's worth at a time: it never fills the batcher's bounded queue
        (a 2,000-tool index once did), and other callers' texts (a search query) join between its
        batches instead of waiting behind all of it."""
        window = self.settings.max_batch_size
        results: list[list[float]] = []
        for start in range(0, len(texts), window):
            results += await self._embed_together(texts[start : start + window])
        return results

    async def _embed_together(self, texts: list[str]) -> list[list[float]]:
        results: list[list[float]] = [[] for _ in texts]
        errors: list[Exception] = []

        async def one(i: int, text: str) -> None:
            try:
                results[i] = await self._batcher.submit(text)
            except Exception as exc:  # re-raised below as itself, not inside an ExceptionGroup
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for i, text in enumerate(texts):
                tg.start_soon(one, i, text)
        if errors:
            raise errors[0]
        return results

    async def _run_batch(self, texts: list[str]) -> list[list[float]]:
        model = await self.model()
        bucketing = self.settings.bucketing

        def run() -> list[list[float]]:
            return model.embed(texts, bucketing=bucketing)

        if sum(len(text) for text in texts) <= SMALL_BATCH_CHARS:
            return await _on(self._own_thread, run)
        return await anyio.to_thread.run_sync(run)

    def stats(self) -> dict[str, Any]:
        """Batcher counters plus tokens fed, padding waste and forward passes."""
        batcher = self._batcher.stats()
        model = self._model
        return {
            "model": self.settings.model,
            "loaded": model is not None,
            "bucketing": self.settings.bucketing,
            "forward_passes": model.forward_passes if model is not None else 0,
            "real_tokens": model.padding.real_tokens if model is not None else 0,
            "pad_tokens": model.padding.pad_tokens if model is not None else 0,
            "padding_waste": model.padding.waste if model is not None else 0.0,
            "mean_batch_size": batcher.mean_batch_size,
            "batcher": asdict(batcher),
        }


def _load_model(name: str, device: str) -> EmbeddingModel:
    """The model, torch imported with it on first use: in a worker thread, as it takes seconds."""
    from mcpmux.inference.models.heap import freeze_after_first_load
    from mcpmux.inference.serving.encoder import EmbeddingModel

    model = EmbeddingModel(name, device)
    model.warm_up()
    freeze_after_first_load()  # torch's imports out of full collections (`heap`)
    return model


def _one_thread() -> None:
    from mcpmux.inference.serving.encoder import use_one_intraop_thread

    use_one_intraop_thread()


async def _on(executor: ThreadPoolExecutor, fn: Callable[[], list[list[float]]]) -> list[list[float]]:
    """`fn()` on `executor`'s thread; like `anyio.to_thread.run_sync`, a cancelled caller waits for it.
    The thread hands the result to the event loop without waiting for the loop to take it (asyncio's
    `wrap_future`), as anyio's own worker threads do."""
    future = executor.submit(fn)
    with anyio.CancelScope(shield=True):
        await asyncio.wait([asyncio.wrap_future(future)])
    return future.result()
