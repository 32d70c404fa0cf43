"""Triton KV write, fused RMSNorm and rotary embedding against the torch reference, in the interpreter."""

from __future__ import annotations

import pytest
import torch

import mcpmux.inference.kernels as kernels
from mcpmux.inference.kernels import reference
from tests.inference.kernels.conftest import DEVICE

pytestmark = pytest.mark.usefixtures("triton_backend")

DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_scatters_by_slot_and_skips_negative(dtype: torch.dtype) -> None:
    num_blocks, block_size, heads, dim = 6, 4, 3, 16
    # A fused kv projection sliced in two: key and value are strided views, as the model passes them.
    kv = torch.randn(7, 2, heads, dim, dtype=dtype, device=DEVICE)
    key, value = kv[:, 0], kv[:, 1]
    slots = torch.tensor([0, 5, -1, 23, 9, 10, -1], device=DEVICE)
    k_cache = torch.full((num_blocks, block_size, heads, dim), float("nan"), dtype=dtype, device=DEVICE)
    v_cache = torch.full_like(k_cache, float("nan"))
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    kernels.write_kv(key, value, k_cache, v_cache, slots)
    reference.write_kv(key, value, expected_k, expected_v, slots)
    assert torch.equal(k_cache.nan_to_num(7.0), expected_k.nan_to_num(7.0))
    assert torch.equal(v_cache.nan_to_num(7.0), expected_v.nan_to_num(7.0))
    assert torch.equal(k_cache[5, 3], key[3])  # slot 23 = block 5, offset 3
    assert int((~k_cache.isnan()).all(-1).all(-1).sum()) == 5  # the two skipped tokens wrote nothing


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 48])
def test_rms_norm_matches_reference(dtype: torch.dtype, hidden: int) -> None:
    x = torch.randn(5, hidden, dtype=dtype, device=DEVICE) * 3
    weight = torch.randn(hidden, dtype=dtype, device=DEVICE)
    out = kernels.rms_norm(x, weight, 1e-6)
    assert isinstance(out, torch.Tensor)
    expected = reference.rms_norm(x, weight, 1e-6)
    assert isinstance(expected, torch.Tensor)
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_residual_add_and_norm(dtype: torch.dtype) -> None:
    x = torch.randn(3, 4, 32, dtype=dtype, device=DEVICE)  # any leading shape
    residual = torch.randn(3, 4, 32, dtype=dtype, device=DEVICE)
    weight = torch.randn(32, dtype=dtype, device=DEVICE)
    result = kernels.rms_norm(x, weight, 1e-5, residual)
    expected = reference.rms_norm(x, weight, 1e-5, residual)
    assert isinstance(result, tuple)
    assert isinstance(expected, tuple)
    normed, h = result
    assert h.shape == x.shape
    assert normed.shape == x.shape
    assert torch.equal(h, x + residual)  # the add rounds in the activation dtype, like the model's
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(normed, expected[0], atol=tol, rtol=tol)


def _cos_sin_cache(rotary_dim: int, max_position: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


def _per_token(actual: torch.Tensor, expected: torch.Tensor) -> list[float]:
    return (actual.float() - expected.float()).abs().amax(dim=(1, 2)).tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_reference_in_place_on_qkv_views(dtype: torch.dtype) -> None:
    tokens, heads, kv_heads, dim = 6, 6, 2, 16
    positions = torch.tensor([0, 1, 2, 3, 200, 511], device=DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype, device=DEVICE)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v_before = qkv[:, (heads + kv_heads) * dim :].clone()
    cache = _cos_sin_cache(dim, 512)
    expected_q, expected_k = reference.rotary_embedding(positions, q.clone(), k.clone(), cache)
    out_q, out_k = kernels.rotary_embedding(positions, q, k, cache)
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    # On a mismatch, the error per token: which positions (cos/sin rows) it came from.
    torch.testing.assert_close(
        out_q, expected_q, atol=tol, rtol=tol, msg=lambda m: f"{m}\nper token: {_per_token(out_q, expected_q)}"
    )
    torch.testing.assert_close(out_k, expected_k, atol=tol, rtol=tol)
    assert out_q.data_ptr() == q.data_ptr()  # rotated in place, inside the fused projection
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], v_before)  # v untouched


def test_partial_rotary_leaves_tail_features_alone() -> None:
    positions = torch.randint(0, 64, (4,), device=DEVICE)
    q = torch.randn(4, 2, 32, device=DEVICE)
    k = torch.randn(4, 1, 32, device=DEVICE)
    cache = _cos_sin_cache(16, 64)
    expected_q, expected_k = reference.rotary_embedding(positions, q.clone(), k.clone(), cache)
    tail = q[..., 16:].clone()
    out_q, out_k = kernels.rotary_embedding(positions, q, k, cache)
    torch.testing.assert_close(out_q, expected_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out_k, expected_k, atol=1e-6, rtol=1e-6)
    assert torch.equal(out_q[..., 16:], tail)


def test_bfloat16_norm_and_rotary() -> None:
    # The interpreter rounds bf16 by truncation (the GPU rounds to nearest), so allow two bf16 ulps.
    x = torch.randn(4, 32, dtype=torch.bfloat16, device=DEVICE)
    residual = torch.randn(4, 32, dtype=torch.bfloat16, device=DEVICE)
    weight = torch.randn(32, dtype=torch.bfloat16, device=DEVICE)
    normed, h = kernels.rms_norm(x, weight, 1e-6, residual)
    expected_normed, expected_h = reference.rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(h, expected_h, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(normed, expected_normed, atol=4e-2, rtol=2e-2)
    positions = torch.arange(4, device=DEVICE)
    q = torch.randn(4, 2, 16, dtype=torch.bfloat16, device=DEVICE)
    k = torch.randn(4, 1, 16, dtype=torch.bfloat16, device=DEVICE)
    expected_q, expected_k = reference.rotary_embedding(positions, q.clone(), k.clone(), _cos_sin_cache(16, 8))
    out_q, out_k = kernels.rotary_embedding(positions, q, k, _cos_sin_cache(16, 8))
    torch.testing.assert_close(out_q, expected_q, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out_k, expected_k, atol=2e-2, rtol=2e-2)
