"""In-batch prefix sharing: requests that arrive together with a common prefix compute it once.

A waiting request whose next full blocks a running request is computing waits for them to be cached
(see `mcpmux.inference.engine.scheduler`); these tests drive the real scheduler and the real engine."""

from __future__ import annotations

from pathlib import Path

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.engine.scheduler import MAX_PREFIX_WAIT_STEPS
from mcpmux.inference.models.loader import load_model
from tests.inference.engine.test_scheduler import assert_pool_clean, make_scheduler, make_seq, run_to_end, step
from tests.inference.engine_harness import engine_config

BLOCK = 8
PREFIX = [(7 * i) % 200 + 3 for i in range(3 * BLOCK)]  # 3 full blocks


def test_sixteen_requests_with_a_common_prefix_compute_it_once(tiny_llama: Path) -> None:
    loaded = load_model(str(tiny_llama), dtype="float32", device="cpu")
    config = engine_config(tiny_llama, block_size=BLOCK, num_blocks=128, max_num_batched_tokens=256)
    engine = LLMEngine(config, loaded)
    prompts = [[*PREFIX, 200 + i, 201 + i] for i in range(16)]
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
    stats = engine.stats()
    assert stats.prompt_tokens == 16 * len(prompts[0])
    assert stats.cached_prompt_tokens >= 15 * 3 * BLOCK, "followers recomputed the shared prefix"
    # The same requests one at a time on a fresh engine: sharing changes no token.
    for i, prompt in enumerate(prompts[:3]):
        alone = LLMEngine(config, loaded)
        alone.add_request("x", prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        tokens: list[int] = []
        while alone.has_unfinished():
            for out in alone.step():
                tokens += out.token_ids
        assert tokens == outputs[f"r{i}"]


def test_followers_wait_one_step_and_others_are_not_held_back() -> None:
    sched = make_scheduler(block_size=4, max_num_batched_tokens=64, prefill_chunk_size=64)
    shared = list(range(10, 22))  # 3 full blocks of 4
    leader = make_seq("leader", [*shared, 1], max_tokens=2)
    follower = make_seq("follower", [*shared, 2], max_tokens=2)
    other = make_seq("other", [90, 91, 92], max_tokens=2)
    for s in (leader, follower, other):
        sched.add(s)
    out = step(sched)
    assert [item.seq for item in out.scheduled] == [leader, other], "the follower blocked the queue"
    assert out.deferred == [follower]
    out = step(sched)
    assert follower in [item.seq for item in out.scheduled]
    assert follower.num_cached_tokens == 12
    run_to_end(sched)
    assert_pool_clean(sched)


def test_a_preempted_or_finished_leader_releases_its_followers() -> None:
    sched = make_scheduler(block_size=4, max_num_batched_tokens=64, prefill_chunk_size=64)
    shared = list(range(10, 22))
    leader = make_seq("leader", [*shared, 1], max_tokens=5)
    follower = make_seq("follower", [*shared, 2], max_tokens=2)
    sched.add(leader)
    sched.add(follower)
    sched.schedule()  # the leader is admitted and promises its blocks; it is aborted before computing them
    sched.abort("leader")
    out = step(sched)
    assert follower in [item.seq for item in out.scheduled]
    assert follower.num_cached_tokens == 0
    run_to_end(sched)
    assert_pool_clean(sched)
    assert not sched.block_manager.pending_blocks([*shared, 3], sched.block_manager.match_prefix([*shared, 3]))


def test_a_follower_waits_at_most_the_bound_behind_a_slow_leader() -> None:
    # A 1-token chunk: the leader needs 40 steps for its prompt, far beyond the bound.
    sched = make_scheduler(block_size=4, max_num_batched_tokens=8, prefill_chunk_size=1, num_blocks=64)
    prompt = list(range(10, 50))
    leader = make_seq("leader", [*prompt, 1], max_tokens=1)
    follower = make_seq("follower", [*prompt, 2], max_tokens=1)
    sched.add(leader)
    sched.add(follower)
    steps = 0
    while follower.num_computed_tokens == 0:
        step(sched)
        steps += 1
    assert steps == MAX_PREFIX_WAIT_STEPS + 1
    assert leader.num_computed_tokens < len(prompt)
    run_to_end(sched)
    assert_pool_clean(sched)
