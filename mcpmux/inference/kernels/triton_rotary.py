"""Rotary position embedding, NeoX / HF-Llama style (rotate_half), applied to q and k in place."""

# Triton types a kernel's parameters itself (pointers, scalars, constexprs) at launch.
# mypy: disable-error-code="no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from mcpmux.inference.kernels.triton_support import check_launchable, next_pow2


@triton.jit
def _rotate_heads(
    x_ptr,
    stride_t,
    stride_h,
    token,
    cos,
    sin,
    num_heads,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    heads = tl.arange(0, HEADS_PAD)
    cols = tl.arange(0, HALF_PAD)
    mask = (heads[:, None] < num_heads) & (cols[None, :] < HALF)
    first = x_ptr + token * stride_t + heads[:, None] * stride_h + cols[None, :]
    # fp32 math rounded to the activation dtype after each step where HF's
    # q * cos + rotate_half(q) * sin rounds (cos/sin cast first): bit-faithful in every dtype.
    dtype = x_ptr.dtype.element_ty
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    c = cos.to(dtype).to(tl.float32)[None, :]
    s = sin.to(dtype).to(tl.float32)[None, :]
    out1 = (x1 * c).to(dtype).to(tl.float32) - (x2 * s).to(dtype).to(tl.float32)
    out2 = (x2 * c).to(dtype).to(tl.float32) + (x1 * s).to(dtype).to(tl.float32)
    tl.store(first, out1.to(dtype), mask=mask)
    tl.store(first + HALF, out2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    cos_sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cs,
    num_heads,
    num_kv_heads,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    cols = tl.arange(0, HALF_PAD)
    col_ok = cols < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cs + cols, mask=col_ok, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + cols, mask=col_ok, other=0.0)
    _rotate_heads(q_ptr, stride_qt, stride_qh, token, cos, sin, num_heads, HALF, Q_HEADS_PAD, HALF_PAD)
    _rotate_heads(k_ptr, stride_kt, stride_kh, token, cos, sin, num_kv_heads, HALF, K_HEADS_PAD, HALF_PAD)


def rotary_embedding(positions: Tensor, q: Tensor, k: Tensor, cos_sin_cache: Tensor) -> tuple[Tensor, Tensor]:
    """Triton rotary embedding, in place on q and k; contract of :func:`mcpmux.inference.kernels.rotary_embedding`."""
    check_launchable(_rotary_kernel, q, "rotary-embedding")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos_sin_cache.stride(-1) != 1:
        raise ValueError("rotary_embedding: q, k and cos_sin_cache need a contiguous last dimension")
    num_tokens, num_heads, _ = q.shape
    num_kv_heads = k.shape[1]
    half = cos_sin_cache.shape[1] // 2
    if num_tokens > 0:
        _rotary_kernel[(num_tokens,)](
            positions,
            q,
            k,
            cos_sin_cache,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos_sin_cache.stride(0),
            num_heads,
            num_kv_heads,
            HALF=half,
            HALF_PAD=next_pow2(half),
            Q_HEADS_PAD=next_pow2(num_heads),
            K_HEADS_PAD=next_pow2(num_kv_heads),
            num_warps=4 if num_heads * half >= 2048 else 1,
        )
    return q, k
