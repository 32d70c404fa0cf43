"""Torch reference kernels: the CPU production path and the oracle every Triton kernel is tested against.

They are written to be obviously right rather than fast: gather each sequence's K/V through its block
table, run a masked causal softmax in fp32, and let GQA fall out of a grouped view of the query heads.
Python loops run over sequences (a handful per step), never over tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Scatter ``key``/``value`` [T, Hkv, D] into the paged caches at ``slot_mapping`` (< 0: skip)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    # A flat [num_blocks * block_size, Hkv, D] view makes slot = block * block_size + offset a row index.
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)


def gather_kv(cache: Tensor, block_table: Tensor, seq_len: int) -> Tensor:
    """The first ``seq_len`` cached rows [seq_len, Hkv, D] of one sequence, in position order."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = block_table[:num_blocks].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    out: Tensor | None = None,
) -> Tensor:
    """Causal attention of each sequence's last query tokens over its paged context (see package docs)."""
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        q_len = end - start
        if q_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len).float()  # [L, Hkv, D]
        v = gather_kv(v_cache, block_tables[i], seq_len).float()
        # Grouped view: query head h reads KV head h // group, as in HF's repeat_kv.
        qi = q[start:end].float().view(q_len, num_kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,khd->hgqk", qi, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        future = k_pos[None, :] > q_pos[:, None]  # [q_len, L]
        scores.masked_fill_(future, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        oi = torch.einsum("hgqk,khd->qhgd", probs, v).reshape(q_len, num_heads, head_dim)
        out[start:end] = oi.to(out.dtype)
    return out


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """LlamaRMSNorm, step for step (fp32 statistics, back to the input dtype, then the weight)."""
    h = x if residual is None else x + residual
    input_dtype = h.dtype
    hf = h.to(torch.float32)
    variance = hf.pow(2).mean(-1, keepdim=True)
    normed = weight * (hf * torch.rsqrt(variance + eps)).to(input_dtype)
    if residual is None:
        return normed
    return normed, h


def rotary_embedding(positions: Tensor, q: Tensor, k: Tensor, cos_sin_cache: Tensor) -> tuple[Tensor, Tensor]:
    """NeoX / HF-Llama rotary embedding (rotate_half) of the first ``rotary_dim`` features of q and k."""
    rotary_dim = cos_sin_cache.shape[1]
    half = rotary_dim // 2
    cos_sin = cos_sin_cache[positions]  # [T, rotary_dim]
    cos = torch.cat((cos_sin[:, :half], cos_sin[:, :half]), dim=-1)[:, None, :]
    sin = torch.cat((cos_sin[:, half:], cos_sin[:, half:]), dim=-1)[:, None, :]
    return _rotate(q, cos, sin, rotary_dim), _rotate(k, cos, sin, rotary_dim)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int) -> Tensor:
    # HF casts cos/sin to the activation dtype before multiplying; doing the same keeps fp16/bf16 equal too.
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    rot = x[..., :rotary_dim]
    half = rotary_dim // 2
    rotated_half = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    embedded = rot * cos + rotated_half * sin
    if rotary_dim == x.shape[-1]:
        return embedded
    return torch.cat((embedded, x[..., rotary_dim:]), dim=-1)
