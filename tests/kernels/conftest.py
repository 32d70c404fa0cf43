"""Kernel tests: the Triton kernels run on CPU through ``TRITON_INTERPRET=1``.

The variable only takes effect when it is set before the first ``import triton`` in the process.
When this directory runs alone, setting it here (before any test module loads) is early enough and
the Triton tests run in-process. In a whole-suite run, other directories import transformers (which
imports triton) first; then the in-process Triton tests skip and ``test_interpreter_subprocess.py``
runs the same files in a fresh interpreter-mode process instead, so they always run exactly once.
With CUDA present nothing is set: the same tests run the compiled kernels on the GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# The test files that launch Triton kernels (run again in a subprocess when needed, see above).
TRITON_TEST_FILES = (
    "test_triton_attention.py",
    "test_triton_ops.py",
    "test_engine_triton.py",
)


def triton_runs_here() -> bool:
    """True when this process can launch Triton kernels: CUDA, or triton imported in interpreter mode."""
    if torch.cuda.is_available():
        return True
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.cdiv, InterpretedFunction)


@pytest.fixture
def triton_backend() -> Iterator[None]:
    """Force the Triton path of ``mcpmux.kernels`` for one test."""
    if not triton_runs_here():
        pytest.skip("triton was imported before TRITON_INTERPRET=1; test_interpreter_subprocess runs this file")
    from mcpmux.kernels import set_backend

    set_backend("triton")
    try:
        yield
    finally:
        set_backend(None)
