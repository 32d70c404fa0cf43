"""The CPU layouts of the model's matrix products give F.linear's results: to rounding where they
reorder the sums (few rows), bit for bit where they only slice them (the sliced head, prefill)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch.nn import functional as F

from mcpmux.inference.errors import InvalidSettingError
from mcpmux.inference.models.linear import (
    MATMUL_ENV,
    SKINNY_HEAD_ROWS,
    SKINNY_ROWS,
    VOCAB_SLICE,
    _decided,
    linear,
    prepare,
    vocab_linear,
)


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_products_match_f_linear_at_every_row_count() -> None:
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(160, 96, generator=gen), torch.randn(160, generator=gen)
    for rows in (1, 2, 5, 64, SKINNY_ROWS):
        x = torch.randn(rows, 96, generator=gen)
        got = linear(x, weight)
        assert got.is_contiguous()  # Triton kernels downstream need contiguous rows
        assert _close(got, F.linear(x, weight))
        assert _close(linear(x, weight, bias), F.linear(x, weight, bias))
        # A transposed input gives the same (MKL would take its transpose as a plain operand).
        x_t = x.t().contiguous().t()
        assert _close(linear(x_t, weight, bias), F.linear(x, weight, bias))
    prefill = torch.randn(SKINNY_ROWS + 1, 96, generator=gen)
    assert torch.equal(linear(prefill, weight, bias), F.linear(prefill, weight, bias))


def test_output_head_matches_f_linear_and_is_contiguous() -> None:
    gen = torch.Generator().manual_seed(1)
    vocab = 2 * VOCAB_SLICE + 123  # a ragged last slice
    weight = torch.randn(vocab, 96, generator=gen)
    for rows in (1, SKINNY_HEAD_ROWS):
        x = torch.randn(rows, 96, generator=gen)
        got = vocab_linear(x, weight)
        assert got.is_contiguous()
        assert _close(got, F.linear(x, weight))
    for rows in (SKINNY_HEAD_ROWS + 1, 64):  # sliced: every logit is the same dot product
        x = torch.randn(rows, 96, generator=gen)
        got = vocab_linear(x, weight)
        assert got.is_contiguous()
        assert torch.equal(got, F.linear(x, weight))


@pytest.fixture
def matmul_library(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Forces `MCPMUX_CPU_MATMUL` for `prepare` (its choice is made once per process, so it is reset)."""

    def force(choice: str) -> None:
        monkeypatch.setenv(MATMUL_ENV, choice)
        _decided.clear()

    yield force
    _decided.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prepared_weights_give_f_linear_results_with_either_library(
    matmul_library: Callable[[str], None], dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(160, 96, generator=gen).to(dtype), torch.randn(160, generator=gen).to(dtype)
    head = torch.randn(VOCAB_SLICE + 7, 96, generator=gen).to(dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for choice in ("blas", "onednn"):
        matmul_library(choice)
        prepared, prepared_head = prepare(weight), prepare(head)
        if choice == "blas":
            assert prepared is weight
        elif dtype == torch.float32:  # oneDNN has fp32 products on every CPU torch builds it for
            assert prepared.is_mkldnn
            assert prepared_head.is_mkldnn
        for rows in (0, 1, 16, SKINNY_ROWS + 1):
            x = torch.randn(rows, 96, generator=gen).to(dtype)
            want = F.linear(x, weight, bias)
            torch.testing.assert_close(linear(x, prepared, bias), want, rtol=tolerance, atol=tolerance)
            x_t = x.t().contiguous().t()  # a transposed input gives the same
            torch.testing.assert_close(linear(x_t, prepared, bias), want, rtol=tolerance, atol=tolerance)
            got = vocab_linear(x, prepared_head)
            assert got.is_contiguous()
            torch.testing.assert_close(got, F.linear(x, head), rtol=tolerance, atol=tolerance)


def test_an_unknown_library_is_named_in_the_error(matmul_library: Callable[[str], None]) -> None:
    matmul_library("openblas")
    with pytest.raises(InvalidSettingError, match="MCPMUX_CPU_MATMUL='openblas': expected onednn, blas or auto"):
        prepare(torch.ones(2, 2))
