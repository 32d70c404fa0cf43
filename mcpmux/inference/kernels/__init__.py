"""Attention, KV-write, norm and rotary kernels: Triton on CUDA, torch reference on CPU.

Every public function here dispatches per call (see :mod:`mcpmux.inference.kernels.dispatch`): Triton kernels
when :func:`backend` says ``"triton"``, the torch reference in :mod:`mcpmux.inference.kernels.reference`
otherwise. Both follow the same contract, documented on each function. The Triton modules are
imported on first use, so CPU-only processes never import triton.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from mcpmux.inference.kernels import cpu_fused, reference
from mcpmux.inference.kernels.dispatch import backend, set_backend

__all__ = [
    "DIRECT_PAIRS",
    "argmax",
    "backend",
    "direct_pairs",
    "fused_ops",
    "paged_attention",
    "rms_norm",
    "rotary_embedding",
    "sample_rows",
    "set_backend",
    "silu_and_mul",
    "top_k",
    "write_kv",
]

_FUSED_DTYPES = (torch.float32, torch.bfloat16)

DIRECT_PAIRS = 256 * 256
"""A prefill or extend of q_len query tokens over seq_len keys whose q_len * seq_len is at most this is
attended by the fused CPU kernel, row by row; a longer one by SDPA, whose blocked products win there
(2 cores of an AMX Xeon, 2 threads: the kernel 2-6x faster for a 512-token step of 16-128-token
prompts, even with SDPA for one 256-token prompt, 1.1-1.4x slower at 384-512, 1.7-2.1x at 1,024).
Where `direct_pairs` says so the kernel attends every row: see there."""

_EVERY_PAIR = 2**62


def direct_pairs(dtype: torch.dtype) -> int:
    """The largest q_len * seq_len the fused kernel attends in `dtype`: every one in bfloat16 under batch invariance,
    so that a row's arithmetic is the same whether it is a decode row or part of a prefill of any length, and in
    float32 where its products run on the packed layout (AVX-512: the whole prefill in the kernels' one call was
    1.5x as fast as SDPA's layer by layer for a 550-token prompt, 1.4x at 2,000, 1.1x at 4,000 on a Zen 5);
    else `DIRECT_PAIRS`."""
    if dtype == torch.bfloat16 and cpu_fused.batch_invariant():
        return _EVERY_PAIR
    if dtype == torch.float32 and cpu_fused.packed_f32():
        return _EVERY_PAIR
    return DIRECT_PAIRS


def fused_ops(tensor: Tensor) -> ModuleType | None:
    """The fused CPU kernels where they run `tensor` (float32 or bfloat16, on CPU, torch backend, built), else None."""
    if tensor.dtype not in _FUSED_DTYPES or tensor.device.type != "cpu" or backend(tensor) != "torch":
        return None
    return cpu_fused.ops()


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write this step's K/V into the paged caches, in place.

    ``key``/``value``: [T, num_kv_heads, head_dim]; caches: [num_blocks, block_size, num_kv_heads,
    head_dim]; ``slot_mapping``: [T] int64, ``block_id * block_size + offset``, negative = skip.
    """
    if backend(key) == "triton":
        from mcpmux.inference.kernels.triton_kv import write_kv as triton_write_kv

        triton_write_kv(key, value, k_cache, v_cache, slot_mapping)
        return
    fused = fused_ops(key)
    same_dtype = key.dtype == value.dtype == k_cache.dtype == v_cache.dtype
    if fused is not None and same_dtype and _rows_contiguous(key, value):
        fused.write_kv_(key, value, k_cache, v_cache, slot_mapping)
    else:
        reference.write_kv(key, value, k_cache, v_cache, slot_mapping)


def _rows_contiguous(*tensors: Tensor) -> bool:
    """Whether each [T, H, D] tensor's heads lie one after another within a row (a row slice of a product)."""
    return all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in tensors)


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    out: Tensor | None = None,
) -> Tensor:
    """Causal attention over a ragged batch of decode and prefill/extend rows, through block tables.

    ``q``: [T, num_heads, head_dim] with num_heads a multiple of num_kv_heads (GQA/MQA).
    ``block_tables``: [S, max_blocks] int32; ``seq_lens``: [S] int32, context length including this
    step's tokens; ``query_start_loc``: [S+1] int32 cumulative query lengths. Sequence i's queries are
    its last ``q_len_i`` positions and attend causally to all of its earlier positions, whose K/V
    :func:`write_kv` has already stored. ``max_query_len``/``max_seq_len`` are the batch's largest
    query and context lengths (host ints, so no device sync): the Triton path sizes its grid and its
    split-KV ranges from them, so they must not be smaller than the true values. Returns
    [T, num_heads, head_dim] in q's dtype (into ``out`` when given); the softmax runs in fp32.
    """
    if backend(q) == "triton":
        from mcpmux.inference.kernels.triton_attention import paged_attention as triton_attention

        return triton_attention(
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            max_query_len,
            max_seq_len,
            out,
        )
    fused = fused_ops(q)
    if fused is None or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype or q.stride(2) != 1:
        return reference.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out)
    # Decode rows and short prefills read the cache in place; longer prefills take the reference's SDPA.
    if out is None:
        out = torch.empty_like(q)
    step = (block_tables, seq_lens, query_start_loc)
    pairs = direct_pairs(q.dtype)
    fused.paged_attention_(q, k_cache, v_cache, *step, scale, pairs, out)
    if max_query_len * max_seq_len > pairs:
        reference.paged_attention(q, k_cache, v_cache, *step, scale, out, longer_than=pairs)
    return out


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """RMSNorm exactly as transformers' LlamaRMSNorm; with ``residual``, fused add first.

    Without residual: ``weight * normalize(x)``. With residual: ``h = x + residual`` and the result is
    ``(weight * normalize(h), h)``.
    """
    if backend(x) == "triton":
        from mcpmux.inference.kernels.triton_norm import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps, residual)
    fused = fused_ops(x)
    if (
        fused is not None
        and x.dim() == 2
        and x.stride(1) == 1
        and weight.dtype == x.dtype
        and (residual is None or (residual.stride(1) == 1 and residual.dtype == x.dtype))
    ):
        normed, h = fused.rms_norm(x, residual, weight, eps)
        return normed if residual is None else (normed, h)
    return reference.rms_norm(x, weight, eps, residual)


def rotary_embedding(positions: Tensor, q: Tensor, k: Tensor, cos_sin_cache: Tensor) -> tuple[Tensor, Tensor]:
    """NeoX/HF-Llama rotary embedding of q [T, H, D] and k [T, Hkv, D] at ``positions`` [T] int64.

    ``cos_sin_cache``: [max_position, rotary_dim] fp32, cos in the first half of the columns, sin in
    the second. Returns the rotated (q, k); the Triton path and the fused CPU kernels rotate q and k in place.
    """
    if backend(q) == "triton":
        from mcpmux.inference.kernels.triton_rotary import rotary_embedding as triton_rotary

        return triton_rotary(positions, q, k, cos_sin_cache)
    fused = fused_ops(q)
    if fused is not None and k.dtype == q.dtype and q.stride(2) == 1 and k.stride(2) == 1:
        fused.rotary_(positions, q, k, cos_sin_cache)
        return q, k
    return reference.rotary_embedding(positions, q, k, cos_sin_cache)


def silu_and_mul(gate_up: Tensor) -> Tensor:
    """``silu(gate) * up`` for ``gate_up`` [T, 2 * I] = [gate | up]: the SwiGLU MLP's activation, [T, I]."""
    fused = fused_ops(gate_up)
    if fused is not None and gate_up.dim() == 2 and gate_up.stride(1) == 1:
        return fused.silu_and_mul(gate_up)
    return reference.silu_and_mul(gate_up)


def top_k(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``torch.topk(values, k, dim=-1)`` for float32 ``values`` [N, vocab]: each row's k largest values, largest
    first, and their indices (equal values in the order of their indices where the fused kernels run)."""
    fused = fused_ops(values)
    if fused is not None and values.dtype == torch.float32 and values.dim() == 2 and values.stride(1) == 1:
        top, where = fused.top_k_rows(values, k)
        return top, where
    top, where = torch.topk(values, k, dim=-1)
    return top, where


def sample_rows(logits: Tensor, rows: list[int], temperatures: list[float], generators: list[torch.Generator]
                ) -> list[int] | None:  # fmt: skip
    """A token for each of `rows` of float32 `logits` [N, vocab] from softmax(row / temperature), drawn by one
    float64 uniform number from the row's generator against the running sum; None (nothing drawn) where the
    fused kernels do not run, and the caller samples with torch."""
    fused = fused_ops(logits)
    if fused is None or logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        return None
    draws = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])
    picks = fused.sample_rows(logits, torch.tensor(rows, dtype=torch.int64), torch.tensor(temperatures), draws)
    return [int(t) for t in picks.tolist()]


def argmax(logits: Tensor) -> Tensor:
    """``torch.argmax(logits, dim=-1)`` for float32 ``logits`` [N, vocab]: each row's first largest value's index."""
    fused = fused_ops(logits)
    if fused is not None and logits.dtype == torch.float32 and logits.dim() == 2 and logits.stride(1) == 1:
        return fused.argmax_rows(logits)
    return torch.argmax(logits, dim=-1)
