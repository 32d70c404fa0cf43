"""Fixed launch configurations for the Triton kernels, chosen per shape from a small table.

No ``@triton.autotune``: it fails under the interpreter and adds warm-up stalls to a serving engine.

Paged attention (one program = BLOCK_M rows of (query token, head of the GQA group) x one KV head):

==============================  =======  =======  =========  ==========
case                            BLOCK_M  BLOCK_N  num_warps  num_stages
==============================  =======  =======  =========  ==========
decode-only (max_query_len 1)   16       64       4          2
prefill/mixed, head_dim <= 128  64       64       4          2
prefill/mixed, head_dim > 128   32       32       4          1
==============================  =======  =======  =========  ==========

BLOCK_M grows to the next power of two of the GQA group when the group is wider (MQA with many
heads), so a program always holds at least one query token. BLOCK_N is the KV tile, independent of
the cache's block size (each key finds its block through the block table).

Split-KV (flash-decoding) is chosen only for decode-only batches on CUDA, when the batch alone cannot
fill the GPU: ``num_seqs * num_kv_heads`` below the number of SMs and ``max_seq_len`` at least
``SPLIT_MIN_KEYS``. Then each (sequence, KV head) is cut into ``num_splits`` ranges of at least
``SPLIT_MIN_KEYS`` keys, enough to launch about two programs per SM, at most ``MAX_SPLITS``; a second
kernel merges the partial softmaxes. Prefill rows already supply enough programs, and on the CPU
interpreter splitting only costs time, so neither splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from mcpmux.inference.kernels.triton_support import next_pow2

SPLIT_MIN_KEYS = 512
MAX_SPLITS = 16


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    """Tile sizes and launch parameters for one paged-attention call."""

    block_m: int  # rows per program: block_q query tokens x the GQA group (padded to a power of two)
    block_q: int  # query tokens per program
    block_n: int  # keys per inner-loop tile
    num_warps: int
    num_stages: int
    num_splits: int  # > 1: split-KV decode, partial results merged by a second kernel


def attention_config(
    head_dim: int,
    group: int,
    num_seqs: int,
    num_kv_heads: int,
    max_query_len: int,
    max_seq_len: int,
    device: torch.device,
    num_splits: int | None = None,
) -> AttentionConfig:
    """The table above, applied; ``num_splits`` overrides the split choice (tests, benchmarks)."""
    decode_only = max_query_len <= 1
    if decode_only:
        block_m, block_n, stages = 16, 64, 2
    elif head_dim <= 128:
        block_m, block_n, stages = 64, 64, 2
    else:
        block_m, block_n, stages = 32, 32, 1
    block_m = max(block_m, next_pow2(group))
    if num_splits is None:
        num_splits = _auto_splits(num_seqs * num_kv_heads, max_seq_len, device) if decode_only else 1
    return AttentionConfig(
        block_m=block_m,
        block_q=block_m // group,
        block_n=block_n,
        num_warps=4,
        num_stages=stages,
        num_splits=max(1, num_splits),
    )


def split_size(max_seq_len: int, num_splits: int, block_n: int) -> int:
    """Keys per split: an equal share of the longest context, rounded up to whole KV tiles."""
    share = -(-max_seq_len // num_splits)
    return -(-share // block_n) * block_n


def _auto_splits(programs: int, max_seq_len: int, device: torch.device) -> int:
    if device.type != "cuda" or max_seq_len < SPLIT_MIN_KEYS:
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    if programs >= sms:
        return 1
    wanted = -(-2 * sms // programs)
    by_length = max_seq_len // SPLIT_MIN_KEYS
    return max(1, min(wanted, by_length, MAX_SPLITS))


@cache
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)
