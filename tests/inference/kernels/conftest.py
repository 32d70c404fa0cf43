"""Kernel tests: the Triton kernels run on CPU through ``TRITON_INTERPRET=1``.

The variable only takes effect when it is set before the first ``import triton`` in the process.
When this directory runs alone, setting it here (before any test module loads) is early enough and
the Triton tests run in-process. In a whole-suite run, other directories import transformers (which
imports triton) first; then the Triton test files are not collected here and
``test_interpreter_subprocess.py`` runs them in a fresh interpreter-mode process instead (that file is
collected only then), so they always run exactly once.
With CUDA present nothing is set: the same tests run the compiled kernels on the GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Collect the Triton files here or their subprocess runner, never both and never neither."""
    name = collection_path.name
    if name in TRITON_TEST_FILES and not triton_runs_here():
        return True
    if name == "test_interpreter_subprocess.py" and triton_runs_here():
        return True
    return None  # no opinion: False would override other ignore rules such as --ignore


@pytest.fixture
def triton_backend() -> Iterator[None]:
    """Force the Triton path of ``mcpmux.inference.kernels`` for one test."""
    if not triton_runs_here():
        pytest.skip("triton was imported before TRITON_INTERPRET=1; test_interpreter_subprocess runs this file")
    from mcpmux.inference.kernels import set_backend

    set_backend("triton")
    try:
        yield
    finally:
        set_backend(None)
