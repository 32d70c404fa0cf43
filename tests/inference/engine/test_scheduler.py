"""The scheduler and block manager driven with token ids (no model): chunking, prefix caching,
preemption, priorities, limits, and hypothesis invariants over random workloads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.scheduler import Scheduler, SchedulerOutput
from mcpmux.inference.engine.sequence import Sequence, SequenceStatus
from mcpmux.inference.errors import QueueFullError, RequestTooLargeError

EOS = 0


def make_scheduler(num_blocks: int = 64, **overrides: object) -> Scheduler:
    settings_: dict[str, object] = {"model": "token-ids-only", "block_size": 4, "max_num_batched_tokens": 32}
    settings_.update(overrides)
    return Scheduler(EngineConfig(**settings_), num_blocks, [EOS], max_model_len=512)  # type: ignore[arg-type]


def make_seq(rid: str, prompt: list[int], max_tokens: int = 8, priority: int = 0, **params: object) -> Sequence:
    sp = SamplingParams(max_tokens=max_tokens, **params)  # type: ignore[arg-type]
    return Sequence(rid, list(prompt), len(prompt), sp, priority=priority)


def next_token(seq: Sequence) -> int:
    """A deterministic stand-in for the model: depends on the whole history, rarely EOS."""
    return (sum(seq.token_ids) * 31 + 7 * len(seq.token_ids)) % 97 + 1


def step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    sampled = [next_token(item.seq) if item.samples else None for item in out.scheduled]
    sched.postprocess(out, sampled)
    return out


def run_to_end(sched: Scheduler, max_steps: int = 10_000) -> int:
    steps = 0
    while sched.has_unfinished():
        step(sched)
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    return steps


def assert_pool_clean(sched: Scheduler) -> None:
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_long_prompt_is_chunked_and_decodes_keep_going() -> None:
    sched = make_scheduler(max_num_batched_tokens=8, prefill_chunk_size=6)
    short = make_seq("short", [5, 6], max_tokens=30)
    sched.add(short)
    step(sched)  # prefill of the short prompt, first token
    long = make_seq("long", list(range(1, 41)), max_tokens=2)
    sched.add(long)
    chunks = []
    while long.num_computed_tokens < long.num_prompt_tokens:
        before = short.num_output_tokens
        out = step(sched)
        chunks += [item.num_new_tokens for item in out.scheduled if item.seq is long]
        assert short.num_output_tokens == before + 1, "the long prefill stalled a running decode"
        assert out.num_batched_tokens <= 8
    assert sum(chunks) == 40
    assert max(chunks) <= 6
    run_to_end(sched)
    assert_pool_clean(sched)


def scheduled(out: SchedulerOutput) -> dict[str, int]:
    return {item.seq.request_id: item.num_new_tokens for item in out.scheduled}


def test_short_prompts_pass_a_second_long_prompt_while_one_is_prefilling() -> None:
    sched = make_scheduler(max_num_batched_tokens=32, prefill_chunk_size=8)
    sched.add(make_seq("long-a", list(range(1, 21))))  # 20 tokens: three chunks
    assert scheduled(step(sched)) == {"long-a": 8}
    sched.add(make_seq("long-b", list(range(30, 50))))
    sched.add(make_seq("short-1", [5, 6, 7]))
    sched.add(make_seq("short-2", [8, 9, 10]))
    out = step(sched)
    # One long chunk a step while short prompts wait: long-b waits, the short ones behind it go in
    # and get their first tokens, though the budget had room for long-b's first chunk.
    assert scheduled(out) == {"long-a": 8, "short-1": 3, "short-2": 3}
    assert [sched.get(rid).num_output_tokens for rid in ("short-1", "short-2")] == [1, 1]  # type: ignore[union-attr]
    # No short prompt waits any more: long-b shares the step with long-a's last chunk.
    assert scheduled(step(sched)) == {"long-a": 4, "long-b": 8, "short-1": 1, "short-2": 1}
    run_to_end(sched)
    assert_pool_clean(sched)


def test_long_prompts_fill_the_step_when_no_short_prompt_waits() -> None:
    sched = make_scheduler(max_num_batched_tokens=32, prefill_chunk_size=8)
    for rid, first in (("long-a", 1), ("long-b", 30), ("long-c", 60)):
        sched.add(make_seq(rid, list(range(first, first + 20))))
    assert scheduled(step(sched)) == {"long-a": 8, "long-b": 8, "long-c": 8}
    run_to_end(sched)
    assert_pool_clean(sched)


def test_a_waiting_long_prompt_goes_first_when_no_long_chunk_is_running() -> None:
    sched = make_scheduler(max_num_batched_tokens=32, prefill_chunk_size=8)
    sched.add(make_seq("long", list(range(1, 21))))
    sched.add(make_seq("short", [5, 6, 7]))
    assert scheduled(step(sched)) == {"long": 8, "short": 3}


def test_prefix_cache_hits_full_blocks_and_leaves_one_token_to_compute() -> None:
    sched = make_scheduler()
    shared = list(range(10, 22))  # 3 full blocks of 4
    first = make_seq("a", [*shared, 1, 2], max_tokens=1)
    sched.add(first)
    run_to_end(sched)
    second = make_seq("b", [*shared, 3], max_tokens=1)
    exact = make_seq("c", shared, max_tokens=1)
    sched.add(second)
    sched.add(exact)
    run_to_end(sched)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 12
    assert exact.num_cached_tokens == 8, "a full-prompt hit must leave the last token to compute"
    assert sched.prefix_hit_tokens == 20
    assert_pool_clean(sched)


def test_lru_evicts_oldest_cached_blocks_first() -> None:
    sched = make_scheduler(num_blocks=6)
    for rid, first in (("old", 1), ("new", 20)):  # each leaves 2 full blocks cached, old's first
        sched.add(make_seq(rid, [*range(first, first + 8), 50], max_tokens=1))
        run_to_end(sched)
    # 4 fresh blocks: the 2 uncached tails go first, then old's cached blocks (freed longest ago).
    sched.add(make_seq("mid", list(range(60, 73)), max_tokens=1))
    run_to_end(sched)
    new_again = make_seq("new-again", [*range(20, 28), 51], max_tokens=1)
    sched.add(new_again)
    run_to_end(sched)
    old_again = make_seq("old-again", [*range(1, 9), 51], max_tokens=1)
    sched.add(old_again)
    run_to_end(sched)
    assert new_again.num_cached_tokens == 8
    assert old_again.num_cached_tokens == 0
    assert_pool_clean(sched)


def test_preemption_under_a_small_pool_finishes_everything_with_same_tokens() -> None:
    prompts = [[i + 1] * (5 + 3 * i) for i in range(6)]

    def outputs(num_blocks: int) -> tuple[dict[str, list[int]], int]:
        sched = make_scheduler(num_blocks=num_blocks, prefill_chunk_size=8)
        seqs = [make_seq(f"r{i}", p, max_tokens=12) for i, p in enumerate(prompts)]
        for s in seqs:
            sched.add(s)
        run_to_end(sched)
        assert_pool_clean(sched)
        return {s.request_id: s.output_token_ids for s in seqs}, sched.num_preemptions

    roomy, roomy_preemptions = outputs(200)
    tight, tight_preemptions = outputs(9)
    assert roomy_preemptions == 0
    assert tight_preemptions > 0
    assert tight == roomy


def test_victim_is_lowest_priority_then_latest() -> None:
    sched = make_scheduler(num_blocks=6, prefill_chunk_size=64, max_num_batched_tokens=64)
    high = make_seq("high", [1] * 7, max_tokens=10, priority=5)
    low_early = make_seq("low-early", [2] * 7, max_tokens=10, priority=0)
    low_late = make_seq("low-late", [3] * 7, max_tokens=10, priority=0)
    for s in (high, low_early, low_late):
        sched.add(s)
    step(sched)  # all three admitted: 2 blocks each, the pool is full
    assert len(sched.running) == 3
    step(sched)  # 8 tokens each: still two blocks
    step(sched)  # each needs a third block now: one must go
    assert low_late.num_preemptions == 1
    assert high.num_preemptions == 0
    assert low_early.num_preemptions == 0
    run_to_end(sched)
    assert_pool_clean(sched)


def test_request_that_can_never_fit_fails_with_the_numbers() -> None:
    sched = make_scheduler(num_blocks=4)
    with pytest.raises(RequestTooLargeError, match=r"needs up to 5 KV blocks.*whole KV pool has 4 blocks"):
        sched.add(make_seq("huge", [1] * 10, max_tokens=10))
    with pytest.raises(RequestTooLargeError, match=r"context is 512 \(max_model_len\)"):
        sched.add(make_seq("long", [1] * 600, max_tokens=1))
    assert not sched.has_unfinished()


def test_waiting_queue_full_names_the_limit() -> None:
    sched = make_scheduler(max_waiting=2)
    sched.add(make_seq("a", [1, 2]))
    sched.add(make_seq("b", [1, 2]))
    with pytest.raises(QueueFullError, match=r"max_waiting=2"):
        sched.add(make_seq("c", [1, 2]))
    step(sched)  # both admitted: the queue has room again
    sched.add(make_seq("c", [1, 2]))


def test_abort_frees_blocks_mid_generation() -> None:
    sched = make_scheduler()
    seq = make_seq("a", list(range(1, 20)), max_tokens=50)
    sched.add(seq)
    for _ in range(5):
        step(sched)
    assert sched.block_manager.num_free_blocks < sched.block_manager.num_blocks
    assert sched.abort("a") is seq
    assert seq.finish_reason == "abort"
    assert sched.abort("a") is None
    assert_pool_clean(sched)


def test_aging_lets_a_low_priority_request_overtake_fresh_high_ones() -> None:
    interval = 4
    sched = make_scheduler(max_num_seqs=1, aging_interval=interval)
    low = make_seq("low", [1, 2], max_tokens=1, priority=0)
    sched.add(low)
    sched.add(make_seq("blocker", [3, 4], max_tokens=1, priority=10))
    admitted_at = None
    for n in range(200):
        sched.add(make_seq(f"hi{n}", [5, 6], max_tokens=1, priority=2))  # a fresh priority-2 each step
        step(sched)
        if low.status is not SequenceStatus.WAITING:
            admitted_at = n
            break
    # Priority 2 above, so after 3 * interval steps of waiting low outranks every fresh arrival.
    assert admitted_at is not None
    assert admitted_at <= 3 * interval + 1


@dataclass
class Workload:
    num_blocks: int
    max_num_seqs: int
    chunk: int
    budget: int
    requests: list[tuple[int, int, int, int, int]]  # arrival step, prompt len, max_tokens, priority, seed
    aborts: list[tuple[int, int]] = field(default_factory=list)  # (step, request index)


workloads = st.builds(
    Workload,
    num_blocks=st.integers(8, 40),
    max_num_seqs=st.integers(1, 8),
    chunk=st.integers(1, 16),
    budget=st.integers(8, 40),
    requests=st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 20), st.integers(1, 10), st.integers(0, 3), st.integers(0, 5)),
        min_size=1,
        max_size=16,
    ),
    aborts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 15)), max_size=4),
)


@settings(max_examples=60, deadline=None)
@given(workloads)
def test_invariants_over_random_workloads(w: Workload) -> None:
    sched = make_scheduler(
        num_blocks=w.num_blocks,
        max_num_seqs=w.max_num_seqs,
        prefill_chunk_size=w.chunk,
        max_num_batched_tokens=w.budget,
        aging_interval=3,
    )
    seqs: list[Sequence] = []
    accepted: list[Sequence] = []
    pending = sorted(enumerate(w.requests), key=lambda r: r[1][0])
    step_no = 0
    while pending or sched.has_unfinished():
        while pending and pending[0][1][0] <= step_no:
            i, (_, plen, max_tokens, prio, seed) = pending.pop(0)
            seq = make_seq(f"r{i}", [(seed + j) % 50 + 1 for j in range(plen)], max_tokens, prio)
            seqs.append(seq)
            try:
                sched.add(seq)
                accepted.append(seq)
            except RequestTooLargeError:
                assert sched.block_manager.blocks_for(plen + max_tokens - 1) > w.num_blocks
        for at, idx in w.aborts:
            if at == step_no and idx < len(seqs):
                sched.abort(seqs[idx].request_id)
        order = {id(s): sched._order(s) for s in sched.waiting}
        waiting_before = list(sched.waiting)
        out = step(sched)
        admitted = [s for s in waiting_before if s.status is not SequenceStatus.WAITING]
        still = [s for s in waiting_before if s.status is SequenceStatus.WAITING]
        # Admission follows effective priority (aging included), then arrival: nobody is skipped but
        # a follower, which waits only while a running request computes its next prefix block, and a
        # long prompt held for shorter ones while another long prompt's chunk is in the step.
        passed = {id(s) for s in out.deferred + out.held}
        for a in admitted:
            assert all(order[id(a)] < order[id(s)] for s in still if id(s) not in passed)
        for h in out.held:
            assert h.status is SequenceStatus.WAITING
            assert h.num_tokens > w.chunk
            assert any(item.seq.num_tokens > w.chunk for item in out.scheduled), "held for no long prompt"
            assert any(s.num_tokens <= h.num_tokens for s in waiting_before if s is not h), "held for nobody"
        bs = sched.block_manager.block_size
        for f in out.deferred:
            assert f.status is SequenceStatus.WAITING
            assert any(item.seq.token_ids[:bs] == f.token_ids[:bs] for item in out.scheduled), "waits for nobody"
        if out.preempted:
            assert not admitted, "admitted a request in a step that had to preempt"
        # Reference counts are exactly the number of live block tables holding each block.
        holders = Counter(b for s in sched.running for b in s.block_table)
        assert all(b.ref_count == holders[b.block_id] for b in sched.block_manager.blocks)
        assert all(not s.block_table for s in sched.waiting)
        assert len(sched.running) <= w.max_num_seqs
        step_no += 1
        assert step_no < 5000, "no progress"
    # Every accepted request ended exactly once, and the pool is clean.
    for s in accepted:
        assert s.is_finished
        assert s.finish_reason in ("stop", "length", "abort")
        if s.finish_reason == "length":
            assert s.num_output_tokens == s.max_tokens
    assert sched.get("r0") is None
    assert_pool_clean(sched)
