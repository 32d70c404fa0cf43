"""Model definitions run by the engine: our own forward, weights from transformers.

Every model the loader returns satisfies :class:`CausalLM`: the engine's model runner calls it under
``torch.inference_mode()`` with one ragged :class:`~mcpmux.inference.models.forward_batch.ForwardBatch` and
one ``(k_cache, v_cache)`` pair per layer, each ``[num_blocks, block_size, num_kv_heads, head_dim]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # this package's own import stays torch-free, so `builtin` is too
    import torch
    from torch import Tensor

    from mcpmux.inference.models.forward_batch import ForwardBatch


class CausalLM(Protocol):
    """What the engine needs from a model."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position: int

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def __call__(self, batch: ForwardBatch, kv_caches: list[tuple[Tensor, Tensor]]) -> Tensor:
        """float32 logits [len(batch.logits_indices), vocab] for the rows ``batch.logits_indices``."""
        ...
