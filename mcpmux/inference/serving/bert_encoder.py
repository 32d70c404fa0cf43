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

    def __init__(self, linear: nn.Linear, activation: str = "none", dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().to(dtype), 16)
        self.bias = linear.bias.detach().to(dtype)
        self.dtype = dtype
        self.activation = activation
        self.algorithm = "none" if activation == "gelu" else ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x.to(self.dtype), self.weight, self.bias, self.activation, [], self.algorithm
        )
        return out


class _Gelu(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))


class _Layer(nn.Module):
    def __init__(self, layer: Any, dtype: torch.dtype) -> None:
        super().__init__()
        attention = layer.attention.self
        parts = (attention.query, attention.key, attention.value)
        qkv = nn.Linear(parts[0].in_features, 3 * parts[0].out_features)
        with torch.no_grad():
            qkv.weight.copy_(torch.cat([p.weight for p in parts]))
            qkv.bias.copy_(torch.cat([p.bias for p in parts]))
        self.heads = attention.num_attention_heads
        self.norm1 = layer.attention.output.LayerNorm
        self.norm2 = layer.output.LayerNorm
        out, up, down = layer.attention.output.dense, layer.intermediate.dense, layer.output.dense
        self.qkv: nn.Module
        self.out: nn.Module
        self.up: nn.Module
        self.down: nn.Module
        if torch.backends.mkldnn.is_available():
            self.qkv, self.out, self.up, self.down = (
                _OneDnnLinear(qkv, dtype=dtype),
                _OneDnnLinear(out, dtype=dtype),
                _OneDnnLinear(up, "gelu", dtype),
                _OneDnnLinear(down, dtype=dtype),
            )
        else:
            self.qkv, self.out, self.up, self.down = qkv, out, _Gelu(up), down

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

    `dtype`: the linear layers' weights, float32 or bfloat16 (with oneDNN only)."""

    def __init__(self, model: Any, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        embeddings = model.embeddings
        self.dtype = dtype if torch.backends.mkldnn.is_available() else torch.float32
        self.words = embeddings.word_embeddings
        self.positions = embeddings.position_embeddings
        self.token_type = nn.Parameter(embeddings.token_type_embeddings.weight[0].detach().clone())
        self.norm = embeddings.LayerNorm
        self.layers = nn.ModuleList(_Layer(layer, self.dtype) for layer in model.encoder.layer)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        length = input_ids.shape[1]
        h = self.norm(self.words(input_ids) + self.positions.weight[:length] + self.token_type)
        attend = None if mask is None else (mask[:, None, None, :] > 0)
        for layer in self.layers:
            h = layer(h, attend)
        return h


def pack(model: Any, dtype: torch.dtype | None = None) -> PackedBert | None:
    """The packed encoder for a plain BERT `model`, else None; `dtype` of its linear layers'
    weights: float32, bfloat16, or None for `matmul_dtype()`."""
    config = model.config
    plain = (
        config.model_type == "bert"
        and config.hidden_act == "gelu"
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
    )
    return PackedBert(model, matmul_dtype() if dtype is None else dtype).eval() if plain else None
