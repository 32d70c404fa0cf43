"""Session-scoped tiny model folders shared by every inference test (built once, ~0.1 s each).

The fixtures import the model code when first used, not here: importing transformers' model classes
imports triton, and `kernels/conftest.py` must set ``TRITON_INTERPRET`` before that happens when
``tests/inference/kernels`` runs alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """All three tiny architectures, by arch name: ``{"llama": Path, "qwen2": Path, "mistral": Path}``."""
    from tests.inference.tiny_models import TINY_ARCHS, build_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: build_tiny_model(arch, root / arch) for arch in TINY_ARCHS}


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dirs: dict[str, Path]) -> Path:
    """A tiny random Llama folder (tied embeddings)."""
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_model_dirs: dict[str, Path]) -> Path:
    """A tiny random Qwen2 folder (q/k/v bias, tied embeddings)."""
    return tiny_model_dirs["qwen2"]


@pytest.fixture(scope="session")
def tiny_mistral(tiny_model_dirs: dict[str, Path]) -> Path:
    """A tiny random Mistral folder (untied head, sliding window equal to the context)."""
    return tiny_model_dirs["mistral"]


@pytest.fixture(scope="session")
def smollm2_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh MCPMUX_CACHE_DIR holding builtin:smollm2-135m, converted once per session (~20 s, 1.2 GB peak).

    Tests that load ``builtin:smollm2-135m`` set ``MCPMUX_CACHE_DIR`` to this folder.
    """
    from mcpmux.inference.models import builtin

    cache = tmp_path_factory.mktemp("mcpmux_models")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MCPMUX_CACHE_DIR", str(cache))
        builtin.ensure_converted("smollm2-135m")
    return cache


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache_dir: Path) -> Path:
    """The converted SmolLM2-135M-Instruct folder (float32 safetensors, tokenizer, chat template)."""
    (folder,) = (p for p in smollm2_cache_dir.iterdir() if p.name.startswith("smollm2-135m"))
    return folder
