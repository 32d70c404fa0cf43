"""The tensors one engine step hands to the model: a ragged, padding-free batch.

Every step concatenates the scheduled tokens of all sequences (prefill chunks and single decode
tokens alike) into one flat batch of T tokens over S sequences. Sequence ``i`` owns query tokens
``query_start_loc[i]:query_start_loc[i + 1]``; they are its *last* tokens, so their positions are
``seq_lens[i] - query_len_i ... seq_lens[i] - 1`` and each attends causally to every earlier
position of its own sequence, read from the paged KV cache through ``block_tables[i]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class ForwardBatch:
    """One step's model input. All tensors live on the model's device."""

    input_ids: torch.Tensor  # [T] int64: the scheduled tokens, sequences concatenated
    positions: torch.Tensor  # [T] int64: each token's position in its own sequence
    slot_mapping: torch.Tensor  # [T] int64: where each token's K/V goes, block * block_size + offset
    block_tables: torch.Tensor  # [S, max_blocks] int32: physical block ids per sequence (pad: 0)
    seq_lens: torch.Tensor  # [S] int32: context length of each sequence after this step
    query_start_loc: torch.Tensor  # [S + 1] int32: cumulative query lengths (cu_seqlens)
    logits_indices: torch.Tensor  # [N] int64: rows of the hidden states to turn into logits
    max_query_len: int
    max_seq_len: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])
