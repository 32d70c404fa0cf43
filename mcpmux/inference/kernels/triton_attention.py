"""Paged attention over a ragged batch in one launch: decode and prefill/extend rows together.

Grid: (sequence, query block, KV head x split). A program takes BLOCK_Q query tokens of one
sequence and all GROUP query heads that share one KV head, so each K/V tile it loads from the paged
cache serves BLOCK_M = BLOCK_Q * GROUP rows of one ``tl.dot`` (GQA costs no extra memory traffic).
It walks the sequence's keys in BLOCK_N tiles, finding each key's physical block through the block
table, and keeps an online softmax in fp32 (base 2: the scale is pre-multiplied by log2(e)). Keys
past the last query of the block are never loaded, so the causal mask only trims the diagonal tiles.

With split-KV (see :mod:`mcpmux.inference.kernels.launch_configs`) each program covers one key range and writes its
unnormalised accumulator with its running max and sum; ``_merge_splits`` rescales and adds them.
"""

# Triton types a kernel's parameters itself (pointers, scalars, constexprs) at launch.
# mypy: disable-error-code="no-untyped-def"

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from mcpmux.inference.kernels.launch_configs import attention_config, split_size
from mcpmux.inference.kernels.triton_support import check_launchable, interpreted_bf16, last_dim_contiguous, next_pow2


@triton.jit
def _attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    scale_log2,
    num_tokens,
    num_heads,
    keys_per_split,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ko,
    stride_kh,
    stride_vb,
    stride_vo,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    q_tok = q_block * BLOCK_Q + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_tok < q_len)
    q_pos = context_len + q_tok
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM

    q_rows = (q_start + q_tok).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)

    # Keys up to the last query position of this block; a split takes its own slice of them.
    kv_end = tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q)
    kv_lo = split * keys_per_split
    kv_hi = tl.minimum(kv_end, kv_lo + keys_per_split)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    for start in range(kv_lo, kv_hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < kv_hi
        block = tl.load(block_tables_ptr + seq * stride_bt + keys // KV_BLOCK_SIZE, mask=key_ok, other=0)
        offset = keys % KV_BLOCK_SIZE
        k_base = block.to(tl.int64) * stride_kb + offset * stride_ko + kv_head * stride_kh
        v_base = block.to(tl.int64) * stride_vb + offset * stride_vo + kv_head * stride_vh
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + k_base[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + v_base[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        visible = row_ok[:, None] & key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with nothing visible yet keep m = -inf; subtracting 0 instead avoids inf - inf = NaN.
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[:, None]
        tl.store(
            out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )
    else:
        part = (split * num_tokens + q_rows) * num_heads + head
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        tl.store(
            part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :],
            acc,
            mask=row_ok[:, None] & dim_ok[None, :],
        )


@triton.jit
def _merge_splits(
    out_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    num_tokens,
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    split_ok = splits < NUM_SPLITS
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM
    part = (splits * num_tokens + token) * num_heads + head
    m = tl.load(part_m_ptr + part, mask=split_ok, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=split_ok, other=0.0)  # noqa: E741
    m_max = tl.max(m, 0)
    # Splits that saw no key have m = -inf and weigh exactly 0.
    weight = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :],
        mask=split_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    o = tl.sum(acc * weight[:, None], 0) / tl.sum(l * weight, 0)
    tl.store(
        out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + dims,
        o.to(out_ptr.dtype.element_ty),
        mask=dim_ok,
    )


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    out: Tensor | None = None,
    num_splits: int | None = None,
) -> Tensor:
    """Triton paged attention; same contract as :func:`mcpmux.inference.kernels.paged_attention`.

    ``num_splits`` forces the split-KV variant (tests, benchmarks); by default the table in
    :mod:`mcpmux.inference.kernels.launch_configs` decides.
    """
    check_launchable(_attention_kernel, q, "paged-attention")
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"paged_attention: {num_heads} query heads is not a multiple of {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    q = last_dim_contiguous(q)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("paged_attention: the KV caches and `out` need a contiguous last (head_dim) dimension")
    if num_tokens == 0 or num_seqs == 0:
        return out
    cfg = attention_config(head_dim, group, num_seqs, num_kv_heads, max_query_len, max_seq_len, q.device, num_splits)
    head_dim_pad = max(16, next_pow2(head_dim))
    if cfg.num_splits > 1:
        part_acc = torch.empty((cfg.num_splits, num_tokens, num_heads, head_dim), dtype=torch.float32, device=q.device)
        part_m = torch.empty((cfg.num_splits, num_tokens, num_heads), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # never touched when NUM_SPLITS == 1
    grid = (num_seqs, triton.cdiv(max(max_query_len, 1), cfg.block_q), num_kv_heads * cfg.num_splits)
    _attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        part_acc,
        part_m,
        part_l,
        scale * math.log2(math.e),
        num_tokens,
        num_heads,
        split_size(max_seq_len, cfg.num_splits, cfg.block_n),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        BLOCK_Q=cfg.block_q,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        KV_BLOCK_SIZE=k_cache.shape[1],
        NUM_SPLITS=cfg.num_splits,
        UPCAST=interpreted_bf16(_attention_kernel, q.dtype),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if cfg.num_splits > 1:
        _merge_splits[(num_tokens, num_heads)](
            out,
            part_acc,
            part_m,
            part_l,
            num_tokens,
            num_heads,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=head_dim_pad,
            NUM_SPLITS=cfg.num_splits,
            SPLITS_PAD=next_pow2(cfg.num_splits),
            num_warps=4,
        )
    return out
