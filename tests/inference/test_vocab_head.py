"""The CPU lm_head runs in vocab slices; every logit must equal the one-matmul result bit for bit."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from mcpmux.inference.models.llama import _VOCAB_SLICE, _vocab_linear


def test_sliced_head_equals_one_matmul_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 2 * _VOCAB_SLICE + 123  # a ragged last slice
    weight = torch.randn(vocab, 96, generator=gen)
    for rows in (1, 5, 64):
        x = torch.randn(rows, 96, generator=gen)
        got = _vocab_linear(x, weight)
        assert got.shape == (rows, vocab)
        assert torch.equal(got, F.linear(x, weight))
