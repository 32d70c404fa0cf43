"""The torch reference proven against independent implementations: dense SDPA and transformers' Llama."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from mcpmux.inference.kernels import reference
from tests.inference.kernels.paged import MIXED_SPECS, PagedBatch, dense_attention, make_paged_batch


def _reference(batch: PagedBatch) -> torch.Tensor:
    out = torch.full_like(batch.q, float("nan"))
    result = reference.paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        batch.scale,
        out=out,
    )
    assert result is out
    return result


@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("block_size", [4, 8])
def test_reference_attention_matches_dense_sdpa(group: int, block_size: int) -> None:
    batch = make_paged_batch(MIXED_SPECS, 2 * group, 2, 16, block_size)
    torch.testing.assert_close(_reference(batch).double(), dense_attention(batch), atol=1e-5, rtol=1e-5)


def test_reference_attention_fp16_softmax_in_fp32() -> None:
    batch = make_paged_batch(MIXED_SPECS, 4, 1, 32, 4, dtype=torch.float16)
    out = _reference(batch)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), dense_attention(batch), atol=2e-3, rtol=2e-3)


@settings(max_examples=25, deadline=None)
@given(
    specs=st.lists(
        st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))), min_size=1, max_size=5
    ),
    group=st.sampled_from([1, 2, 3, 4]),
    block_size=st.sampled_from([1, 4, 16]),
)
def test_reference_attention_any_ragged_batch(specs: list[tuple[int, int]], group: int, block_size: int) -> None:
    batch = make_paged_batch(specs, group, 1, 8, block_size)
    torch.testing.assert_close(_reference(batch).double(), dense_attention(batch), atol=1e-5, rtol=1e-5)


def test_reference_write_kv_places_rows_and_skips_negative_slots() -> None:
    key = torch.randn(5, 2, 8)
    value = torch.randn(5, 2, 8)
    k_cache = torch.full((4, 4, 2, 8), float("nan"))
    v_cache = torch.full((4, 4, 2, 8), float("nan"))
    slots = torch.tensor([13, -1, 0, 7, -1])
    reference.write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache[3, 1], key[0])
    assert torch.equal(k_cache[0, 0], key[2])
    assert torch.equal(v_cache[1, 3], value[3])
    assert int((~k_cache.isnan()).all(-1).all(-1).sum()) == 3  # exactly three slots written
    assert int((~v_cache.isnan()).all(-1).all(-1).sum()) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_rms_norm_is_llama_rms_norm(dtype: torch.dtype) -> None:
    norm = LlamaRMSNorm(48, eps=1e-6).to(dtype)
    norm.weight.data = torch.randn(48, dtype=dtype)
    x = torch.randn(6, 48, dtype=dtype)
    residual = torch.randn(6, 48, dtype=dtype)
    plain = reference.rms_norm(x, norm.weight, 1e-6)
    assert isinstance(plain, torch.Tensor)
    assert torch.equal(plain, norm(x))
    normed, h = reference.rms_norm(x, norm.weight, 1e-6, residual)
    assert torch.equal(h, residual + x)
    assert torch.equal(normed, norm(residual + x))


def _llama_cos_sin_cache(head_dim: int, max_position: int) -> tuple[LlamaRotaryEmbedding, torch.Tensor]:
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position,
    )
    rope = LlamaRotaryEmbedding(config)
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * rope.inv_freq[None, :]
    return rope, torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_rotary_is_hf_apply_rotary_pos_emb(dtype: torch.dtype) -> None:
    rope, cache = _llama_cos_sin_cache(16, 256)
    positions = torch.randint(0, 256, (9,))
    q = torch.randn(9, 4, 16, dtype=dtype)
    k = torch.randn(9, 2, 16, dtype=dtype)
    cos, sin = rope(q, positions[None])
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_ref, k_ref = reference.rotary_embedding(positions, q, k, cache)
    assert torch.equal(q_ref, q_hf[0].transpose(0, 1))
    assert torch.equal(k_ref, k_hf[0].transpose(0, 1))
