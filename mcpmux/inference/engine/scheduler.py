"""Iteration-level scheduling: which tokens of which requests the next step computes.

Each step has a budget of `max_num_batched_tokens`. Running requests go first, in priority order
then arrival order, each taking what it still needs (one token when decoding, a chunk of at most
`prefill_chunk_size` when prefilling). When a running request cannot get a KV block, the
lowest-priority, latest-arrived running request is preempted by recompute: its blocks are freed,
its progress reset, and it waits again (its generated tokens are kept and recomputed, so its output
is unchanged). Running requests are ranked by their own priority, without aging: aging would let a
preempted request, having waited, outrank and preempt the one that preempted it, and under a tight
pool such requests can take turns losing their progress forever. With a fixed rank the first
running request is never a victim, so it always finishes. Only in a step without preemption are
waiting requests admitted, in effective priority order, strictly (a head that does not fit blocks
those behind it, so a large request is never starved by small ones), up to `max_num_seqs` running.

One long prompt at a time while short ones wait: a prompt whose prefill takes more than one chunk
is *long*, and while a shorter prompt is waiting, a step carries at most one long prompt's chunk.
Another long prompt waits for a step without one, and the shorter prompts behind it are admitted
meanwhile (a long prompt passed over this way does not block the queue). A step's time grows with
its tokens, so a second long chunk makes every short request in the step, and every one arriving
during it, wait longer for its first token; with one, short requests among long ones get theirs a
step or two sooner, and the long ones still run in arrival order, each as soon as the one before
has finished its prefill. With no short prompt waiting, long prompts fill the step's budget as
before: fewer, fuller steps, each paying once for reading the weights.

In-batch prefix sharing: a waiting request whose next full blocks (after its cached prefix) are
being computed right now by a running request is a *follower*: it is passed over, without holding
back those behind it, until those blocks are cached, and is then admitted with the hit instead of
computing the same prefix again. Followers are not used to fill a step's leftover token budget: on
the CPU path a step costs time in proportion to its tokens, so budget left unused is free and
recomputing the prefix is not. The wait is bounded twice: the leader is running, so it computes a
chunk every step (and a leader that is preempted or ends releases its followers at once), and a
follower waits at most `MAX_PREFIX_WAIT_STEPS` steps before it is admitted anyway.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from mcpmux.inference.engine.block_manager import BlockManager, PrefixMatch
from mcpmux.inference.engine.config import EngineConfig
from mcpmux.inference.engine.sequence import Sequence, SequenceStatus
from mcpmux.inference.errors import QueueFullError, RequestTooLargeError

# A follower's wait for its leader's prefix, in steps: a leader prefilling 8 chunks (2k tokens at the
# default chunk size) is the most a follower ever waits behind.
MAX_PREFIX_WAIT_STEPS = 8


@dataclass(slots=True)
class ScheduledSeq:
    """`num_new_tokens` tokens of `seq`, starting at its `num_computed_tokens`, go in this step."""

    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the sequence, so its last row is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    deferred: list[Sequence] = field(default_factory=list)  # followers waiting for a leader's prefix
    held: list[Sequence] = field(default_factory=list)  # long prompts passed over for shorter ones
    num_batched_tokens: int = 0


class Scheduler:
    """Owns the waiting and running queues and the block manager."""

    def __init__(self, config: EngineConfig, num_blocks: int, eos_token_ids: Iterable[int], max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self.num_preemptions = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self._deferred_since: dict[str, int] = {}  # follower request id -> its waited_steps when it began

    def add(self, seq: Sequence) -> None:
        """Queue a new request, or raise if it can never run or the waiting queue is full."""
        if seq.request_id in self._by_id:
            raise ValueError(f"request id {seq.request_id!r} is already in use; pick a unique id")
        if seq.num_prompt_tokens >= self.max_model_len:
            raise RequestTooLargeError(
                f"request {seq.request_id!r}: the prompt has {seq.num_prompt_tokens} tokens but the model's "
                f"context is {self.max_model_len} (max_model_len); shorten the prompt"
            )
        seq.max_tokens = min(seq.params.max_tokens, self.max_model_len - seq.num_prompt_tokens)
        # The last sampled token is never fed back, so it needs no KV slot.
        need = self.block_manager.blocks_for(seq.num_prompt_tokens + seq.max_tokens - 1)
        if need > self.block_manager.num_blocks:
            raise RequestTooLargeError(
                f"request {seq.request_id!r} needs up to {need} KV blocks ({seq.num_prompt_tokens} prompt + "
                f"{seq.max_tokens} max_tokens tokens, {self.config.block_size} per block) but the whole KV "
                f"pool has {self.block_manager.num_blocks} blocks; lower max_tokens, shorten the prompt, "
                "or raise num_blocks / kv_cache_memory_mb"
            )
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFullError(
                f"request {seq.request_id!r} rejected: the waiting queue is full "
                f"(max_waiting={self.config.max_waiting}); retry later or raise max_waiting"
            )
        seq.arrival = next(self._arrivals)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self._by_id[seq.request_id] = seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def schedule(self) -> SchedulerOutput:
        """Pick this step's tokens: running requests first, then admissions."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        chunk = self.config.prefill_chunk_size
        self.running.sort(key=self._rank)
        i = 0
        long_chunk = False  # whether a long prompt's chunk is in this step (module doc)
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, chunk, budget)
            if not self._make_room(seq, n, out.preempted):
                break  # seq itself was the victim, and it was the last one
            self.block_manager.allocate(seq, n)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            long_chunk = long_chunk or self._is_long(seq, seq.num_cached_tokens)
            i += 1
        if not out.preempted:
            budget = self._admit(budget, long_chunk, out)
        for seq in self.waiting:
            seq.waited_steps += 1
        out.num_batched_tokens = self.config.max_num_batched_tokens - budget
        return out

    def postprocess(self, out: SchedulerOutput, sampled: list[int | None]) -> list[Sequence]:
        """Record the step's progress and sampled tokens; return the sequences that got a token."""
        advanced = []
        for item, token in zip(out.scheduled, sampled, strict=True):
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(seq)
            if token is None:
                continue  # a prefill chunk that stops short of the prompt's end samples nothing
            seq.token_ids.append(token)
            advanced.append(seq)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
        return advanced

    def finish(self, seq: Sequence, reason: str) -> None:
        """End `seq` (stop, length or abort) and free its blocks."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        self._deferred_since.pop(seq.request_id, None)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        del self._by_id[seq.request_id]

    def abort(self, request_id: str) -> Sequence | None:
        """Abort a queued or running request; None when it is unknown or already finished."""
        seq = self._by_id.get(request_id)
        if seq is not None:
            self.finish(seq, "abort")
        return seq

    def _order(self, seq: Sequence) -> tuple[int, int]:
        """Admission order: effective priority (aging included), then arrival."""
        return (-seq.effective_priority(self.config.aging_interval), seq.arrival)

    def _rank(self, seq: Sequence) -> tuple[int, int]:
        """Running order (the last is the preemption victim): priority, then arrival, no aging."""
        return (-seq.priority, seq.arrival)

    def _make_room(self, seq: Sequence, num_new_tokens: int, preempted: list[Sequence]) -> bool:
        while not self.block_manager.can_allocate(seq, num_new_tokens):
            victim = self.running.pop()  # running is sorted: the last is the least entitled
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self.num_preemptions += 1

    def _admit(self, budget: int, long_chunk: bool, out: SchedulerOutput) -> int:
        self.waiting.sort(key=self._order)
        one_long = any(not self._is_long(seq, 0) for seq in self.waiting)  # a short prompt waits
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[i]
            match = self.block_manager.match_prefix(seq.token_ids)
            if self._follows(seq, match):
                out.deferred.append(seq)
                i += 1
                continue
            cached = match.num_blocks * self.config.block_size
            if self._is_long(seq, cached):
                if long_chunk and one_long:
                    out.held.append(seq)  # one long prompt at a time: the shorter ones behind it go first
                    i += 1
                    continue
                long_chunk = True
            n = min(seq.num_tokens - cached, self.config.prefill_chunk_size, budget)
            if not self.block_manager.can_allocate(seq, n, match):
                break
            self.waiting.pop(i)
            self._deferred_since.pop(seq.request_id, None)
            self._start(seq, n, match)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return budget

    def _is_long(self, seq: Sequence, cached: int) -> bool:
        """Whether `seq` is still prefilling a prompt of more than one chunk past its `cached` tokens."""
        prefilling = seq.num_tokens - seq.num_computed_tokens > 1
        return prefilling and seq.num_tokens - max(cached, 0) > self.config.prefill_chunk_size

    def _follows(self, seq: Sequence, match: PrefixMatch) -> bool:
        """Whether `seq` should wait for a running request to cache its next blocks (see module doc)."""
        if not self.block_manager.pending_blocks(seq.token_ids, match):
            return False
        since = self._deferred_since.setdefault(seq.request_id, seq.waited_steps)
        return seq.waited_steps - since < MAX_PREFIX_WAIT_STEPS

    def _start(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch) -> None:
        self.block_manager.allocate(seq, num_new_tokens, match)
        if seq.num_cached_tokens < 0:  # count the prompt once, not again after a preemption
            seq.num_cached_tokens = seq.num_computed_tokens
            self.prefix_query_tokens += seq.num_prompt_tokens
            self.prefix_hit_tokens += seq.num_cached_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids or (not seq.params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if seq.num_output_tokens >= seq.max_tokens:
            return "length"
        return None
