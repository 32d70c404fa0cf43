"""Which checkpoint architectures we serve, and how a loaded transformers model becomes our module."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from mcpmux.inference.errors import UnsupportedModelError
from mcpmux.inference.models.llama import LlamaCausalLM
from mcpmux.inference.models.rope import rope_position_limit

log = logging.getLogger(__name__)

# transformers' architecture names (config.json "architectures") that map onto our Llama-family forward.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
# A config read from GGUF metadata names only its model_type.
_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


def architecture_of(config: Any, source: str) -> str:
    """The checkpoint's architecture name, checked against :data:`SUPPORTED_ARCHITECTURES`."""
    names = list(getattr(config, "architectures", None) or [])
    if not names and getattr(config, "model_type", None) in _BY_MODEL_TYPE:
        names = [_BY_MODEL_TYPE[config.model_type]]
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    found = ", ".join(names) if names else f"none (model_type {getattr(config, 'model_type', '?')!r})"
    raise UnsupportedModelError(
        f"{source}: architecture {found} is not supported; mcpmux serves {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def sliding_window_of(config: Any) -> int | None:
    """The attention window if any layer uses one (Mistral; Qwen2 with use_sliding_window), else None."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return int(window)


def context_limit(config: Any) -> int:
    """Longest context we compute exactly as the model defines it.

    A sliding window shorter than the position range would make attention forget the oldest
    tokens; our paged attention always attends to the whole context, so rather than compute
    something the model never saw, we stop at the window.
    """
    limit = rope_position_limit(config)
    window = sliding_window_of(config)
    if window is not None and window < limit:
        log.warning(
            "sliding window %d is shorter than the %d positions the model supports; contexts are limited to %d tokens",
            window,
            limit,
            window,
        )
        limit = window
    return limit


def build_causal_lm(hf_model: nn.Module, source: str) -> LlamaCausalLM:
    """Our forward over ``hf_model``'s weights, which it takes over (``hf_model`` is emptied).

    The parameters move, they are not copied: after this returns, the caller should drop ``hf_model``.
    """
    config = hf_model.config
    architecture_of(config, source)
    weights = dict(hf_model.state_dict())
    # Drop the HF module's own references so each tensor is freed as soon as our layer has taken it.
    for module in list(hf_model.children()):
        module.to_empty(device="meta")
    model = LlamaCausalLM(config, weights, context_limit(config)).eval()
    if weights:
        log.warning("%s: ignored weights our forward does not use: %s", source, ", ".join(sorted(weights)))
    return model
