"""Which implementation runs a kernel call: Triton or the torch reference.

The choice is made per call from the tensor's device and a mode, so tests and benchmarks can switch
without reloading anything. The mode comes from :func:`set_backend` when set, else from the
``MCPMUX_KERNELS`` environment variable read at call time:

- ``auto`` (default): Triton when the tensor is on CUDA, the torch reference otherwise;
- ``triton``: always Triton (on CPU only under ``TRITON_INTERPRET=1``, set before triton is imported);
- ``torch``: always the torch reference.
"""

from __future__ import annotations

import os
from typing import Literal

from torch import Tensor

Mode = Literal["auto", "triton", "torch"]
MODES: tuple[Mode, ...] = ("auto", "triton", "torch")
ENV_VAR = "MCPMUX_KERNELS"

_override: Mode | None = None


def set_backend(mode: str | None) -> None:
    """Force ``"auto"``, ``"triton"`` or ``"torch"`` for this process; ``None`` goes back to the env var."""
    global _override
    _override = None if mode is None else _check(mode, "set_backend()")


def current_mode() -> Mode:
    """The mode in force now: the :func:`set_backend` override, else ``MCPMUX_KERNELS``, else ``auto``."""
    if _override is not None:
        return _override
    return _check(os.environ.get(ENV_VAR, "auto"), f"the {ENV_VAR} environment variable")


def backend(tensor: Tensor) -> str:
    """``"triton"`` or ``"torch"``: the implementation a kernel call on ``tensor`` would use now."""
    mode = current_mode()
    if mode == "auto":
        return "triton" if tensor.is_cuda else "torch"
    return mode


def _check(value: str, source: str) -> Mode:
    mode = value.strip().lower()
    for known in MODES:
        if mode == known:
            return known
    raise ValueError(f"unknown kernel backend {value!r} from {source}: use one of {', '.join(MODES)}")
