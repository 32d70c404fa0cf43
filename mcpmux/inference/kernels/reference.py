"""Torch reference kernels: the CPU production path and the oracle every Triton kernel is tested against.

Attention gathers each sequence's K/V through its block table and runs
``torch.nn.functional.scaled_dot_product_attention`` on it in fp32 (the fused CPU kernel; GQA by a
grouped view or ``enable_gqa``). All decode rows of a step share one padded, masked pass;
prefill/extend rows go one sequence at a time, never one token at a time.

Every layer of a step calls these kernels with the same step tensors (``block_tables``,
``seq_lens``, ``query_start_loc``, ``positions``, ``slot_mapping``), so what depends only on them
(host-side lengths, gather indices, masks, rotary cos/sin, the kept KV slots) is built once, by the
first layer, and reused by the rest: a per-thread plan keyed on the identity of those tensors. The
plan holds them, so a later step's new tensors can never be mistaken for them; the engine never
modifies a step's tensors in place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor
from torch.nn import functional as F

T = TypeVar("T")

_plans = threading.local()


def _planned(kind: str, keys: tuple[object, ...], build: Callable[[], T]) -> T:
    """``build()``'s result, cached per thread for as long as the same ``keys`` objects come back."""
    cache: dict[str, tuple[tuple[object, ...], object]] | None = getattr(_plans, "cache", None)
    if cache is None:
        cache = _plans.cache = {}
    hit = cache.get(kind)
    if hit is not None and len(hit[0]) == len(keys) and all(a is b for a, b in zip(hit[0], keys, strict=True)):
        return hit[1]  # type: ignore[return-value]
    value = build()
    cache[kind] = (keys, value)
    return value


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Scatter ``key``/``value`` [T, Hkv, D] into the paged caches at ``slot_mapping`` (< 0: skip)."""
    slots, keep = _planned("kv", (slot_mapping,), lambda: _kept_slots(slot_mapping))
    if keep is not None:
        key, value = key.index_select(0, keep), value.index_select(0, keep)
    # A flat [num_blocks * block_size, Hkv, D] view makes slot = block * block_size + offset a row index.
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value.to(v_cache.dtype))


def _kept_slots(slot_mapping: Tensor) -> tuple[Tensor, Tensor | None]:
    """The slots to write and, only when some are skipped, the rows that go to them."""
    slots = slot_mapping.long()
    if slots.numel() == 0 or int(slots.min()) >= 0:
        return slots, None
    keep = torch.nonzero(slots >= 0).flatten()
    return slots.index_select(0, keep), keep


def gather_kv(cache: Tensor, block_table: Tensor, seq_len: int) -> Tensor:
    """The first ``seq_len`` cached rows [seq_len, Hkv, D] of one sequence, in position order."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    # index_select, not cache[blocks]: the same copy, about twice as fast on CPU.
    blocks = block_table[:num_blocks].long()
    return cache.index_select(0, blocks).flatten(0, 1)[:seq_len]


@dataclass(slots=True)
class _Extend:
    """One sequence with several query rows (a prefill chunk or an extend after a prefix-cache hit)."""

    start: int
    end: int
    seq_len: int
    block_table: Tensor
    mask: Tensor | None  # [q_len, seq_len] True where a query may look; None: plain causal (q_len == seq_len)


@dataclass(slots=True)
class _AttentionPlan:
    """What a step's attention needs besides q and the caches, built once for all layers."""

    decode_rows: Tensor | None  # [S_d] rows of q that are single-token sequences; None when there are none
    decode_slots: Tensor  # [S_d * L] flat cache rows of their contexts, each padded to the longest, L
    decode_mask: Tensor  # [S_d, 1, 1, L] True where a key is part of the context
    extends: list[_Extend]


def _plan_extends(
    block_tables: Tensor, seq_lens: Tensor, query_start_loc: Tensor, longer_than: int = 1
) -> list[_Extend]:
    starts = query_start_loc.tolist()
    device = block_tables.device
    extends = []
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        if q_len > 1 and q_len * seq_len > longer_than:
            mask = None
            if q_len < seq_len:
                # Query j sits at position seq_len - q_len + j and sees keys 0..that position.
                q_pos = torch.arange(seq_len - q_len, seq_len, device=device)
                mask = torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]
            extends.append(_Extend(starts[i], starts[i + 1], seq_len, block_tables[i], mask))
    return extends


def _plan_attention(block_tables: Tensor, seq_lens: Tensor, query_start_loc: Tensor, block_size: int) -> _AttentionPlan:
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    device = block_tables.device
    decode = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
    extends = _plan_extends(block_tables, seq_lens, query_start_loc)
    if not decode:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return _AttentionPlan(None, empty, empty.bool(), extends)
    index = torch.tensor(decode, device=device)
    dec_lens = seq_lens.index_select(0, index).long()[:, None]
    pos = torch.arange(max(lens[i] for i in decode), device=device)[None, :]
    # The single query sits at the last position, so it sees exactly the first seq_len keys.
    mask = pos < dec_lens
    # Padding reads position 0 of the same sequence: written, hence finite, data that the mask then
    # drops (an unwritten slot may hold anything, and 0 * NaN would still poison the output).
    pos = torch.where(mask, pos, 0)
    blocks = block_tables.index_select(0, index).long().gather(1, pos // block_size)
    slots = (blocks * block_size + pos % block_size).flatten()
    rows = query_start_loc.index_select(0, index).long()
    return _AttentionPlan(rows, slots, mask[:, None, None, :], extends)


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    out: Tensor | None = None,
    *,
    longer_than: int | None = None,
) -> Tensor:
    """Causal attention of each sequence's last query tokens over its paged context (see package docs).

    Decode rows (one query token) are attended together in one batched pass, since a step often
    holds dozens of them; prefill/extend rows go one sequence at a time. With ``longer_than`` only
    the prefill/extend rows of sequences whose q_len * seq_len exceeds it are attended, the other
    rows of ``out`` left as they are (the fused CPU kernel attends them in place).
    """
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if longer_than is None:
        block_size = k_cache.shape[1]
        plan = _planned(
            "attention",
            (block_tables, seq_lens, query_start_loc, block_size),
            lambda: _plan_attention(block_tables, seq_lens, query_start_loc, block_size),
        )
        if plan.decode_rows is not None:
            _attend_decode_rows(q, k_cache, v_cache, plan, scale, out)
        extends = plan.extends
    else:
        extends = _planned(
            "extends",
            (block_tables, seq_lens, query_start_loc, longer_than),
            lambda: _plan_extends(block_tables, seq_lens, query_start_loc, longer_than),
        )
    for ext in extends:
        out[ext.start : ext.end] = _attend_sequence(q[ext.start : ext.end], k_cache, v_cache, ext, scale)
    return out


def _attend_sequence(q: Tensor, k_cache: Tensor, v_cache: Tensor, ext: _Extend, scale: float) -> Tensor:
    """One sequence's q_len query rows [q_len, H, D], the last q_len positions of its context."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    # [1, heads, len, D] views; fp32 so the softmax runs in fp32 whatever the cache dtype.
    k = gather_kv(k_cache, ext.block_table, ext.seq_len).float().transpose(0, 1)[None]
    v = gather_kv(v_cache, ext.block_table, ext.seq_len).float().transpose(0, 1)[None]
    attn = F.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None],
        k,
        v,
        attn_mask=ext.mask,
        is_causal=ext.mask is None,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return attn[0].transpose(0, 1).to(q.dtype)


def _attend_decode_rows(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: _AttentionPlan, scale: float, out: Tensor
) -> None:
    """All single-token sequences at once: their contexts gathered into one padded [S, Hkv, L, D]."""
    assert plan.decode_rows is not None
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    seqs = plan.decode_rows.shape[0]
    shape = (seqs, -1, num_kv_heads, head_dim)
    flat = (-1, num_kv_heads, head_dim)
    k = k_cache.view(flat).index_select(0, plan.decode_slots).view(shape).float().transpose(1, 2)
    v = v_cache.view(flat).index_select(0, plan.decode_slots).view(shape).float().transpose(1, 2)
    # Grouped view: the G query heads that share a KV head become G query rows of that head, so
    # no KV head is repeated (query head h reads KV head h // G, as in HF's repeat_kv).
    qg = q.index_select(0, plan.decode_rows).float().view(seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    attn = F.scaled_dot_product_attention(qg, k, v, attn_mask=plan.decode_mask, scale=scale)
    out.index_copy_(0, plan.decode_rows, attn.reshape(seqs, num_heads, head_dim).to(out.dtype))


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """LlamaRMSNorm, step for step (fp32 statistics, back to the input dtype, then the weight)."""
    h = x if residual is None else x + residual
    input_dtype = h.dtype
    hf = h.to(torch.float32)
    variance = hf.pow(2).mean(-1, keepdim=True)
    normed = weight * (hf * torch.rsqrt(variance + eps)).to(input_dtype)
    if residual is None:
        return normed
    return normed, h


def silu_and_mul(gate_up: Tensor) -> Tensor:
    """``silu(gate) * up`` for ``gate_up`` = [gate | up] along the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_embedding(positions: Tensor, q: Tensor, k: Tensor, cos_sin_cache: Tensor) -> tuple[Tensor, Tensor]:
    """NeoX / HF-Llama rotary embedding (rotate_half) of the first ``rotary_dim`` features of q and k."""
    rotary_dim = cos_sin_cache.shape[1]
    cos, sin = _planned(
        "rotary", (positions, cos_sin_cache, q.dtype), lambda: _cos_sin(positions, cos_sin_cache, q.dtype)
    )
    return _rotate(q, cos, sin, rotary_dim), _rotate(k, cos, sin, rotary_dim)


def _cos_sin(positions: Tensor, cos_sin_cache: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """[T, 1, rotary_dim] cos and sin at ``positions``, cast like HF: to the activation dtype, after the lookup."""
    half = cos_sin_cache.shape[1] // 2
    cos_sin = cos_sin_cache.index_select(0, positions)  # [T, rotary_dim]
    cos = torch.cat((cos_sin[:, :half], cos_sin[:, :half]), dim=-1)[:, None, :]
    sin = torch.cat((cos_sin[:, half:], cos_sin[:, half:]), dim=-1)[:, None, :]
    return cos.to(dtype), sin.to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int) -> Tensor:
    rot = x[..., :rotary_dim]
    half = rotary_dim // 2
    rotated_half = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    embedded = rot * cos + rotated_half * sin
    if rotary_dim == x.shape[-1]:
        return embedded
    return torch.cat((embedded, x[..., rotary_dim:]), dim=-1)
