"""The model's matrix products, laid out for the CPU's BLAS at every batch size.

`F.linear(x, W)` asks MKL for ``x @ W.T``, with the weight as the second operand, and MKL copies
(packs) all of that operand on every call. For the few rows of a decode step the copy costs as much
as the product. Asking for the transposed product ``W @ x.T`` puts the weight first, where MKL
streams it once. Measured in the engine on SmolLM2's layers (AVX2, weights in DRAM): 1.5-2x faster
at 2-4 rows, 1.1-1.5x at 16-64 rows on one or two threads, about even from 256 rows up. Each output
element is still the dot product of a row of `x` with a row of `W`, summed in another order, so the
results match `F.linear` to rounding, not bit for bit.

The output head is different: 49k vocab rows against the few rows a step samples. Above 8 rows it
runs as ``x @ W.T`` in vocab slices (`vocab_linear`), which stay in cache between their packing and
their use; up to 8, as the transposed product.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

# Up to this many rows the transposed product wins on CPU; larger prefill chunks keep `F.linear`.
SKINNY_ROWS = 128
# Up to this many rows the output head runs as the transposed product, above it in vocab slices.
SKINNY_HEAD_ROWS = 8
# Vocab rows per sliced head matmul: a 2k-row slice of a 576-wide head (4.5 MiB) stays in cache.
VOCAB_SLICE = 2048


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for a 2-D `x`, row-major like it: on CPU, ``(weight @ x.T).T`` for few rows."""
    if x.device.type != "cpu" or x.shape[0] > SKINNY_ROWS:
        return F.linear(x, weight, bias)
    return _transposed(x, weight, bias)


def vocab_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(x, weight)`` for a large output head."""
    if x.device.type != "cpu" or weight.shape[0] <= VOCAB_SLICE:
        return F.linear(x, weight)
    if x.shape[0] <= SKINNY_HEAD_ROWS:
        return _transposed(x, weight, None)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    for start in range(0, weight.shape[0], VOCAB_SLICE):
        end = start + VOCAB_SLICE
        torch.mm(x, weight[start:end].t(), out=out[:, start:end])
    return out


def _transposed(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    # A contiguous `x` makes `x.T` the transposed operand MKL handles fast; a transposed `x` would be
    # taken as a plain one and run at half the speed. The result is copied back to row-major (a few
    # rows: cheap) so that the next product, and kernels that need contiguous rows, get one.
    x_t = x.contiguous().t()
    product = torch.mm(weight, x_t) if bias is None else torch.addmm(bias.unsqueeze(1), weight, x_t)
    return product.t().contiguous()
