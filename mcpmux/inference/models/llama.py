"""Our forward for the Llama family (Llama / SmolLM2, Qwen2, Mistral) over a ragged batch and a paged cache.

The three architectures share one block: pre-RMSNorm, rotary attention with grouped KV heads, a
SwiGLU MLP. They differ only in data: Qwen2 carries q/k/v biases, Mistral a sliding window, and any
of them may tie the output head to the embeddings. The weights are the checkpoint's own tensors,
taken from the transformers model that loaded them (see `registry.build_causal_lm`); q/k/v and
gate/up are concatenated so each layer runs two matmuls where HF runs five, and the originals are
released as each layer is built, so only one copy ever stays in memory.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers.activations import ACT2FN

from mcpmux.inference import kernels
from mcpmux.inference.models.forward_batch import ForwardBatch
from mcpmux.inference.models.linear import FUSED_ROWS, linear, prepare, vocab_logits
from mcpmux.inference.models.rope import build_cos_sin_cache, head_dim_of


def _frozen(tensor: Tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


def _optional(tensor: Tensor | None) -> nn.Parameter | None:
    return None if tensor is None else _frozen(tensor)


def _matmul(tensor: Tensor) -> nn.Parameter:
    """A weight only `linear` multiplies by, in the form it multiplies fastest (see `linear.prepare`)."""
    return _frozen(prepare(tensor))


class DecoderLayer(nn.Module):
    """One pre-norm transformer block reading and writing its slice of the paged KV cache."""

    def __init__(self, weights: dict[str, Tensor], prefix: str, config: Any) -> None:
        super().__init__()
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.head_dim = head_dim_of(config)
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        self.act = ACT2FN[config.hidden_act]
        self.silu = config.hidden_act == "silu"

        def take(name: str) -> Tensor | None:
            return weights.pop(prefix + name, None)

        attn = [take(f"self_attn.{p}_proj.weight") for p in "qkv"]
        attn_bias = [take(f"self_attn.{p}_proj.bias") for p in "qkv"]
        self.qkv_weight = _matmul(torch.cat([w for w in attn if w is not None]))
        biases = [b for b in attn_bias if b is not None]
        self.qkv_bias = _optional(torch.cat(biases) if biases else None)
        self.o_weight = _matmul(_required(take("self_attn.o_proj.weight"), prefix + "self_attn.o_proj"))
        self.o_bias = _optional(take("self_attn.o_proj.bias"))

        gate, up = take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")
        gate_b, up_b = take("mlp.gate_proj.bias"), take("mlp.up_proj.bias")
        gate = _required(gate, prefix + "mlp.gate_proj")
        self.gate_up_weight = _matmul(torch.cat([gate, _required(up, prefix + "mlp.up_proj")]))
        self.gate_up_bias = _optional(None if gate_b is None or up_b is None else torch.cat([gate_b, up_b]))
        self.down_weight = _matmul(_required(take("mlp.down_proj.weight"), prefix + "mlp.down_proj"))
        self.down_bias = _optional(take("mlp.down_proj.bias"))

        self.input_norm = _frozen(_required(take("input_layernorm.weight"), prefix + "input_layernorm"))
        self.post_norm = _frozen(
            _required(take("post_attention_layernorm.weight"), prefix + "post_attention_layernorm")
        )
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

    def forward(
        self,
        hidden: Tensor,
        residual: Tensor | None,
        batch: ForwardBatch,
        kv_cache: tuple[Tensor, Tensor],
        cos_sin_cache: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Return (block output, residual stream); their sum is the next layer's input."""
        if residual is None:
            residual = hidden
            normed = kernels.rms_norm(hidden, self.input_norm, self.eps)
        else:
            normed, residual = kernels.rms_norm(hidden, self.input_norm, self.eps, residual)
        assert isinstance(normed, Tensor)
        attn = self._attention(normed, batch, kv_cache, cos_sin_cache)
        normed, residual = kernels.rms_norm(attn, self.post_norm, self.eps, residual)
        gate_up = linear(normed, self.gate_up_weight, self.gate_up_bias)
        if self.silu:
            activated = kernels.silu_and_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            activated = self.act(gate) * up
        return linear(activated, self.down_weight, self.down_bias), residual

    def fused_weights(self) -> list[Tensor | None]:
        """This layer's weights in the order the fused kernels' `Decoder` takes them."""
        return [
            self.input_norm, self.qkv_weight, self.qkv_bias, self.o_weight, self.o_bias,
            self.post_norm, self.gate_up_weight, self.gate_up_bias, self.down_weight, self.down_bias,
        ]  # fmt: skip

    def _attention(
        self, x: Tensor, batch: ForwardBatch, kv_cache: tuple[Tensor, Tensor], cos_sin_cache: Tensor
    ) -> Tensor:
        tokens = x.shape[0]
        qkv = linear(x, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        q, k = kernels.rotary_embedding(batch.positions, q, k, cos_sin_cache)
        k_cache, v_cache = kv_cache
        kernels.write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        out = kernels.paged_attention(
            q,
            k_cache,
            v_cache,
            batch.block_tables,
            batch.seq_lens,
            batch.query_start_loc,
            self.scale,
            batch.max_query_len,
            batch.max_seq_len,
        )
        return linear(out.reshape(tokens, self.q_size), self.o_weight, self.o_bias)


def _required(tensor: Tensor | None, name: str) -> Tensor:
    if tensor is None:
        raise ValueError(f"checkpoint is missing weight {name!r}; is it a complete Llama-family model?")
    return tensor


class LlamaCausalLM(nn.Module):
    """A Llama-family decoder served from a paged KV cache; see :class:`mcpmux.inference.models.CausalLM`."""

    def __init__(self, config: Any, weights: dict[str, Tensor], max_position: int) -> None:
        """Build from HF-named ``weights`` (``model.layers.0.self_attn.q_proj.weight`` ...), consuming them."""
        super().__init__()
        self.num_layers = int(config.num_hidden_layers)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.head_dim = head_dim_of(config)
        self.vocab_size = int(config.vocab_size)
        self.max_position = max_position
        self.eps = float(config.rms_norm_eps)

        embed = _required(weights.pop("model.embed_tokens.weight", None), "model.embed_tokens")
        self.embed = _frozen(embed)
        self.layers = nn.ModuleList(DecoderLayer(weights, f"model.layers.{i}.", config) for i in range(self.num_layers))
        self.norm = _frozen(_required(weights.pop("model.norm.weight", None), "model.norm"))
        head = weights.pop("lm_head.weight", None)
        # A tied head is the embedding itself (HF may list it under both names): one parameter. The
        # embedding is read by rows, so where the head multiplies fastest as a oneDNN tensor
        # (`linear.prepare`), that tensor is a copy: the one weight mcpmux holds twice.
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = self.embed if tied else _matmul(_required(head, "lm_head"))
        self._head = prepare(self.lm_head.detach())
        self.register_buffer("cos_sin_cache", build_cos_sin_cache(config, max_position, embed.device), persistent=False)
        # On CPU, steps whose attention the fused kernels take whole (decode rows, short prefills) run
        # every layer in one call of them once they are built (`_fused_decoder`); False runs them layer
        # by layer, as longer prefills run (the profiler times the parts that way).
        self.one_call = True
        self._decoder: tuple[ModuleType, Any] | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The weights' (and the KV cache's) dtype."""
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live; every ForwardBatch tensor must be there too."""
        return self.embed.device

    def forward(self, batch: ForwardBatch, kv_caches: list[tuple[Tensor, Tensor]]) -> Tensor:
        """Run one ragged step; return float32 logits [len(batch.logits_indices), vocab]."""
        if batch.max_seq_len > self.max_position:
            raise ValueError(
                f"context of {batch.max_seq_len} tokens exceeds this model's limit of {self.max_position} "
                "positions (its position range, or its sliding window: longer contexts would not be "
                "computed as the model was trained); shorten the prompt or lower max_tokens"
            )
        hidden = F.embedding(batch.input_ids, self.embed)
        # Every sequence's attention in the fused kernel (decode rows, short prefills): one call for all layers.
        pairs = batch.max_query_len * batch.max_seq_len
        direct = batch.max_query_len == 1 or pairs <= kernels.direct_pairs(hidden.dtype)
        decoder = self._fused_decoder(hidden) if direct else None
        residual: Tensor | None = None
        if decoder is not None:
            k_caches, v_caches = zip(*kv_caches, strict=True)
            hidden, residual = decoder.run(
                hidden, list(k_caches), list(v_caches), batch.positions, batch.slot_mapping, batch.block_tables,
                batch.seq_lens, batch.query_start_loc, self.cos_sin_cache,
            )  # fmt: skip
        else:
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                hidden, residual = layer(hidden, residual, batch, kv_cache, self.cos_sin_cache)
        assert residual is not None
        # RMSNorm works row by row, so normalising only the rows we need is exact and saves work.
        rows = batch.logits_indices
        normed = kernels.rms_norm(hidden[rows], self.norm, self.eps, residual[rows])
        assert isinstance(normed, tuple)
        return vocab_logits(normed[0], self._head)

    def _fused_decoder(self, hidden: Tensor) -> Any:
        """The fused kernels' one-call decoder where they run `hidden` (built, CPU, float32 or bfloat16), else None.

        It calls the same kernels and products as the layers, in the same order, so its result is theirs.
        """
        ops = kernels.fused_ops(hidden) if self.one_call else None
        layers = cast("list[DecoderLayer]", list(self.layers))
        if ops is None or not all(layer.silu for layer in layers):
            return None
        if self._decoder is None or self._decoder[0] is not ops:
            first = layers[0]
            weights = [layer.fused_weights() for layer in layers]
            decoder = ops.Decoder(
                weights, first.num_heads, first.num_kv_heads, first.head_dim, first.eps, first.scale, FUSED_ROWS,
                kernels.direct_pairs(hidden.dtype),
            )  # fmt: skip
            self._decoder = (ops, decoder)
        return self._decoder[1]
