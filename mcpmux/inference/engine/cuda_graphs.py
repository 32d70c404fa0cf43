"""Decode steps on CUDA replayed from captured CUDA graphs, so a step costs one launch, not hundreds.

A small model's decode step launches ~15 kernels per layer; on a GPU their host side (Python and
launch calls) takes several times the kernels' own time (`benchmarks/engine_profile.py` measured
15.2 ms a step with the GPU busy 2.2 ms on an H200). Like vLLM and SGLang, the engine captures the
decode forward once per batch-size bucket (1, 2, 4, 8, 16, 32, 64, ...) and replays it.

A captured graph reads fixed input buffers, so a step is padded up to its bucket: padded rows have
slot -1 (their K/V is never written), a one-token context in block 0 (finite data whose output is
dropped) and their logits are not returned. Attention is captured for contexts up to
`GRAPH_MAX_CONTEXT` tokens (the kernel's grid and split-KV ranges are sized from it); a step with a
longer context, or with any prefill row, runs eagerly as before.

Every bucket is captured when the engine starts, after one eager pass on all-padding inputs (which
compiles that bucket's Triton kernels and writes nothing to the KV cache), as vLLM does: capturing
lazily put a ~1 s stall (compile and capture) into the first step of each new batch size, which on
an offline run (64 requests, then fewer and fewer) cost more than the graphs saved. A capture that
fails leaves the engine on eager steps, with a warning saying why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from mcpmux.inference import kernels
from mcpmux.inference.models.forward_batch import ForwardBatch
from mcpmux.inference.models.loader import LoadedModel

log = logging.getLogger(__name__)

GRAPH_MAX_CONTEXT = 4096


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    batch: ForwardBatch  # the static input buffers the graph reads
    logits: torch.Tensor  # the static output the graph writes


class DecodeGraphs:
    """Captured decode forwards per bucket; `forward()` runs a step through one when it can."""

    def __init__(self, loaded: LoadedModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                 max_num_seqs: int) -> None:  # fmt: skip
        self.loaded = loaded
        self.kv_caches = kv_caches
        self.max_context = min(GRAPH_MAX_CONTEXT, loaded.max_position)
        self.max_blocks = -(-self.max_context // block_size)
        self.buckets = [1]  # powers of two, up to the first that holds max_num_seqs
        while self.buckets[-1] < max_num_seqs:
            self.buckets.append(2 * self.buckets[-1])
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs = {size: self._capture(size) for size in reversed(self.buckets)}  # largest first: one pool
        self.replays = 0

    @staticmethod
    def usable(loaded: LoadedModel) -> bool:
        """Whether this model's steps can be captured: on CUDA, with the Triton kernels."""
        return loaded.device.type == "cuda" and kernels.backend(torch.empty(0, device=loaded.device)) == "triton"

    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        """The step's logits from a replayed graph, or None when it must run eagerly."""
        seqs = batch.num_seqs
        if (
            batch.max_query_len != 1
            or batch.num_tokens != seqs
            or batch.logits_indices.shape[0] != seqs
            or batch.max_seq_len > self.max_context
            or batch.block_tables.shape[1] > self.max_blocks
            or seqs > self.buckets[-1]
        ):
            return None
        graph = self.graphs[next(b for b in self.buckets if b >= seqs)]
        self._fill(graph.batch, batch)
        graph.graph.replay()
        self.replays += 1
        return graph.logits[:seqs].clone()

    def _static_batch(self, size: int) -> ForwardBatch:
        dev = self.loaded.device
        rows = torch.arange(size, device=dev)
        return ForwardBatch(
            input_ids=torch.zeros(size, dtype=torch.int64, device=dev),
            positions=torch.zeros(size, dtype=torch.int64, device=dev),
            slot_mapping=torch.full((size,), -1, dtype=torch.int64, device=dev),
            block_tables=torch.zeros((size, self.max_blocks), dtype=torch.int32, device=dev),
            seq_lens=torch.ones(size, dtype=torch.int32, device=dev),
            query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=dev),
            logits_indices=rows,
            max_query_len=1,
            max_seq_len=self.max_context,
        )

    def _fill(self, static: ForwardBatch, batch: ForwardBatch) -> None:
        """Copy a step into the static buffers; the rows past it become inert padding."""
        seqs, width = batch.num_seqs, batch.block_tables.shape[1]
        static.input_ids[:seqs].copy_(batch.input_ids)
        static.positions[:seqs].copy_(batch.positions)
        static.slot_mapping[:seqs].copy_(batch.slot_mapping)
        static.slot_mapping[seqs:].fill_(-1)
        static.block_tables.zero_()
        static.block_tables[:seqs, :width].copy_(batch.block_tables)
        static.seq_lens[:seqs].copy_(batch.seq_lens)
        static.seq_lens[seqs:].fill_(1)

    def _capture(self, size: int) -> _Graph:
        static = self._static_batch(size)  # all padding: slots -1, so nothing is written to the cache
        model = self.loaded.model
        stream = torch.cuda.Stream(device=self.loaded.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            model(static, self.kv_caches)  # compiles this bucket's kernels before the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (the event loop's) may go on using CUDA while this one captures.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"), torch.inference_mode():
            logits = model(static, self.kv_caches)
        log.info("captured the decode step for batches of up to %d sequences", size)
        return _Graph(graph, static, logits)
