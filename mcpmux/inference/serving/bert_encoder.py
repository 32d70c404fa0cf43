"""A lean forward for BERT encoders (all-MiniLM-L6-v2 and its kin), for short texts on a CPU.

transformers' `BertModel` spends about a quarter of a short query's forward in Python (mask
building, attention dispatch, reshapes), and each layer's query, key and value projections are
three small matrix products. `PackedBert` runs the same math with one QKV product per layer and
nothing else around it; where torch has oneDNN, every linear layer's weights are laid out once for
oneDNN's matrix product and the GELU is fused into it.

A short text's forward is bound by reading the linear layers' weights (42 MB in float32) once per
text. Where the CPU multiplies bfloat16 in hardware (AMX or AVX512-BF16: `matmul_dtype`), those
weights and the layers' inputs are bfloat16, half the bytes, and each product accumulates in
float32; embeddings, layer norms, residuals and attention stay float32. Each vector keeps a cosine
above 0.9999 with the float32 one, and tool search's R@1, R@5 and MRR are unchanged
(`benchmarks/tool_search.py`). On one core of a Xeon with AMX, a query's 24 products (11 rows)
take 2.2 ms instead of 5.2 (3.8 ms with oneDNN held to AVX512-BF16), and a batch of 32 tool
descriptions 255 ms instead of 706. Without those instructions oneDNN emulates bfloat16 (10.7 ms
against float32's 4.6 ms when held to plain AVX-512) or refuses it (AVX2), so other CPUs keep
float32, equal to `BertModel`'s output within 1e-5. Only plain BERT configs are packed (`pack`
answers None for others).

Dynamic int8 quantization of the linear layers was measured and left out: it took about 40% off
the forward, but moved R@1 on the tool-search held-out queries by 0.02.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def matmul_dtype() -> torch.dtype:
    """bfloat16 where oneDNN multiplies it in hardware here (AVX512-BF16 or AMX), else float32."""
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if native and torch.backends.mkldnn.is_available() else torch.float32


class _OneDnnLinear(nn.Module):
    """A linear layer (optionally followed by the exact GELU) on weights prepacked for oneDNN, in `dtype`.

    Its input is cast to `dtype`, and its output is in `dtype`."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor, activation: str = "none", dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), 16)
        self.bias = bias.detach().to(dtype)
        self.dtype = dtype
        self.activation = activation
        self.algorithm = "none" if activation == "gelu" else ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x.to(self.dtype), self.weight, self.bias, self.activation, [], self.algorithm
        )
        return out


class _Linear(nn.Module):
    """A float32 linear layer (optionally followed by the exact GELU), where torch has no oneDNN."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, activation: str = "none") -> None:
        super().__init__()
        self.weight = weight.detach().float()
        self.bias = bias.detach().float()
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        return F.gelu(out) if self.activation == "gelu" else out


def _norm(weights: Mapping[str, torch.Tensor], name: str, eps: float) -> nn.LayerNorm:
    norm = nn.LayerNorm(weights[f"{name}.weight"].shape[0], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weights[f"{name}.weight"])
        norm.bias.copy_(weights[f"{name}.bias"])
    return norm


class _Layer(nn.Module):
    def __init__(self, weights: Mapping[str, torch.Tensor], prefix: str, config: Mapping[str, Any], dtype: torch.dtype):
        super().__init__()

        def linear(name: str, activation: str = "none") -> nn.Module:
            if name == "qkv":  # the three projections as one product
                parts = [f"{prefix}attention.self.{part}" for part in ("query", "key", "value")]
                weight = torch.cat([weights[f"{part}.weight"] for part in parts])
                bias = torch.cat([weights[f"{part}.bias"] for part in parts])
            else:
                weight, bias = weights[f"{prefix}{name}.weight"], weights[f"{prefix}{name}.bias"]
            if torch.backends.mkldnn.is_available():
                return _OneDnnLinear(weight, bias, activation, dtype)
            return _Linear(weight, bias, activation)

        eps = float(config.get("layer_norm_eps", 1e-12))
        self.heads = int(config["num_attention_heads"])
        self.qkv = linear("qkv")
        self.out = linear("attention.output.dense")
        self.up = linear("intermediate.dense", "gelu")
        self.down = linear("output.dense")
        self.norm1 = _norm(weights, f"{prefix}attention.output.LayerNorm", eps)
        self.norm2 = _norm(weights, f"{prefix}output.LayerNorm", eps)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # `.float()` is a no-op on float32 products; bfloat16 ones come back to float32 here, while
        # the up projection's output goes into the down projection as it is.
        batch, length, width = h.shape
        qkv = self.qkv(h).float().view(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(h.shape)
        h = self.norm1(self.out(context).float() + h)
        return self.norm2(self.down(self.up(h)).float() + h)


class PackedBert(nn.Module):
    """`BertModel`'s last hidden state (float32) from token ids and a 0/1 mask (None: no padding).

    Built from the checkpoint's tensors (`BertModel`'s names: `embeddings.*`, `encoder.layer.N.*`) and
    its `config.json`; `dtype`: the linear layers' weights, float32 or bfloat16 (with oneDNN only)."""

    def __init__(
        self, weights: Mapping[str, torch.Tensor], config: Mapping[str, Any], dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.dtype = dtype if torch.backends.mkldnn.is_available() else torch.float32
        self.words = weights["embeddings.word_embeddings.weight"].detach().float()
        self.positions = weights["embeddings.position_embeddings.weight"].detach().float()
        self.token_type = weights["embeddings.token_type_embeddings.weight"][0].detach().float().clone()
        self.norm = _norm(weights, "embeddings.LayerNorm", float(config.get("layer_norm_eps", 1e-12)))
        self.layers = nn.ModuleList(
            _Layer(weights, f"encoder.layer.{i}.", config, self.dtype) for i in range(int(config["num_hidden_layers"]))
        )

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        length = input_ids.shape[1]
        h = self.norm(F.embedding(input_ids, self.words) + self.positions[:length] + self.token_type)
        attend = None if mask is None else (mask[:, None, None, :] > 0)
        for layer in self.layers:
            h = layer(h, attend)
        return h


def plain_bert(config: Mapping[str, Any]) -> bool:
    """Whether `config` (a model folder's config.json) is a BERT that `PackedBert` computes exactly."""
    return (
        config.get("model_type") == "bert"
        and config.get("hidden_act") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
    )


def pack_weights(
    weights: Mapping[str, torch.Tensor], config: Mapping[str, Any], dtype: torch.dtype | None = None
) -> PackedBert | None:
    """The packed encoder for a plain BERT checkpoint's tensors, else None; `dtype` of its linear layers'
    weights: float32, bfloat16, or None for `matmul_dtype()`. A checkpoint saved from a task model names
    its tensors `bert.*`: the prefix is dropped."""
    if not plain_bert(config):
        return None
    named = {name.removeprefix("bert."): tensor for name, tensor in weights.items()}
    return PackedBert(named, config, matmul_dtype() if dtype is None else dtype).eval()


def pack(model: Any, dtype: torch.dtype | None = None) -> PackedBert | None:
    """The packed encoder for a transformers `BertModel` (see `pack_weights`)."""
    return pack_weights(model.state_dict(), model.config.to_dict(), dtype)
