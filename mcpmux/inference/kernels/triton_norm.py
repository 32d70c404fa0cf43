"""Fused RMSNorm (optionally with the residual add), computed as transformers' LlamaRMSNorm does."""

# Triton types a kernel's parameters itself (pointers, scalars, constexprs) at launch.
# mypy: disable-error-code="no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from mcpmux.inference.kernels.triton_support import check_launchable, next_pow2, rows_view


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    h_out_ptr,
    eps,
    hidden,
    stride_x,
    stride_r,
    stride_o,
    stride_h,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    # Math runs in fp32 with explicit rounding to the activation dtype wherever torch rounds: this is
    # bit-faithful to LlamaRMSNorm, and it keeps bf16 working in the interpreter (no numpy bf16 math).
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(dtype)
        tl.store(h_out_ptr + row * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)
    variance = tl.sum(x * x, 0) / hidden
    normed = (x * tl.math.rsqrt(variance + eps)).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Triton RMSNorm; same contract as :func:`mcpmux.inference.kernels.rms_norm`."""
    check_launchable(_rms_norm_kernel, x, "RMSNorm")
    hidden = x.shape[-1]
    x2 = rows_view(x)
    out_dtype = torch.result_type(weight, x)
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if residual is None:
        r2 = h2 = x2  # unused when HAS_RESIDUAL is false
    else:
        r2 = rows_view(residual)
        h2 = torch.empty_like(x2, memory_format=torch.contiguous_format)
    if x2.shape[0] > 0:
        block = next_pow2(hidden)
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            r2,
            weight,
            out,
            h2,
            eps,
            hidden,
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            h2.stride(0),
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    out = out.view(x.shape)
    if residual is None:
        return out
    return out, h2.view(x.shape)
