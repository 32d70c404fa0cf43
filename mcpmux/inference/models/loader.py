"""Load a model for the engine: a local Hugging Face folder, a ``.gguf`` file, or ``builtin:<name>``.

transformers reads the config, tokenizer, chat template and weights (dequantizing GGUF); the weights
are then handed to our own forward (:mod:`mcpmux.inference.models`) and the HF module is dropped, so
one copy stays in memory.

dtype ``auto`` on CPU means float32, whatever the checkpoint was saved in (float32 is what makes
greedy output equal HF's), except for the builtin models, which run in whichever of float32 and
bfloat16 this CPU multiplies faster (`linear.fastest_cpu_dtype`, measured at load: bfloat16 where
AMX or AVX512-BF16 makes it a third faster or more; their bfloat16 output against float32 is in
docs/perf.md). On CUDA it means the checkpoint's own half dtype (``torch_dtype`` in config.json) when
it has one, else bfloat16.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from mcpmux.inference.errors import ModelLoadError
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models import CausalLM, builtin
from mcpmux.inference.models.heap import freeze_after_first_load
from mcpmux.inference.models.linear import fastest_cpu_dtype
from mcpmux.inference.models.registry import architecture_of, build_causal_lm

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("auto", "cpu", "cuda")


@dataclass(slots=True)
class LoadedModel:
    """A model ready to serve: our forward module, its tokenizer, and the shapes the engine sizes caches by."""

    name: str
    model: CausalLM
    tokenizer: PreTrainedTokenizerBase
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position: int
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: frozenset[int]

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of a plain prompt, special tokens included exactly as ``tokenizer(prompt)`` adds them."""
        return list(self.tokenizer(prompt)["input_ids"])

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` rendered by the model's chat template, ready for the assistant's reply."""
        if not self.tokenizer.chat_template:
            raise ModelLoadError(
                f"model {self.name!r} has no chat template in its tokenizer, so it cannot take chat "
                "messages; send a plain prompt instead, or use an instruct/chat model"
            )
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # The template already wrote the special tokens; adding them again would double a BOS.
        return list(self.tokenizer(str(text), add_special_tokens=False)["input_ids"])


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; ``cuda``/``cuda:N`` only where torch sees a GPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {device!r} requested but this torch sees no CUDA GPU "
                f"(torch {torch.__version__}); use device 'cpu' or 'auto'"
            )
        return torch.device(device)
    raise ModelLoadError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)} (or cuda:N)")


def resolve_dtype(dtype: str, config: Any, device: torch.device, *, builtin: bool = False) -> torch.dtype:
    """The weights' dtype for ``dtype`` (``auto`` is explained in the module docstring; `builtin`: a builtin model)."""
    if dtype in DTYPES:
        return DTYPES[dtype]
    if dtype != "auto":
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}")
    if device.type != "cuda":
        return fastest_cpu_dtype() if builtin else torch.float32
    saved = getattr(config, "dtype", None)
    if isinstance(saved, str):
        saved = DTYPES.get(saved)
    return saved if saved in (torch.float16, torch.bfloat16) else torch.bfloat16


@dataclass(slots=True)
class _Source:
    name: str
    folder: Path
    gguf_file: str | None


def _locate(spec: str) -> _Source:
    if spec.startswith(builtin.PREFIX):
        name = spec.removeprefix(builtin.PREFIX)
        return _Source(name, builtin.ensure_converted(name), None)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model path {str(path)!r} does not exist; pass a Hugging Face model folder, a .gguf file, "
            f"or one of {', '.join(builtin.builtin_names())}"
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"model file {str(path)!r} is not a .gguf file; pass a .gguf file or a folder")
        return _Source(path.stem, path.parent, path.name)
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"model folder {str(path)!r} has no config.json; point at a Hugging Face model folder "
            "(config.json, *.safetensors, tokenizer files)"
        )
    return _Source(path.name, path, None)


@contextmanager
def quiet_hf_progress() -> Iterator[None]:
    """Let transformers draw its progress bars on a terminal only, restoring the setting afterwards."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    if not builtin.stderr_is_terminal():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _eos_ids(hf_model: Any, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    # generate() stops on the generation config's ids; the tokenizer's eos is added for checkpoints
    # whose generation config forgot it.
    ids: set[int] = set()
    for value in (hf_model.generation_config.eos_token_id, hf_model.config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    return frozenset(ids)


def load_model(spec: str, dtype: str = "auto", device: str = "auto") -> LoadedModel:
    """Load ``spec`` (model folder, ``.gguf`` file or ``builtin:<name>``) for serving on ``device``."""
    torch_device = resolve_device(device)
    source = _locate(spec)
    where = str(source.folder / source.gguf_file) if source.gguf_file else str(source.folder)
    if source.gguf_file is None:
        # Checked on the raw JSON first: transformers cannot even parse configs of architectures it
        # lacks, and its error would not say what mcpmux can serve instead.
        architecture_of(SimpleNamespace(**json.loads((source.folder / "config.json").read_text())), where)
    with quiet_hf_progress():
        config = AutoConfig.from_pretrained(source.folder, gguf_file=source.gguf_file)
        architecture_of(config, where)
        is_builtin = spec.startswith(builtin.PREFIX)
        fused_dtype = dtype in ("auto", "float32", "bfloat16")
        if torch_device.type == "cpu" and fused_dtype and cpu_fused.wanted(builtin=is_builtin):
            # Built (or found built) in the background from here on; the weights are laid out for them.
            cpu_fused.enable()
        torch_dtype = resolve_dtype(dtype, config, torch_device, builtin=is_builtin)
        try:
            tokenizer = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{where}: could not load its tokenizer ({exc})") from exc
        hf_model = AutoModelForCausalLM.from_pretrained(
            source.folder,
            gguf_file=source.gguf_file,
            dtype=torch_dtype,
            device_map={"": torch_device} if torch_device.type == "cuda" else None,
        )
    eos = _eos_ids(hf_model, tokenizer)
    model = build_causal_lm(hf_model, where)
    del hf_model
    log.info(
        "loaded %s from %s: %s on %s, context %d", source.name, where, torch_dtype, torch_device, model.max_position
    )
    loaded = LoadedModel(
        name=source.name,
        model=model,
        tokenizer=tokenizer,
        num_layers=model.num_layers,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        vocab_size=model.vocab_size,
        max_position=model.max_position,
        dtype=torch_dtype,
        device=torch_device,
        eos_token_ids=eos,
    )
    freeze_after_first_load()  # the imports and this model out of full collections (`heap`)
    return loaded
