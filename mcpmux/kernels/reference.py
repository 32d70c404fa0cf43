"""Torch reference kernels: the CPU production path and the oracle every Triton kernel is tested against.

They are written to be obviously right first: gather each sequence's K/V through its block table,
run a masked causal softmax in fp32, and let GQA fall out of a grouped view of the query heads. All
decode rows of a step share one batched pass; prefill/extend rows loop over their (few) sequences,
never over tokens.
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
    # index_select, not cache[blocks]: the same copy, about twice as fast on CPU.
    blocks = block_table[:num_blocks].long()
    return cache.index_select(0, blocks).flatten(0, 1)[:seq_len]


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
    """Causal attention of each sequence's last query tokens over its paged context (see package docs).

    Decode rows (one query token) are attended together in one batched pass, since a step often
    holds dozens of them; prefill/extend rows go one sequence at a time.
    """
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    decode = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
    if decode:
        _attend_decode_rows(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out, decode)
    for i, seq_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        if end - start > 1:
            out[start:end] = _attend_sequence(q[start:end], k_cache, v_cache, block_tables[i], seq_len, scale)
    return out


def _attend_sequence(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seq_len: int, scale: float
) -> Tensor:
    """One sequence's q_len query rows [q_len, H, D], the last q_len positions of its context."""
    q_len, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    k = gather_kv(k_cache, block_table, seq_len).float()  # [L, Hkv, D]
    v = gather_kv(v_cache, block_table, seq_len).float()
    # Grouped view: query head h reads KV head h // group, as in HF's repeat_kv.
    qg = q.float().view(q_len, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.einsum("qhgd,khd->hgqk", qg, k) * scale
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
    future = torch.arange(seq_len, device=q.device)[None, :] > q_pos[:, None]  # [q_len, L]
    probs = torch.softmax(scores.masked_fill_(future, float("-inf")), dim=-1)
    return torch.einsum("hgqk,khd->qhgd", probs, v).reshape(q_len, num_heads, head_dim).to(q.dtype)


def _attend_decode_rows(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    out: Tensor,
    seqs: list[int],
) -> None:
    """All single-token sequences at once: their contexts gathered into one padded [S, L, Hkv, D]."""
    _, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    index = torch.tensor(seqs, device=q.device)
    lens = seq_lens[index].long()
    max_len = int(lens.max())
    blocks = block_tables[index, : -(-max_len // block_size)].long()  # [S, nb]
    shape = (len(seqs), -1, num_kv_heads, head_dim)
    k = k_cache.index_select(0, blocks.flatten()).view(shape)[:, :max_len].float()  # [S, L, Hkv, D]
    v = v_cache.index_select(0, blocks.flatten()).view(shape)[:, :max_len].float()
    rows = query_start_loc[index].long()
    qg = q[rows].float().view(len(seqs), num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.einsum("shgd,slhd->shgl", qg, k) * scale
    # The single query sits at the last position, so it sees exactly the first seq_len keys.
    padding = torch.arange(max_len, device=q.device)[None, :] >= lens[:, None]  # [S, L]
    probs = torch.softmax(scores.masked_fill_(padding[:, None, None, :], float("-inf")), dim=-1)
    out[rows] = torch.einsum("shgl,slhd->shgd", probs, v).reshape(len(seqs), num_heads, head_dim).to(out.dtype)


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
