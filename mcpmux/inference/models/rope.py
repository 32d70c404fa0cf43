"""Rotary position embeddings as the checkpoint's config specifies them, scaling types included.

The inverse frequencies and the attention scaling come from transformers' own RoPE init functions
(``ROPE_INIT_FUNCTIONS``), so a scaled model rotates exactly as it does under HF. We then precompute
one cos/sin row per position, laid out as :func:`mcpmux.inference.kernels.rotary_embedding` reads it.

Two scaling types change their frequencies with the length of the batch HF happens to run
(``dynamic`` NTK grows them past ``max_position_embeddings``; ``longrope`` switches to its long factors
once any sequence passes ``original_max_position_embeddings``). A paged cache keeps keys rotated at
earlier steps, so such a switch cannot be reproduced: we serve those models only up to the length
where their frequencies are fixed, which is exactly where they equal HF.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


def rope_parameters(config: Any) -> dict[str, Any]:
    """The config's RoPE parameters in transformers' standard form (``rope_type``, ``rope_theta``, ...)."""
    config.standardize_rope_params()
    params: dict[str, Any] = dict(config.rope_parameters or {})
    params.setdefault("rope_type", "default")
    return params


def rope_position_limit(config: Any) -> int:
    """The longest context this config's RoPE is position-independent of the batch for (see module doc)."""
    params = rope_parameters(config)
    limit = int(config.max_position_embeddings)
    if params["rope_type"] == "longrope":
        limit = min(limit, int(params.get("original_max_position_embeddings", limit)))
    return limit


def head_dim_of(config: Any) -> int:
    """Per-head width: the config's explicit ``head_dim`` when set, else hidden / heads (as HF does)."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _inverse_frequencies(config: Any, device: torch.device) -> tuple[torch.Tensor, float]:
    params = rope_parameters(config)
    rope_type = params["rope_type"]
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"RoPE scaling type {rope_type!r} is not supported; supported types: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type != "default":
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, device)
        return inv_freq.to(device=device, dtype=torch.float32), float(scaling)
    # Same expression as the HF Llama/Qwen2/Mistral default init, so the values are bit-identical.
    dim = head_dim_of(config)
    exponents = torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim
    return 1.0 / (params["rope_theta"] ** exponents), 1.0


def build_cos_sin_cache(config: Any, max_position: int, device: torch.device) -> torch.Tensor:
    """[max_position, rotary_dim] float32: ``cos`` in the first half of the columns, ``sin`` in the second.

    Both already multiplied by the scaling type's attention factor, as HF's rotary module does.
    """
    inv_freq, attention_scaling = _inverse_frequencies(config, device)
    positions = torch.arange(max_position, device=device, dtype=torch.int64).float()
    freqs = positions[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)
