"""Builders for ragged paged-attention batches and the dense ground truth they must match."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(slots=True)
class PagedBatch:
    """A ragged step: queries, paged caches holding every sequence's K/V, and the same K/V unpaged."""

    q: Tensor  # [T, H, D]
    k_cache: Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: Tensor
    block_tables: Tensor  # [S, max_blocks] int32, blocks shuffled, padding holds other sequences' blocks
    seq_lens: Tensor  # [S] int32
    query_start_loc: Tensor  # [S + 1] int32
    max_query_len: int
    max_seq_len: int
    dense_k: list[Tensor]  # per sequence [seq_len, Hkv, D]
    dense_v: list[Tensor]
    scale: float


def make_paged_batch(
    specs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> PagedBatch:
    """``specs`` lists (seq_len, q_len) per sequence; fresh random data on every call.

    Blocks are handed out in a random order (non-contiguous block tables), spare blocks and the
    padding of the block tables point at random blocks full of noise, so a kernel that reads past a
    sequence's context or through the wrong table entry gets garbage, not zeros.
    """
    blocks_per_seq = [-(-seq_len // block_size) for seq_len, _ in specs]
    num_blocks = sum(blocks_per_seq) + 3
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    order = torch.randperm(num_blocks, device=device)
    width = max(blocks_per_seq) + 1
    block_tables = torch.randint(0, num_blocks, (len(specs), width), dtype=torch.int32, device=device)
    dense_k: list[Tensor] = []
    dense_v: list[Tensor] = []
    used = 0
    for i, ((seq_len, _), n) in enumerate(zip(specs, blocks_per_seq, strict=True)):
        block_tables[i, :n] = order[used : used + n].to(torch.int32)
        used += n
        k = torch.randn(seq_len, num_kv_heads, head_dim, dtype=dtype, device=device)
        v = torch.randn_like(k)
        pos = torch.arange(seq_len, device=device)
        blocks = block_tables[i, pos // block_size].long()
        k_cache[blocks, pos % block_size] = k
        v_cache[blocks, pos % block_size] = v
        dense_k.append(k)
        dense_v.append(v)
    q_lens = [q_len for _, q_len in specs]
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    return PagedBatch(
        q=torch.randn(starts[-1], num_heads, head_dim, dtype=dtype, device=device),
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=torch.tensor([s for s, _ in specs], dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        max_query_len=max(q_lens),
        max_seq_len=max(s for s, _ in specs),
        dense_k=dense_k,
        dense_v=dense_v,
        scale=head_dim**-0.5,
    )


def dense_attention(batch: PagedBatch) -> Tensor:
    """Ground truth in float64: torch SDPA per sequence on the unpaged K/V with an explicit causal mask."""
    num_heads = batch.q.shape[1]
    out = torch.empty(batch.q.shape, dtype=torch.float64, device=batch.q.device)
    starts = batch.query_start_loc.tolist()
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        start, end = starts[i], starts[i + 1]
        q_len = end - start
        group = num_heads // batch.dense_k[i].shape[1]
        q = batch.q[start:end].double().transpose(0, 1)  # [H, q_len, D]
        k = batch.dense_k[i].double().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
        v = batch.dense_v[i].double().repeat_interleave(group, dim=1).transpose(0, 1)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        visible = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=batch.scale)
        out[start:end] = o.transpose(0, 1)
    return out


# A mixed step: decode rows (q_len 1), whole prompts, and extends onto cached context; lengths on and
# off block boundaries for block sizes 4 and 8.
MIXED_SPECS: list[tuple[int, int]] = [(1, 1), (9, 1), (16, 16), (13, 5), (8, 3), (24, 1), (6, 6)]
