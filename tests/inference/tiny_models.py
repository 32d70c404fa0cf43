"""Tiny random Llama-family models saved as real Hugging Face folders, for fast exact tests.

Each folder holds what a downloaded model holds: ``config.json``, ``model.safetensors``,
``generation_config.json`` and a byte-level BPE tokenizer with a chat template and eos token.
Two layers, hidden 64, 4 query heads over 2 KV heads (GQA), fp32, fixed seed: building one takes
well under a second, and generation is deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY_ARCHS = ("llama", "qwen2", "mistral")

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# ChatML, as SmolLM2 and Qwen2 use: enough to exercise apply_chat_template end to end.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Continuous batching lets requests join and leave at every step.",
    "The capital of France is Paris; the capital of Italy is Rome.",
    "Hello, world! How are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "Caf\u00e9, na\u00efve, \u00fcber, \u65e5\u672c\u8a9e, emoji \U0001f600.",
]

# Small on purpose, but long enough for the engine's long-prompt, chunking and preemption tests.
MAX_POSITION = 1024
SEED = 1234
# Larger than HF's 0.02 so logits have clear winners: greedy tokens then do not hinge on
# float rounding, and random generations vary instead of repeating one token.
INIT_RANGE = 0.15


def build_tiny_tokenizer(vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on a few lines (any UTF-8 text round-trips)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=EOS, additional_special_tokens=[IM_START, IM_END]
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _config(arch: str, vocab_size: int, eos_ids: list[int], overrides: dict[str, Any]) -> Any:
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": MAX_POSITION,
        "rms_norm_eps": 1e-6,
        "initializer_range": INIT_RANGE,
        "eos_token_id": eos_ids[0],
        "pad_token_id": eos_ids[0],
        "bos_token_id": None,
        "dtype": "float32",
    }
    if arch == "llama":
        # SmolLM2-shaped: tied input and output embeddings.
        return LlamaConfig(**{**common, "tie_word_embeddings": True, **overrides})
    if arch == "qwen2":
        return Qwen2Config(**{**common, "tie_word_embeddings": True, "use_sliding_window": False, **overrides})
    if arch == "mistral":
        # Untied head; the window equals the context, so attention is exactly causal everywhere.
        return MistralConfig(**{**common, "tie_word_embeddings": False, "sliding_window": MAX_POSITION, **overrides})
    raise ValueError(f"unknown tiny arch {arch!r}; choose one of {', '.join(TINY_ARCHS)}")


_MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "mistral": MistralForCausalLM,
}


def _perturb_defaults(model: PreTrainedModel) -> None:
    """Move norm weights off 1 and biases off 0, so a forward that skips either one fails the tests."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * INIT_RANGE)
            elif name.endswith(".bias"):
                param.normal_(0.0, INIT_RANGE)


def build_tiny_model(arch: str, path: Path, *, overrides: dict[str, Any] | None = None) -> Path:
    """Build and save a tiny random ``arch`` model with its tokenizer into ``path``; return ``path``.

    ``overrides`` replaces config fields to test variants, e.g. ``{"rope_parameters": {"rope_type":
    "linear", "factor": 2.0, "rope_theta": 10000.0}}`` or ``{"head_dim": 32}``.
    """
    tokenizer = build_tiny_tokenizer()
    vocab = tokenizer.get_vocab()
    eos_ids = [vocab[EOS], vocab[IM_END]]
    config: PretrainedConfig = _config(arch, len(tokenizer), eos_ids, overrides or {})
    torch.manual_seed(SEED)
    model = _MODEL_CLASSES[arch](config).eval()
    _perturb_defaults(model)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=eos_ids[0], bos_token_id=None, do_sample=False
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
