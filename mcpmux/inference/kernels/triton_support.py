"""What every Triton launcher needs: can this kernel run on this tensor, and small shape helpers.

This module imports triton, so it (and the ``triton_*`` kernel modules) is imported lazily by the
dispatcher: the CPU path never pays for it, and ``TRITON_INTERPRET`` set by a test before the first
Triton call still takes effect, because ``@triton.jit`` reads it when a kernel is decorated.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from triton.language import standard
from triton.runtime.interpreter import InterpretedFunction


def is_interpreted(kernel: Any) -> bool:
    """True when ``kernel`` was decorated under ``TRITON_INTERPRET=1`` (it runs on CPU through numpy)."""
    return isinstance(kernel, InterpretedFunction)


def interpreter_ready(kernel: Any) -> bool:
    """True when ``kernel`` can run in the interpreter: it, and triton's own jitted helpers (decorated
    when triton was imported), were both created under ``TRITON_INTERPRET=1``."""
    return is_interpreted(kernel) and is_interpreted(standard.cdiv)


def check_launchable(kernel: Any, tensor: Tensor, what: str) -> None:
    """Raise a clear error when ``kernel`` cannot run on ``tensor``'s device."""
    if tensor.is_cuda or interpreter_ready(kernel):
        return
    raise RuntimeError(
        f"the Triton {what} kernel cannot run on a {tensor.device.type} tensor: Triton needs CUDA, or "
        "TRITON_INTERPRET=1 in the environment before triton is first imported (it was not set when "
        "triton or mcpmux's Triton kernels were imported). Set TRITON_INTERPRET=1 at process start, or use "
        "MCPMUX_KERNELS=auto (torch reference on CPU) or MCPMUX_KERNELS=torch."
    )


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (Triton block shapes must be powers of two)."""
    return 1 << max(0, (n - 1).bit_length())


def rows_view(x: Tensor) -> Tensor:
    """``x`` as a 2-D [rows, last_dim] tensor whose last dimension is contiguous (a copy only if needed)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def last_dim_contiguous(x: Tensor) -> Tensor:
    """``x`` itself when its last dimension has stride 1, else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def interpreted_bf16(kernel: Any, dtype: torch.dtype) -> bool:
    """True when bf16 math would run in the interpreter, whose bf16 ``tl.dot`` returns garbage."""
    return dtype == torch.bfloat16 and is_interpreted(kernel)
