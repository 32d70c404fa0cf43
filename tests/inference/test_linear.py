"""The CPU layouts of the model's matrix products give F.linear's results: to rounding where they
reorder the sums (few rows), bit for bit where they only slice them (the sliced head, prefill)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from mcpmux.inference.models.linear import SKINNY_HEAD_ROWS, SKINNY_ROWS, VOCAB_SLICE, linear, vocab_linear


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
