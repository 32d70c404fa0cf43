"""Owns the paged KV cache and turns a scheduled step into one ragged forward pass plus sampling."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from mcpmux.inference.engine.cpu_memory import keep_freed_memory
from mcpmux.inference.engine.cpu_threads import ThreadGovernor
from mcpmux.inference.engine.cuda_graphs import DecodeGraphs
from mcpmux.inference.engine.sampler import SampleRequest, TokenLogprob, sample
from mcpmux.inference.engine.scheduler import ScheduledSeq
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models.forward_batch import ForwardBatch
from mcpmux.inference.models.linear import FUSED_ROWS, float32_on_onednn, is_packed
from mcpmux.inference.models.loader import LoadedModel

log = logging.getLogger(__name__)


def kv_block_bytes(loaded: LoadedModel, block_size: int) -> int:
    """Bytes one KV block takes across all layers (K and V)."""
    elem = torch.empty((), dtype=loaded.dtype).element_size()
    return 2 * loaded.num_layers * block_size * loaded.num_kv_heads * loaded.head_dim * elem


@dataclass(slots=True)
class StepResult:
    """Per scheduled sequence, in order: its sampled token (None mid-prefill) and logprobs."""

    token_ids: list[int | None]
    logprobs: list[TokenLogprob | None]


class ModelRunner:
    """Allocates `num_blocks` KV blocks per layer and runs steps of the model."""

    def __init__(
        self,
        loaded: LoadedModel,
        block_size: int,
        num_blocks: int,
        *,
        cuda_graphs: bool = False,
        max_num_seqs: int = 64,
        cpu_threads: int = 0,
    ) -> None:
        """`cuda_graphs`: replay decode steps from captured CUDA graphs where the model allows it.
        `cpu_threads`: on CPU, the intra-op threads of a step (0: from the free cores, `cpu_threads`)."""
        self.loaded = loaded
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (num_blocks, block_size, loaded.num_kv_heads, loaded.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=loaded.dtype, device=loaded.device),
                torch.zeros(shape, dtype=loaded.dtype, device=loaded.device),
            )
            for _ in range(loaded.num_layers)
        ]
        log.info(
            "KV cache: %d blocks x %d tokens, %.1f MiB on %s",
            num_blocks,
            block_size,
            num_blocks * kv_block_bytes(loaded, block_size) / 2**20,
            loaded.device,
        )
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs and DecodeGraphs.usable(loaded):
            try:
                self.graphs = DecodeGraphs(loaded, self.kv_caches, block_size, max_num_seqs)
            except RuntimeError as err:  # out of memory too: serving goes on, eagerly
                log.warning("CUDA graphs could not be captured (%s); decode steps run eagerly", err)
        # A model the fused CPU kernels run waits for them before its first step where they keep greedy
        # answers batch-invariant: the torch kernels would answer otherwise until the build is done.
        self._await_kernels = loaded.device.type == "cpu" and cpu_fused.enabled() and cpu_fused.batch_invariant()
        # float32 products on the kernels' packed layout (AVX-512), at every row count like bfloat16's.
        model = loaded.model
        self._packed_float32 = (
            loaded.dtype == torch.float32
            and isinstance(model, torch.nn.Module)
            and any(is_packed(p) for p in model.parameters())
        )
        self.governor = ThreadGovernor(cpu_threads) if loaded.device.type == "cpu" else None
        if self.governor is not None:
            keep_freed_memory()  # a step's few-MB tensors reused, not page-faulted in afresh
            cpu_fused.set_pool_threads(self.governor.most)  # no barrier in the pool: a busy host costs it nothing

    def _kernels_ready(self) -> None:
        self._await_kernels = False
        if cpu_fused.ops() is not None:
            return
        log.info(
            "waiting for the fused CPU kernels' build before the first step (once per install, a minute or "
            "two), so that greedy answers do not change when it completes; %s=0 serves at once",
            cpu_fused.INVARIANT_ENV_VAR,
        )
        if cpu_fused.wait() is None:
            log.warning(
                "the fused CPU kernels are not available: the torch kernels serve, and greedy answers may "
                "differ with the batch a request shares"
            )

    def prepare(self, scheduled: list[ScheduledSeq]) -> ForwardBatch:
        """Concatenate every scheduled sequence's new tokens into one padding-free batch."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        starts = [0]
        logits_rows: list[int] = []
        for item in scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += [seq.block_table[p // bs] * bs + p % bs for p in range(start, end)]
            seq_lens.append(end)
            starts.append(starts[-1] + item.num_new_tokens)
            if item.samples:
                logits_rows.append(starts[-1] - 1)
        width = max(len(item.seq.block_table) for item in scheduled)
        tables = [item.seq.block_table + [0] * (width - len(item.seq.block_table)) for item in scheduled]
        dev = self.loaded.device
        return ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            logits_indices=torch.tensor(logits_rows, dtype=torch.int64, device=dev),
            max_query_len=max(item.num_new_tokens for item in scheduled),
            max_seq_len=max(seq_lens),
        )

    def _pool_step(self, scheduled: list[ScheduledSeq]) -> bool:
        """Whether the fused kernels' pool runs nearly all of this step (`cpu_threads` then gives torch's own team
        one thread): every bfloat16 step where the products run on the packed layout and attention in the kernels at
        any length (batch invariance), and every float32 step on the packed layout (its attention is the kernels' at
        any length too, `kernels.direct_pairs`); else decode rows few enough for the kernels' products (not where
        float32 weights went to oneDNN, whose products run on torch's team)."""
        if self.loaded.dtype not in (torch.float32, torch.bfloat16) or cpu_fused.ops() is None:
            return False
        if self.loaded.dtype == torch.bfloat16 and cpu_fused.packed_bf16() and cpu_fused.batch_invariant():
            return True
        if self.loaded.dtype == torch.float32 and float32_on_onednn():
            return False  # oneDNN multiplies on torch's team
        if self._packed_float32:
            return True
        return len(scheduled) <= FUSED_ROWS and all(item.num_new_tokens == 1 for item in scheduled)

    def run(self, scheduled: list[ScheduledSeq], requests: list[SampleRequest]) -> StepResult:
        """Run one step. `requests` has one entry per scheduled sequence that samples, in order."""
        if self._await_kernels:
            self._kernels_ready()
        if self.governor is not None:
            self.governor.check(pool_step=self._pool_step(scheduled))
        batch = self.prepare(scheduled)
        with torch.inference_mode():
            logits = self.graphs.forward(batch) if self.graphs is not None else None
            if logits is None:
                logits = self.loaded.model(batch, self.kv_caches)
            sampled = sample(logits, requests)
        tokens = iter(sampled.token_ids)
        logprobs = iter(sampled.logprobs)
        result = StepResult([], [])
        for item in scheduled:
            result.token_ids.append(next(tokens) if item.samples else None)
            result.logprobs.append(next(logprobs) if item.samples else None)
        return result
