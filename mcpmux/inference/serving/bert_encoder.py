"""A lean forward for BERT encoders (all-MiniLM-L6-v2 and its kin), for short texts on a CPU.

transformers' `BertModel` spends about a quarter of a short query's forward in Python (mask
building, attention dispatch, reshapes), and each layer's query, key and value projections are
three small matrix products. `PackedBert` runs the same math (in float32, equal to `BertModel`'s
output within 1e-5) with one QKV product per layer and nothing else around it; where torch has
oneDNN, every linear layer's weights are laid out once for oneDNN's matrix product and the GELU is
fused into it, which at a short text's handful of rows reads the weights faster than the default
product. Only plain BERT configs are packed (`pack` answers None for others).

Dynamic int8 quantization of the linear layers was measured and left out: it took about 40% off
the forward, but moved R@1 on the tool-search held-out queries by 0.02 (`benchmarks/tool_search.py`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _OneDnnLinear(nn.Module):
    """A linear layer (optionally followed by the exact GELU) on weights prepacked for oneDNN."""

    def __init__(self, linear: nn.Linear, activation: str = "none") -> None:
        super().__init__()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 16)
        self.bias = linear.bias.detach()
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        algorithm = "none" if self.activation == "gelu" else ""
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.weight, self.bias, self.activation, [], algorithm
        )
        return out


class _Gelu(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))


class _Layer(nn.Module):
    def __init__(self, layer: Any) -> None:
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
                _OneDnnLinear(qkv),
                _OneDnnLinear(out),
                _OneDnnLinear(up, "gelu"),
                _OneDnnLinear(down),
            )
        else:
            self.qkv, self.out, self.up, self.down = qkv, out, _Gelu(up), down

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        batch, length, width = h.shape
        q, k, v = self.qkv(h).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(h.shape)
        h = self.norm1(self.out(context) + h)
        return self.norm2(self.down(self.up(h)) + h)


class PackedBert(nn.Module):
    """`BertModel`'s last hidden state from token ids and a 0/1 mask (None: no padding)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        embeddings = model.embeddings
        self.words = embeddings.word_embeddings
        self.positions = embeddings.position_embeddings
        self.token_type = nn.Parameter(embeddings.token_type_embeddings.weight[0].detach().clone())
        self.norm = embeddings.LayerNorm
        self.layers = nn.ModuleList(_Layer(layer) for layer in model.encoder.layer)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        length = input_ids.shape[1]
        h = self.norm(self.words(input_ids) + self.positions.weight[:length] + self.token_type)
        attend = None if mask is None else (mask[:, None, None, :] > 0)
        for layer in self.layers:
            h = layer(h, attend)
        return h


def pack(model: Any) -> PackedBert | None:
    """The packed encoder for a plain BERT `model`, else None."""
    config = model.config
    plain = (
        config.model_type == "bert"
        and config.hidden_act == "gelu"
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
    )
    return PackedBert(model).eval() if plain else None
