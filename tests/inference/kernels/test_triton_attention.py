"""Triton paged attention against the torch reference (and dense SDPA), in the interpreter on CPU."""

from __future__ import annotations

import pytest
import torch

import mcpmux.inference.kernels as kernels
from mcpmux.inference.kernels import reference
from tests.inference.kernels.conftest import DEVICE
from tests.inference.kernels.paged import MIXED_SPECS, PagedBatch, dense_attention, make_paged_batch

pytestmark = pytest.mark.usefixtures("triton_backend")

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 2e-2}


def _triton(batch: PagedBatch, q: torch.Tensor | None = None, num_splits: int | None = None) -> torch.Tensor:
    q = batch.q if q is None else q
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    if num_splits is None:
        result = kernels.paged_attention(
            q,
            batch.k_cache,
            batch.v_cache,
            batch.block_tables,
            batch.seq_lens,
            batch.query_start_loc,
            batch.scale,
            batch.max_query_len,
            batch.max_seq_len,
            out=out,
        )
    else:
        from mcpmux.inference.kernels.triton_attention import paged_attention

        result = paged_attention(
            q,
            batch.k_cache,
            batch.v_cache,
            batch.block_tables,
            batch.seq_lens,
            batch.query_start_loc,
            batch.scale,
            batch.max_query_len,
            batch.max_seq_len,
            out=out,
            num_splits=num_splits,
        )
    assert result is out
    assert not out.isnan().any(), "some query rows were never written"
    return result


def _reference(batch: PagedBatch) -> torch.Tensor:
    return reference.paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        batch.scale,
    )


def _assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_mixed_decode_and_prefill_rows_in_one_launch(dtype: torch.dtype, group: int) -> None:
    batch = make_paged_batch(MIXED_SPECS, 2 * group, 2, 16, 4, dtype=dtype, device=DEVICE)
    _assert_matches(_triton(batch), _reference(batch), dtype)


@pytest.mark.parametrize(("head_dim", "block_size"), [(32, 8), (64, 16), (24, 4)])
def test_head_sizes_and_block_sizes(head_dim: int, block_size: int) -> None:
    specs = [(1, 1), (block_size, block_size), (3 * block_size + 1, 2), (2 * block_size - 1, 1)]
    batch = make_paged_batch(specs, 4, 2, head_dim, block_size, device=DEVICE)
    out = _triton(batch)
    _assert_matches(out, _reference(batch), torch.float32)
    torch.testing.assert_close(out.double(), dense_attention(batch), atol=1e-5, rtol=1e-5)


def test_decode_only_batch_with_mqa() -> None:
    specs = [(1, 1), (4, 1), (5, 1), (37, 1), (64, 1)]
    batch = make_paged_batch(specs, 8, 1, 16, 4, device=DEVICE)
    _assert_matches(_triton(batch), _reference(batch), torch.float32)


def test_long_prefill_spans_several_query_blocks() -> None:
    # 70 query tokens x group 4 = 280 rows: several 64-row programs, the diagonal tile in each.
    batch = make_paged_batch([(90, 70), (3, 1)], 4, 1, 16, 8, dtype=torch.float16, device=DEVICE)
    _assert_matches(_triton(batch), _reference(batch), torch.float16)


@pytest.mark.parametrize(("dtype", "num_splits"), [(torch.float32, 2), (torch.float32, 3), (torch.float16, 4)])
def test_split_kv_decode_matches_single_pass(dtype: torch.dtype, num_splits: int) -> None:
    # Contexts long enough that every split owns keys, one shorter than a split, and a length-1 row.
    specs = [(300, 1), (129, 1), (1, 1), (40, 1)]
    batch = make_paged_batch(specs, 6, 2, 16, 16, dtype=dtype, device=DEVICE)
    _assert_matches(_triton(batch, num_splits=num_splits), _reference(batch), dtype)


def test_split_kv_also_correct_for_prefill_rows() -> None:
    batch = make_paged_batch([(150, 20), (70, 1)], 3, 1, 16, 8, device=DEVICE)
    _assert_matches(_triton(batch, num_splits=2), _reference(batch), torch.float32)


def test_non_contiguous_query_view() -> None:
    # The model hands attention a slice of its fused qkv projection: token stride > heads * dim.
    batch = make_paged_batch(MIXED_SPECS, 6, 2, 16, 4, device=DEVICE)
    qkv = torch.randn(batch.q.shape[0], 10 * 16, device=DEVICE)
    q = qkv[:, : 6 * 16].view(-1, 6, 16)
    assert not q.is_contiguous()
    batch.q = q
    _assert_matches(_triton(batch, q=q), _reference(batch), torch.float32)


def test_bfloat16_inputs() -> None:
    # The interpreter has no bf16 arithmetic: the kernel upcasts there (exact on GPU); it also rounds
    # bf16 by truncation, hence the looser bound than the GPU check in benchmarks/kernels_gpu.py.
    batch = make_paged_batch(MIXED_SPECS, 4, 1, 16, 4, dtype=torch.bfloat16, device=DEVICE)
    out = _triton(batch)
    assert out.dtype == torch.bfloat16
    _assert_matches(out, _reference(batch), torch.bfloat16)


def test_write_then_attend_equals_dense_attention() -> None:
    # The engine's order of operations: write this step's K/V through the slot mapping, then attend.
    block_size, num_kv_heads, head_dim = 4, 2, 16
    batch = make_paged_batch(MIXED_SPECS, 6, num_kv_heads, head_dim, block_size, device=DEVICE)
    starts = batch.query_start_loc.tolist()
    keys, values, slots = [], [], []
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        pos = torch.arange(seq_len - q_len, seq_len, device=DEVICE)
        slots.append(batch.block_tables[i, pos // block_size].long() * block_size + pos % block_size)
        keys.append(batch.dense_k[i][seq_len - q_len :])
        values.append(batch.dense_v[i][seq_len - q_len :])
        # Poison this step's slots so only write_kv can make the result right.
        batch.k_cache.view(-1, num_kv_heads, head_dim)[slots[-1]] = float("nan")
        batch.v_cache.view(-1, num_kv_heads, head_dim)[slots[-1]] = float("nan")
    kernels.write_kv(torch.cat(keys), torch.cat(values), batch.k_cache, batch.v_cache, torch.cat(slots))
    torch.testing.assert_close(_triton(batch).double(), dense_attention(batch), atol=1e-5, rtol=1e-5)
