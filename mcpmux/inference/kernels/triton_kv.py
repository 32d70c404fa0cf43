"""KV-cache write: scatter this step's K/V rows into the paged caches by slot mapping."""

# Triton types a kernel's parameters itself (pointers, scalars, constexprs) at launch.
# mypy: disable-error-code="no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from mcpmux.inference.kernels.triton_support import check_launchable, last_dim_contiguous, next_pow2


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kco,
    stride_kch,
    stride_vcb,
    stride_vco,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
):
    # One program per token: it moves all KV heads of that token at once.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    block = slot // KV_BLOCK_SIZE
    offset = slot % KV_BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    k = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kco + heads[:, None] * stride_kch
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vco + heads[:, None] * stride_vch
    tl.store(k_dst + dims[None, :], k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst + dims[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Triton KV write; same contract as :func:`mcpmux.inference.kernels.write_kv`."""
    check_launchable(_write_kv_kernel, key, "KV-write")
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("write_kv: the KV caches' last (head_dim) dimension must be contiguous")
    key = last_dim_contiguous(key)
    value = last_dim_contiguous(value)
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=next_pow2(num_kv_heads),
        HEAD_DIM_PAD=next_pow2(head_dim),
        KV_BLOCK_SIZE=k_cache.shape[1],
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )
